package worker

import (
	"errors"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/hibiken/asynq"
)

// withShards returns queues with the shard queues of c's queue added at the
// priority of c's queue (a copy: the caller's map is left alone). A shard
// queue the caller listed keeps its own priority.
func withShards(queues map[string]int, c *Client) map[string]int {
	shards := c.ShardQueues()
	if len(shards) == 0 {
		return queues
	}
	out := maps.Clone(queues)
	for _, q := range shards {
		if _, ok := out[q]; !ok {
			out[q] = queues[c.Queue()]
		}
	}
	return out
}

// shardName matches a shard queue's name, "<base>.shard<i>".
var shardName = regexp.MustCompile(`^(.+)\.shard(0|[1-9][0-9]?)$`)

// unservedShards returns, sorted, the shard queues of the base queues this
// worker serves that hold tasks (pending, active, scheduled or retrying)
// while neither this worker nor any live asynq server polls them: tasks
// enqueued by a client with more shards than the workers have (a shard
// count lowered, or set on the enqueuing side only). They wait there until
// a worker serves them.
func unservedShards(insp *asynq.Inspector, serves map[string]int) ([]string, error) {
	known, err := insp.Queues()
	if err != nil {
		return nil, err
	}
	var candidates []string
	for _, q := range known {
		m := shardName.FindStringSubmatch(q)
		if m == nil || serves[q] > 0 || serves[m[1]] <= 0 {
			continue
		}
		candidates = append(candidates, q)
	}
	if len(candidates) == 0 {
		return nil, nil
	}
	servers, err := insp.Servers()
	if err != nil {
		return nil, err
	}
	served := map[string]bool{}
	for _, s := range servers {
		if s.Status != "active" {
			continue
		}
		for q, prio := range s.Queues {
			served[q] = served[q] || prio > 0
		}
	}
	var out []string
	for _, q := range candidates {
		if served[q] {
			continue
		}
		info, err := insp.GetQueueInfo(q)
		if err != nil {
			if errors.Is(err, asynq.ErrQueueNotFound) { // deleted meanwhile
				continue
			}
			return nil, err
		}
		if info.Pending+info.Active+info.Scheduled+info.Retry > 0 {
			out = append(out, q)
		}
	}
	slices.Sort(out)
	return out, nil
}

// warnUnservedShards logs one Warn when shard queues of the queues this
// worker serves hold tasks that no worker polls (unservedShards): an
// operator must act, or those map elements and rollback jobs never run.
func (w *Worker) warnUnservedShards(insp *asynq.Inspector) {
	unserved, err := unservedShards(insp, w.cfg.Queues)
	if err != nil {
		w.log.Warn("could not check for shard queues no worker serves", "event", "worker.shards.check_failed", "error", err)
		return
	}
	if len(unserved) == 0 {
		return
	}
	w.log.Warn("shard queues hold map tasks that no worker serves: start workers with -queue-shards "+
		"(GOREACTOR_QUEUE_SHARDS) as high as the enqueuing clients' ClientConfig.Shards, or those element and rollback tasks never run",
		"event", "worker.shards.unserved", "queues", strings.Join(unserved, ","), slog.Int("count", len(unserved)))
}
