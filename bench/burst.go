package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// Back pressure, as the design states it (DESIGN.md section 4): no single
// action enqueues more than B tasks. An action is the handling of one asynq
// task (one delivery of it), or, outside any task, the owner's own start in
// the process that called engine.Run. Every engine the benchmark builds
// enqueues through a countingEnqueuer, which counts in memory, per action
// and per benchmark run, the distinct map tasks (element and rollback jobs)
// the action enqueued; nothing is added to the hot path's Redis traffic.
// Worker subprocesses write their figures to Redis once, when they stop.
//
// Grouping. The group of an enqueue is (task id, asynq retry count) of the
// task being handled, taken from the handler's context, and the benchmark
// run the enqueued task belongs to. A group ends when its handler returns
// (asynq cancels the handler's context then): its size is folded into the
// run's maximum and it is forgotten, so a later delivery of the same task
// starts from zero rather than adding to the first delivery's count. Within
// a group the task ids are a set, so an action that enqueues the same task
// twice (an enqueue retried after an error) counts it once. Owner wake-ups
// (reactor.Wake: at most one per action, the owner's resume) are forwarded
// but not counted: they are not part of a map's fan-out.

// ownerAction groups the enqueues made outside any asynq task: the owner's
// start of a fan-out map, in the process that called engine.Run.
const ownerAction = "owner"

// burst is the largest action of one benchmark run: how many tasks it
// enqueued, and which action it was.
type burst struct {
	N      int    `json:"n"`
	Action string `json:"action"`
}

type groupKey struct{ action, run string }

type group struct {
	ids   map[string]struct{}
	armed bool // its end is hooked to its handler's context
}

// burstCounter counts the tasks enqueued per action, in one process.
type burstCounter struct {
	mu   sync.Mutex
	live map[groupKey]*group
	best map[string]burst // per benchmark run, over ended groups
}

func newBurstCounter() *burstCounter {
	return &burstCounter{live: map[groupKey]*group{}, best: map[string]burst{}}
}

// actionOf names the action ctx belongs to.
func actionOf(ctx context.Context) string {
	id, ok := asynq.GetTaskID(ctx)
	if !ok {
		return ownerAction
	}
	n, _ := asynq.GetRetryCount(ctx)
	return id + "#" + strconv.Itoa(n)
}

// runOf is the benchmark run a map or run id belongs to: every map id is
// "<owner run id>~<step>", every element run id "<map id>.<i>".
func runOf(id string) string {
	run, _, _ := strings.Cut(id, "~")
	return run
}

// note records that the action of ctx enqueued task taskID of run.
func (c *burstCounter) note(ctx context.Context, run, taskID string) {
	k := groupKey{action: actionOf(ctx), run: run}
	c.mu.Lock()
	g := c.live[k]
	if g == nil {
		g = &group{ids: map[string]struct{}{}}
		c.live[k] = g
	}
	g.ids[taskID] = struct{}{}
	arm := !g.armed && ctx.Done() != nil
	g.armed = g.armed || arm
	c.mu.Unlock()
	if arm {
		// A context that can never end (context.WithoutCancel, which the
		// engine uses for some work after a save) leaves the group live;
		// it is still counted, by max.
		context.AfterFunc(ctx, func() { c.end(k) })
	}
}

// end folds an ended group into its run's maximum and forgets it.
func (c *burstCounter) end(k groupKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g := c.live[k]; g != nil {
		delete(c.live, k)
		c.best[k.run] = larger(c.best[k.run], burst{N: len(g.ids), Action: k.action})
	}
}

func larger(a, b burst) burst {
	if b.N > a.N {
		return b
	}
	return a
}

// max is the largest action of run seen in this process so far, ended or
// not.
func (c *burstCounter) max(run string) burst {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.best[run]
	for k, g := range c.live {
		if k.run == run {
			m = larger(m, burst{N: len(g.ids), Action: k.action})
		}
	}
	return m
}

// all is every run's largest action in this process.
func (c *burstCounter) all() map[string]burst {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]burst, len(c.best))
	for run, m := range c.best {
		out[run] = m
	}
	for k, g := range c.live {
		out[k.run] = larger(out[k.run], burst{N: len(g.ids), Action: k.action})
	}
	return out
}

// burstsKey is the hash where worker subprocesses leave their figures
// (field "<run>|<pid>", value a JSON burst), deleted with the prefix.
func burstsKey(prefix string) string { return prefix + ":bench:bursts" }

// publish writes this process's figures to Redis in one HSET (a worker
// subprocess does it when it stops).
func (c *burstCounter) publish(ctx context.Context, rdb redis.UniversalClient, prefix string) error {
	all := c.all()
	if len(all) == 0 {
		return nil
	}
	fields := make([]any, 0, 2*len(all))
	for run, m := range all {
		v, err := json.Marshal(m)
		if err != nil {
			return err
		}
		fields = append(fields, run+"|"+strconv.Itoa(os.Getpid()), string(v))
	}
	return rdb.HSet(ctx, burstsKey(prefix), fields...).Err()
}

