package dashboard

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/reactor"
)

type statsView struct {
	ByStatus  map[string]int64            `json:"by_status"`
	ByReactor map[string]map[string]int64 `json:"by_reactor"`
	Queues    []queueView                 `json:"queues"`
	// ControlQueue is where actions on runs that recorded no queue go.
	ControlQueue string `json:"control_queue"`
	// Warnings are what an operator must act on: a configured queue no
	// worker serves. Never null.
	Warnings []string `json:"warnings"`
}

type queueView struct {
	Queue string `json:"queue"`
	// Served is true when a live worker (an active asynq server) polls
	// the queue.
	Served           bool  `json:"served"`
	Pending          int   `json:"pending"`
	Active           int   `json:"active"`
	Scheduled        int   `json:"scheduled"`
	Retry            int   `json:"retry"`
	Archived         int   `json:"archived"`
	OldestPendingAge int64 `json:"oldest_pending_age_ms"`
}

// stats serves GET /api/stats: ZCARDs of the status and reactor x status
// indexes (the reactor names, then one pipelined round trip), and asynq's
// queue info for the configured queues, each marked served or not by
// asynq's server registry (cached, servedTTL).
func (h *Handler) stats(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	names, err := h.rdb.SMembers(ctx, h.keys.Reactors()).Result()
	if err != nil {
		h.serverError(w, r, fmt.Errorf("read the reactor names: %w", err))
		return
	}
	slices.Sort(names)
	statuses := reactor.Statuses()
	byStatus := make([]*redis.IntCmd, len(statuses))
	byReactor := make([][]*redis.IntCmd, len(names))
	if _, err := h.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, s := range statuses {
			byStatus[i] = p.ZCard(ctx, h.keys.Status(string(s)))
		}
		for j, n := range names {
			byReactor[j] = make([]*redis.IntCmd, len(statuses))
			for i, s := range statuses {
				byReactor[j][i] = p.ZCard(ctx, h.keys.ReactorStatus(n, string(s)))
			}
		}
		return nil
	}); err != nil {
		h.serverError(w, r, fmt.Errorf("count the runs: %w", err))
		return
	}
	out := statsView{ByStatus: map[string]int64{}, ByReactor: map[string]map[string]int64{}, Queues: []queueView{}}
	for i, s := range statuses {
		out.ByStatus[string(s)] = byStatus[i].Val()
	}
	for j, n := range names {
		m := map[string]int64{}
		for i, s := range statuses {
			if c := byReactor[j][i].Val(); c > 0 {
				m[string(s)] = c
			}
		}
		if len(m) > 0 {
			out.ByReactor[n] = m
		}
	}
	known, err := h.inspector.Queues()
	if err != nil {
		h.serverError(w, r, fmt.Errorf("list the asynq queues: %w", err))
		return
	}
	served, err := h.served.queues(ctx)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	queues, every := h.cfg.reportedQueues(), slices.Equal(h.cfg.Queues, []string{allQueues})
	if every {
		queues = slices.Sorted(slices.Values(known))
	}
	out.ControlQueue, out.Warnings = h.cfg.ControlQueue, []string{}
	if !served[h.cfg.ControlQueue] {
		out.Warnings = append(out.Warnings, notServedWarning(h.cfg.ControlQueue,
			", where actions on runs that recorded no queue go", "they wait"))
	}
	for _, q := range queues {
		switch {
		case every, q == h.cfg.ControlQueue, served[q]:
		case shardOfControl(q, h.cfg):
			out.Warnings = append(out.Warnings, fmt.Sprintf("no worker serves queue %q, a shard of %q: the map element "+
				"and rollback tasks on it wait there until a worker serving it starts (worker -queue %s -queue-shards %d, "+
				"or GOREACTOR_QUEUE_SHARDS=%d)", q, h.cfg.ControlQueue, h.cfg.ControlQueue, h.cfg.QueueShards, h.cfg.QueueShards))
		default:
			out.Warnings = append(out.Warnings, notServedWarning(q, "", "its runs and the actions on them wait"))
		}
		if !slices.Contains(known, q) {
			// A configured queue nothing was enqueued on yet.
			out.Queues = append(out.Queues, queueView{Queue: q, Served: served[q]})
			continue
		}
		info, err := h.inspector.GetQueueInfo(q)
		if err != nil {
			h.serverError(w, r, fmt.Errorf("read asynq queue %s: %w", q, err))
			return
		}
		out.Queues = append(out.Queues, queueView{Queue: q, Served: served[q], Pending: info.Pending, Active: info.Active,
			Scheduled: info.Scheduled, Retry: info.Retry, Archived: info.Archived,
			OldestPendingAge: info.Latency.Milliseconds()})
	}
	writeJSON(w, http.StatusOK, out)
}

// shardOfControl reports whether q is a shard queue of cfg.ControlQueue.
func shardOfControl(q string, cfg Config) bool {
	return slices.Contains(maptask.ShardQueues(cfg.ControlQueue, cfg.QueueShards), q)
}
