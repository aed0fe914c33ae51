package main

import (
	"context"
	"fmt"
	"time"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// fanOutThroughput runs a fan-out map of n zero-latency elements that
// completes (no failure), with one batch of n (B >= elements: back pressure
// never waits), and returns elements per second from engine.Run to the
// run's completion, and the run's id. The workers must serve fanOutName(n).
func (b *bench) fanOutThroughput(ctx context.Context, label string, n int) (rate float64, id string, err error) {
	took, id, err := b.fanOutForward(ctx, label, "tp", n, n, 0)
	if err != nil {
		return 0, id, err
	}
	return float64(n) / took.Seconds(), id, nil
}

// fanOutForward runs a fan-out map of n elements in batches of batch that
// completes (no failure), each element's forward step doing work of
// latency, and returns the time from engine.Run to the run's completion
// (its UpdatedAt), and the run's id (kind-<random>). The workers must
// serve fanOutName(batch).
func (b *bench) fanOutForward(ctx context.Context, label, kind string, n, batch int, work time.Duration) (took time.Duration, id string, err error) {
	id = kind + "-" + shortID()
	counts, mark := b.prefix+":bench:undos:"+id, b.prefix+":bench:failed-at:"+id
	mapID := mapstep.MapID(id, mapStep)
	stopBar := b.bar.track(label, func(ctx context.Context) (string, int, int) {
		if p, ok, err := mapstep.ProgressOf(ctx, b.host.engine, mapID); err == nil && ok {
			return "forward", p.Settled, p.Total
		}
		return "starting", 0, n
	})
	start := time.Now()
	run, err := b.runToEnd(ctx, b.host.fanOut[batch],
		map[string]any{"n": n, "work_ns": int64(work), "counts": counts, "mark": mark, "fail": false}, id)
	stopBar()
	if err != nil {
		return 0, id, fmt.Errorf("%s: %w", label, err)
	}
	if run.Status != reactor.StatusCompleted {
		b.fail(fmt.Sprintf("%s: run %s ended %s (%v), want completed", label, id, run.Status, run.Failure))
	}
	if p, ok, err := mapstep.ProgressOf(ctx, b.host.engine, mapID); err != nil || !ok || p.Settled != n || p.Failed != 0 {
		b.fail(fmt.Sprintf("%s: map settled %d of %d (%d failed; %v)", label, p.Settled, n, p.Failed, err))
	}
	return run.UpdatedAt.Sub(start), id, nil
}
