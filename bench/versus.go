package main

import (
	"context"
	"fmt"
	"time"
)

// goreactor against bare asynq (issue #23). The question is what the
// fan-out map costs over the queue it runs on: the same number of tasks,
// each doing the same modelled work, on the same number of workers in the
// same number of processes, once through goreactor and once as plain asynq
// tasks (bare.go). Each bare run follows the goreactor run it is compared
// with, on a pool of its own.

// versusBareAsynq fills r's comparisons of the latency-bound runs with
// bare asynq: the fan-out rollback already measured (r.FanoutSeconds: n
// undos of -undo-latency) against n bare tasks sleeping -undo-latency, and
// a completing fan-out map whose elements' forward step does -work-latency
// of work against n bare tasks sleeping -work-latency. The rollback runs'
// forward steps do no work, so their forward pass is not this comparison.
func (b *bench) versusBareAsynq(ctx context.Context, r *report) error {
	c := b.cfg
	bare, err := b.bareRun(ctx, "bare asynq, the rollback's tasks", c.elements, c.undoLatency)
	if err != nil {
		return err
	}
	r.BareAsynqRollbackSeconds = seconds(bare)
	r.FanoutVsBareAsynqRollback = r.FanoutSeconds / r.BareAsynqRollbackSeconds

	var fwd time.Duration
	var fwdRun string
	err = b.withPool(ctx, b.spec(kindReactor, []int{c.batch}), c.procs, func() error {
		var err error
		fwd, fwdRun, err = b.fanOutForward(ctx, "fan-out forward (work latency)", "fw", c.elements, c.batch, c.workLatency)
		return err
	})
	if err != nil {
		return err
	}
	if _, err := b.checkBurst(ctx, "fan-out forward", fwdRun, c.batch); err != nil {
		return err
	}
	if bare, err = b.bareRun(ctx, "bare asynq, the forward's tasks", c.elements, c.workLatency); err != nil {
		return err
	}
	r.FanoutForwardWorkSeconds, r.BareAsynqForwardSeconds = seconds(fwd), seconds(bare)
	r.FanoutVsBareAsynqForward = r.FanoutForwardWorkSeconds / r.BareAsynqForwardSeconds
	return nil
}

// throughputRounds fills r's repeated zero-latency throughput: -rounds
// rounds, each a fan-out map of -elements elements in one batch on a fresh
// pool and owner, then -elements bare asynq no-op tasks on a fresh pool.
func (b *bench) throughputRounds(ctx context.Context, r *report) error {
	c := b.cfg
	fan := make([]float64, 0, c.rounds)
	bare := make([]float64, 0, c.rounds)
	for i := range c.rounds {
		rate, err := b.throughputRound(ctx, fmt.Sprintf("throughput %d/%d: fan-out", i+1, c.rounds), false)
		if err != nil {
			return err
		}
		fan = append(fan, rate)
		took, err := b.bareRun(ctx, fmt.Sprintf("throughput %d/%d: bare asynq", i+1, c.rounds), c.elements, 0)
		if err != nil {
			return err
		}
		bare = append(bare, float64(c.elements)/took.Seconds())
	}
	r.ThroughputRounds = c.rounds
	r.FanoutElementsPerSecRounds, r.BareAsynqTasksPerSecRounds = summarize(fan), summarize(bare)
	r.ThroughputRatioOfMedians = r.FanoutElementsPerSecRounds.Median / r.BareAsynqTasksPerSecRounds.Median
	r.ThroughputRatioRounds = summarize(ratios(fan, bare))
	return nil
}
