package worker

import (
	"context"
	"maps"
	"os"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/payload"
	"github.com/goreactor/goreactor/internal/version"
)

// A running Worker publishes a record of itself beside asynq's server
// record: asynq's ServerInfo says which queues a process polls and what it
// runs, but not which goreactor it is, so the dashboard's workers view
// (GET /api/workers) joins the two by asynq's server id. The record is the
// hash keys.Worker(serverID) holding a payload.WorkerRecord, written with its TTL in
// one MULTI (never a key without expiry), refreshed every recordBeat and
// deleted by Stop; a killed worker's record expires within recordTTL.
const (
	// recordBeat is how often a worker refreshes its record: asynq's own
	// heartbeat interval, so the two go stale together.
	recordBeat = 5 * time.Second
	// recordTTL is three beats: one missed write (a slow Redis, a GC
	// pause) does not drop a live worker's version from the view.
	recordTTL = 3 * recordBeat
	// discoverTimeout bounds the wait, in Start, for asynq's first
	// heartbeat, which names the server's id. asynq writes it as its
	// server starts, so this is only ever reached when Redis does not
	// answer; the worker then runs without a record.
	discoverTimeout = 5 * time.Second
)

// discoverMu serialises the discovery of asynq server ids within this
// process: asynq generates a server's id inside Server.Start and exposes it
// only in its registry, where servers are told apart by host and pid, which
// every server of one process shares. Holding discoverMu from before Start
// until the new id shows, a worker knows that the one new id of its host and
// pid (with its queues and concurrency) is its own.
var discoverMu sync.Mutex

// asynqHost is the host name asynq records for this process.
func asynqHost() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown-host" // what asynq records then
	}
	return h
}

// record is a running worker's published record.
type record struct {
	rdb    redis.UniversalClient
	key    string
	fields map[string]any
	cancel context.CancelFunc
	done   chan struct{}
}

// startServer starts the asynq server and, once asynq's registry names its
// id, the record's heartbeat. A registry that cannot be read leaves the
// worker running without a record (the dashboard then shows its version as
// unknown): the record informs an operator and must never stop work.
func (w *Worker) startServer() error {
	discoverMu.Lock()
	defer discoverMu.Unlock()
	insp := asynq.NewInspectorFromRedisClient(w.rdb)
	host, pid := asynqHost(), os.Getpid()
	before := map[string]bool{}
	servers, listErr := insp.Servers()
	for _, s := range servers {
		if s.Host == host && s.PID == pid {
			before[s.ID] = true
		}
	}
	started := time.Now()
	if err := w.srv.Start(w.mux); err != nil {
		return err
	}
	if listErr != nil {
		w.log.Warn("cannot read asynq's server registry; this worker publishes no record, so the dashboard shows its version as unknown",
			"event", "worker.record.unavailable", "error", listErr)
		return nil
	}
	// asynq keeps the queues of positive priority (and "default" when
	// none is left); Config.Queues always serves at least one.
	queues := maps.Clone(w.cfg.Queues)
	maps.DeleteFunc(queues, func(_ string, p int) bool { return p <= 0 })
	id := ""
	for deadline := time.Now().Add(discoverTimeout); id == "" && time.Now().Before(deadline); {
		servers, err := insp.Servers()
		if err != nil {
			listErr = err
		}
		for _, s := range servers {
			if s.Host == host && s.PID == pid && !before[s.ID] && s.Concurrency == w.cfg.Concurrency && maps.Equal(s.Queues, queues) {
				id = s.ID
				break
			}
		}
		if id == "" {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if id == "" {
		w.log.Warn("asynq's server registry did not list this worker in time; it publishes no record, so the dashboard shows its version as unknown",
			"event", "worker.record.unavailable", "error", listErr)
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.rec = &record{rdb: w.rdb, key: keys.New(engine.Prefix(w.engine)).Worker(id), cancel: cancel, done: make(chan struct{}),
		fields: payload.WorkerRecord{Version: version.String(), Prefix: engine.Prefix(w.engine), Host: host, PID: pid,
			Started: started}.Fields()}

	w.rec.write(ctx, w)
	go w.rec.beat(ctx, w)
	return nil
}

// write sets the record and its TTL in one MULTI.
func (r *record) write(ctx context.Context, w *Worker) {
	_, err := r.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, r.key, r.fields)
		p.PExpire(ctx, r.key, recordTTL)
		return nil
	})
	if err != nil && ctx.Err() == nil {
		// The next beat writes it again; until then the view may show the
		// version as unknown, nothing worse.
		w.log.Debug("could not refresh the worker's record", "event", "worker.record.write_failed", "key", r.key, "error", err)
	}
}

func (r *record) beat(ctx context.Context, w *Worker) {
	defer close(r.done)
	t := time.NewTicker(recordBeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.write(ctx, w)
		}
	}
}

// stop ends the heartbeat and deletes the record (on ctx without its
// cancellation, bounded: Stop's caller may have given up already, and the
// TTL removes a record this cannot).
func (r *record) stop(ctx context.Context, w *Worker) {
	r.cancel()
	<-r.done
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := r.rdb.Del(dctx, r.key).Err(); err != nil {
		w.log.Debug("could not delete the worker's record; it expires on its own", "event", "worker.record.delete_failed",
			"key", r.key, "error", err)
	}
}
