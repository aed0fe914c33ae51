package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/worker"
)

// The bare asynq side: the same tasks a fan-out map runs, without
// goreactor. A plain asynq.Client enqueues them one by one, as a map
// dispatches its elements (a task id each, goreactor's retry and timeout
// options), and an asynq.Server configured like goreactor's workers
// (serverConfig: same concurrency, same polling intervals), in the same
// number of processes, runs a handler that sleeps the task's latency and
// does nothing else. Every bare measurement runs on a pool of its own, on
// the queue bareQueue, after the goreactor pool it is compared with has
// stopped, so neither side's idle servers poll during the other's run.

// noopType is the bare tasks' type.
const noopType = "bench:noop"

// noopPayload is about the size of an element task's payload (map id,
// index, encoded item), so both move the same bytes.
var noopPayload = make([]byte, 64)

// bareAsynq enqueues n tasks one by one on queue, and returns the time from
// the first enqueue until the queue has no pending or active task (polled
// on poll). The queue's servers must already run.
func bareAsynq(ctx context.Context, enq, poll redis.UniversalClient, queue string, n int) (time.Duration, error) {
	client := asynq.NewClientFromRedisClient(enq)
	id := shortID()
	start := time.Now()
	for i := range n {
		_, err := client.EnqueueContext(ctx, asynq.NewTask(noopType, noopPayload),
			asynq.TaskID(fmt.Sprintf("noop:%s:%d", id, i)), asynq.Queue(queue),
			asynq.MaxRetry(worker.DefaultMaxRetry), asynq.Timeout(worker.DefaultTaskTimeout))
		if err != nil {
			return 0, fmt.Errorf("bare asynq: enqueue: %w", err)
		}
	}
	if err := queueDrained(ctx, poll, queue); err != nil {
		return 0, fmt.Errorf("bare asynq: %w", err)
	}
	return time.Since(start), nil
}

// bareQueue is the queue of the bare asynq measurements (never goreactor's),
// added to the queues deleted at exit on its first use.
func (b *bench) bareQueue() string {
	q := b.queue + "-bare"
	for _, known := range b.queues {
		if known == q {
			return q
		}
	}
	b.queues = append(b.queues, q)
	return q
}

// bareRun runs n bare asynq tasks whose handler sleeps latency, on a fresh
// pool of -workers workers in -procs processes, and returns the time from
// the first enqueue until the last task is done. It checks from asynq's
// own counters that exactly n tasks were processed and none failed (a
// failed task leaves the queue for the retry set, which would make the run
// look fast).
func (b *bench) bareRun(ctx context.Context, label string, n int, latency time.Duration) (time.Duration, error) {
	queue := b.bareQueue()
	spec := b.spec(kindBare, nil)
	spec.Queue, spec.Latency = queue, latency
	var took time.Duration
	err := b.withPool(ctx, spec, b.cfg.procs, func() error {
		before, err := asynqTotals(ctx, b.admin, queue)
		if err != nil {
			return err
		}
		stop := b.bar.track(label, func(ctx context.Context) (string, int, int) {
			now, err := asynqTotals(ctx, b.admin, queue)
			if err != nil {
				return "", 0, n
			}
			return "tasks", int(now.processed - before.processed), n
		})
		took, err = bareAsynq(ctx, b.owner, b.admin, queue, n)
		stop()
		if err != nil {
			return err
		}
		after, err := asynqTotals(ctx, b.admin, queue)
		if err != nil {
			return err
		}
		if d := after.sub(before); d.processed != int64(n) || d.failed != 0 {
			b.fail(fmt.Sprintf("%s: asynq processed %d of %d tasks, %d failed", label, d.processed, n, d.failed))
		}
		return nil
	})
	return took, err
}

// totals is what asynq has processed and failed on a queue since it was
// first used (its cumulative counters; a failure counts as processed too).
type totals struct{ processed, failed int64 }

func (t totals) sub(o totals) totals {
	return totals{processed: t.processed - o.processed, failed: t.failed - o.failed}
}

// asynqTotals reads asynq's cumulative counters of queue, which its
// completion and failure scripts increment atomically with removing the
// task from the active list. (The Inspector reads the same keys, but fails
// for a queue nothing was enqueued on yet.)
func asynqTotals(ctx context.Context, rdb redis.UniversalClient, queue string) (totals, error) {
	var p, f *redis.StringCmd
	_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		p, f = pipe.Get(ctx, "asynq:{"+queue+"}:processed"), pipe.Get(ctx, "asynq:{"+queue+"}:failed")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return totals{}, fmt.Errorf("read asynq's counters of %s: %w", queue, err)
	}
	read := func(c *redis.StringCmd) int64 {
		n, _ := c.Int64() // redis.Nil: never incremented
		return n
	}
	return totals{processed: read(p), failed: read(f)}, nil
}
