package main

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// noopType is the bare baseline's task type.
const noopType = "bench:noop"

// noopPayload is about the size of an element task's payload (map id,
// index, encoded item), so both move the same bytes.
var noopPayload = make([]byte, 64)

// fanOutThroughput runs a fan-out map of n zero-latency elements that
// completes (no failure), with one batch of n (B >= elements: back pressure
// never waits), and returns elements per second from engine.Run to the
// run's completion, and the run's id. The workers must serve fanOutName(n).
func (b *bench) fanOutThroughput(ctx context.Context, n int) (rate float64, id string, err error) {
	id = "tp-" + shortID()
	counts, mark := b.prefix+":bench:undos:"+id, b.prefix+":bench:failed-at:"+id
	mapID := mapstep.MapID(id, mapStep)
	stopBar := b.bar.track("fan-out throughput (no latency)", func(ctx context.Context) (string, int, int) {
		if p, ok, err := mapstep.ProgressOf(ctx, b.host.engine, mapID); err == nil && ok {
			return "forward", p.Settled, p.Total
		}
		return "starting", 0, n
	})
	start := time.Now()
	run, err := b.runToEnd(ctx, b.host.fanOut[n], map[string]any{"n": n, "counts": counts, "mark": mark, "fail": false}, id)
	stopBar()
	if err != nil {
		return 0, id, fmt.Errorf("fan-out throughput: %w", err)
	}
	if run.Status != reactor.StatusCompleted {
		b.fail(fmt.Sprintf("fan-out throughput: run %s ended %s (%v), want completed", id, run.Status, run.Failure))
	}
	if p, ok, err := mapstep.ProgressOf(ctx, b.host.engine, mapID); err != nil || !ok || p.Settled != n || p.Failed != 0 {
		b.fail(fmt.Sprintf("fan-out throughput: map settled %d of %d (%d failed; %v)", p.Settled, n, p.Failed, err))
	}
	took := run.UpdatedAt.Sub(start)
	return float64(n) / took.Seconds(), id, nil
}

// bareAsynq enqueues n no-op tasks one by one, as a map dispatches its
// elements (a task id each, goreactor's retry and timeout options), on
// queue, and returns tasks per second from the first enqueue until the
// queue is empty (polled on poll). The queue's servers must already run.
func bareAsynq(ctx context.Context, enq, poll *redis.Client, queue string, n int) (float64, error) {
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
	return float64(n) / time.Since(start).Seconds(), nil
}
