package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// heapReport is the -heap run's result: this process's heap during the
// rollback of maps of each size, inline and fan-out. The items come from a
// paging Source, so nothing in the owner needs to grow with the map; the
// target is the largest size within 1.25x of the smallest.
type heapReport struct {
	Redis     string      `json:"redis"`
	KeyPrefix string      `json:"key_prefix"`
	Queue     string      `json:"queue"`
	Machine   string      `json:"machine"`
	Workers   int         `json:"workers"`
	BatchSize int         `json:"batch_size"`
	Sizes     []heapPoint `json:"sizes"`
	// Ratios are the heap of the largest size over the smallest's.
	InlineRatio float64  `json:"inline_heap_ratio"`
	FanoutRatio float64  `json:"fanout_heap_ratio"`
	Target      float64  `json:"target_ratio"`
	OK          bool     `json:"ok"`
	Failures    []string `json:"check_failures"`
}

type heapPoint struct {
	Elements              int     `json:"elements"`
	InlineHeapBytes       uint64  `json:"inline_rollback_heap_inuse_bytes"`
	FanoutHeapBytes       uint64  `json:"fanout_rollback_heap_inuse_bytes"`
	InlineRollbackSeconds float64 `json:"inline_seconds"`
	FanoutRollbackSeconds float64 `json:"fanout_seconds"`
	InlineForwardSeconds  float64 `json:"inline_forward_seconds"`
	FanoutForwardSeconds  float64 `json:"fanout_forward_seconds"`
	FanoutMaxBurst        int     `json:"fanout_max_burst"`
	FanoutMaxWaiting      int     `json:"fanout_max_waiting"`
}

const heapTarget = 1.25

// heapCompare rolls back inline and fan-out maps of each size with no undo
// latency. Its workers run in this process whatever -procs says: a fan-out
// owner's rollback start and its final aggregation run on whichever worker
// resumes it, so only with the workers here does this process's heap cover
// every owner step. The heap is sampled (after a GC) every 100 ms of each
// rollback, after a warm-up pass and with every Redis pool opened up front.
func (b *bench) heapCompare(ctx context.Context) (*heapReport, error) {
	c := b.cfg
	r := &heapReport{Redis: b.tgt.desc, KeyPrefix: b.prefix, Queue: b.queue, Machine: machine(), Workers: c.workers, BatchSize: c.batch, Target: heapTarget}
	b.bar.note("heap: sizes %v, %d workers in this process, batch %d, no undo latency\n", c.heap, c.workers, c.batch)
	spec := b.spec(kindReactor, []int{c.batch})
	spec.Concurrency = c.workers
	var fanRuns []string
	err := b.withPool(ctx, spec, 0, func() error {
		// A warm-up pass of the smallest size, not measured: the first
		// runs of a process grow its connection pools, caches and sync.Pools
		// to their working size, which would otherwise look like growth
		// between the first size measured and the next.
		for _, fan := range []bool{false, true} {
			if _, err := b.rollback(ctx, rollbackRun{n: c.heap[0], batch: c.batch, fanOut: fan, label: "warm-up"}); err != nil {
				return err
			}
		}
		for _, n := range c.heap {
			base := rollbackRun{n: n, batch: c.batch, heapEvery: 100 * time.Millisecond}
			inRun, fanRun := base, base
			inRun.label = fmt.Sprintf("inline map, %d elements", n)
			fanRun.fanOut, fanRun.label = true, fmt.Sprintf("fan-out map, %d elements", n)
			in, err := b.rollback(ctx, inRun)
			if err != nil {
				return err
			}
			fan, err := b.rollback(ctx, fanRun)
			if err != nil {
				return err
			}
			r.Sizes = append(r.Sizes, heapPoint{Elements: n, InlineHeapBytes: in.HeapInuse, FanoutHeapBytes: fan.HeapInuse,
				InlineRollbackSeconds: seconds(in.Rollback), FanoutRollbackSeconds: seconds(fan.Rollback),
				InlineForwardSeconds: seconds(in.Forward), FanoutForwardSeconds: seconds(fan.Forward), FanoutMaxWaiting: fan.MaxPending})
			fanRuns = append(fanRuns, fan.Run)
			b.checkWaiting(fanRun.label, fan.MaxPending, c.batch)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range r.Sizes {
		burst, err := b.checkBurst(ctx, fmt.Sprintf("fan-out map, %d elements", r.Sizes[i].Elements), fanRuns[i], c.batch)
		if err != nil {
			return nil, err
		}
		r.Sizes[i].FanoutMaxBurst = burst.N
	}
	small, large := r.Sizes[0], r.Sizes[len(r.Sizes)-1]
	r.InlineRatio = float64(large.InlineHeapBytes) / float64(small.InlineHeapBytes)
	r.FanoutRatio = float64(large.FanoutHeapBytes) / float64(small.FanoutHeapBytes)
	b.mu.Lock()
	r.Failures = append([]string{}, b.failures...)
	b.mu.Unlock()
	r.OK = len(r.Failures) == 0
	return r, nil
}

// missed names the heap ratios above the target.
func (r *heapReport) missed() []string {
	var out []string
	for _, m := range []struct {
		name  string
		ratio float64
	}{{"inline_heap_ratio", r.InlineRatio}, {"fanout_heap_ratio", r.FanoutRatio}} {
		if m.ratio > r.Target {
			out = append(out, fmt.Sprintf("%s %.2f (want <= %.2f)", m.name, m.ratio, r.Target))
		}
	}
	return out
}

func (r *heapReport) print(w io.Writer) {
	fmt.Fprintf(w, "\ngoreactor bench -heap: this process's heap in use (max after GC) during the rollback; paging source, no undo latency\n")
	fmt.Fprintf(w, "redis: %s\nmachine: %s\nworkers: %d in this process, batch %d\n\n", r.Redis, r.Machine, r.Workers, r.BatchSize)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "elements\tinline heap\tinline rollback\tfan-out heap\tfan-out rollback\tmax burst\tmax waiting\t")
	for _, p := range r.Sizes {
		fmt.Fprintf(tw, "%d\t%s\t%.1fs\t%s\t%.1fs\t%d\t%d\t\n", p.Elements, mib(p.InlineHeapBytes), p.InlineRollbackSeconds,
			mib(p.FanoutHeapBytes), p.FanoutRollbackSeconds, p.FanoutMaxBurst, p.FanoutMaxWaiting)
	}
	tw.Flush()
	small, large := r.Sizes[0].Elements, r.Sizes[len(r.Sizes)-1].Elements
	verdict := func(v float64) string {
		if v <= r.Target {
			return "met"
		}
		return "MISSED"
	}
	fmt.Fprintf(w, "\nheap at %d / heap at %d: inline %.2fx (%s), fan-out %.2fx (%s); target <= %.2fx\n",
		large, small, r.InlineRatio, verdict(r.InlineRatio), r.FanoutRatio, verdict(r.FanoutRatio), r.Target)
	if !r.OK {
		fmt.Fprintf(w, "\ncorrectness: %d WRONG RESULT(S)\n", len(r.Failures))
	}
}