// maxBurst is run's largest action over every process: this one's
// counter, and what stopped worker subprocesses published. Call it after
// the run's workers have stopped.
func (b *bench) maxBurst(ctx context.Context, run string) (burst, error) {
	m := b.bursts.max(run)
	published, err := b.admin.HGetAll(ctx, burstsKey(b.prefix)).Result()
	if err != nil {
		return m, fmt.Errorf("read the workers' burst counts: %w", err)
	}
	for field, v := range published {
		if r, _, _ := strings.Cut(field, "|"); r != run {
			continue
		}
		var p burst
		if err := json.Unmarshal([]byte(v), &p); err != nil {
			return m, fmt.Errorf("burst count %s=%q: %w", field, v, err)
		}
		m = larger(m, p)
	}
	return m, nil
}

// checkBurst reads run's largest action and records a wrong result if it
// enqueued more than batch tasks, or if nothing was counted (the counting
// is broken: a fan-out map always enqueues).
func (b *bench) checkBurst(ctx context.Context, label, run string, batch int) (burst, error) {
	m, err := b.maxBurst(ctx, run)
	if err != nil {
		return m, err
	}
	switch {
	case m.N > batch:
		b.fail(fmt.Sprintf("%s: back pressure: one action (%s) enqueued %d tasks, more than the batch size %d", label, m.Action, m.N, batch))
	case m.N == 0:
		b.fail(fmt.Sprintf("%s: no enqueue was counted for run %s", label, run))
	}
	return m, nil
}

// waitingBound is how many tasks may wait in the queue at once: the claim
// of batch k+1 is triggered half a batch before batch k ends, so when it is
// claimed at most floor(B/2) tasks of batch k are still queued behind the
// trigger, plus the B just enqueued.
func waitingBound(batch int) int { return batch + batch/2 }

// checkWaiting records a wrong result if more than waitingBound tasks were
// seen waiting in the queue.
func (b *bench) checkWaiting(label string, waiting, batch int) {
	if waiting > waitingBound(batch) {
		b.fail(fmt.Sprintf("%s: %d tasks waited in the queue at once, more than B + B/2 = %d", label, waiting, waitingBound(batch)))
	}
}

// countingEnqueuer is the Enqueuer of every engine the benchmark builds:
// worker.Client's, with each map task counted by action.
type countingEnqueuer struct {
	inner *worker.Client
	c     *burstCounter
}

var (
	_ reactor.Enqueuer         = countingEnqueuer{}
	_ maptask.Enqueuer         = countingEnqueuer{}
	_ maptask.RollbackEnqueuer = countingEnqueuer{}
)

// Enqueue forwards an owner wake-up, uncounted.
func (q countingEnqueuer) Enqueue(ctx context.Context, w reactor.Wake) error {
	return q.inner.Enqueue(ctx, w)
}

func (q countingEnqueuer) EnqueueElement(ctx context.Context, t maptask.ElementTask) error {
	if err := maptask.MustAdapt(q.inner).EnqueueElement(ctx, t); err != nil {
		return err
	}
	q.c.note(ctx, runOf(t.MapID), t.TaskID())
	return nil
}

// EnqueueElements forwards a batch to the client's batch enqueue (several
// in flight), then counts each task.
func (q countingEnqueuer) EnqueueElements(ctx context.Context, ts []maptask.ElementTask) error {
	if err := maptask.EnqueueElements(ctx, maptask.MustAdapt(q.inner), ts); err != nil {
		return err
	}
	for _, t := range ts {
		q.c.note(ctx, runOf(t.MapID), t.TaskID())
	}
	return nil
}

// EnqueueRollbacks is EnqueueElements for rollback jobs.
func (q countingEnqueuer) EnqueueRollbacks(ctx context.Context, ts []maptask.RollbackTask) error {
	if err := maptask.EnqueueRollbacks(ctx, maptask.MustAdapt(q.inner), ts); err != nil {
		return err
	}
	for _, t := range ts {
		q.c.note(ctx, runOf(t.MapID), t.TaskID())
	}
	return nil
}

func (q countingEnqueuer) EnqueueRollback(ctx context.Context, t maptask.RollbackTask) error {
	if err := maptask.MustAdapt(q.inner).EnqueueRollback(ctx, t); err != nil {
		return err
	}
	q.c.note(ctx, runOf(t.MapID), t.TaskID())
	return nil
}

// Queue is the queue tasks go to (the sweepers ask the Enqueuer for it).
func (q countingEnqueuer) Queue() string { return q.inner.Queue() }
