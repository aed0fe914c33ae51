package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
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
	Elements int `json:"elements"`
	// KeyPrefix and Queue are this size's own: each size runs on fresh
	// keys, deleted before the next size starts.
	KeyPrefix             string  `json:"key_prefix"`
	Queue                 string  `json:"queue"`
	InlineHeapBytes       uint64  `json:"inline_rollback_heap_inuse_bytes"`
	FanoutHeapBytes       uint64  `json:"fanout_rollback_heap_inuse_bytes"`
	InlineRollbackSeconds float64 `json:"inline_seconds"`
	FanoutRollbackSeconds float64 `json:"fanout_seconds"`
	InlineForwardSeconds  float64 `json:"inline_forward_seconds"`
	FanoutForwardSeconds  float64 `json:"fanout_forward_seconds"`
	FanoutMaxBurst        int     `json:"fanout_max_burst"`
	FanoutMaxWaiting      int     `json:"fanout_max_waiting"`
	// Redis persistence during each run (null when this Redis does not
	// report it), and the server's used_memory when the size started
	// (its fresh keys empty) and when it ended (before they were deleted).
	InlinePersistence    *persistActivity `json:"inline_redis_persistence"`
	FanoutPersistence    *persistActivity `json:"fanout_redis_persistence"`
	RedisUsedMemoryStart *int64           `json:"redis_used_memory_start_bytes"`
	RedisUsedMemoryEnd   *int64           `json:"redis_used_memory_end_bytes"`
}

const heapTarget = 1.25

// heapCompare rolls back inline and fan-out maps of each size with no undo
// latency. Its workers run in this process whatever -procs says: a fan-out
// owner's rollback start and its final aggregation run on whichever worker
// resumes it, so only with the workers here does this process's heap cover
// every owner step. The heap is sampled (after a GC) every 100 ms of each
// rollback, after a warm-up pass and with every Redis pool opened up front.
// Each size (and the warm-up) runs on fresh keys and a fresh queue, with a
// pool and an owner engine of its own, and its keys are deleted before the
// next starts: no size's figures carry the keys, the tasks' leftovers or
// the pools of the sizes before it. Redis persistence is watched during
// every measured run.
func (b *bench) heapCompare(ctx context.Context) (*heapReport, error) {
	c := b.cfg
	r := &heapReport{Redis: b.tgt.desc, KeyPrefix: b.prefix, Queue: b.queue, Machine: machine(), Workers: c.workers, BatchSize: c.batch, Target: heapTarget}
	b.bar.note("heap: sizes %v, %d workers in this process, batch %d, no undo latency, fresh keys per size\n", c.heap, c.workers, c.batch)
	batches := []int{c.batch}
	// A warm-up pass of the smallest size, not measured: the first runs
	// of a process grow its caches and sync.Pools to their working size,
	// which would otherwise look like growth between the first size
	// measured and the next.
	err := b.onFreshKeys(ctx, "warm", batches, func() error {
		return b.withPool(ctx, b.spec(kindReactor, batches), 0, func() error {
			for _, fan := range []bool{false, true} {
				if _, err := b.rollback(ctx, rollbackRun{n: c.heap[0], batch: c.batch, fanOut: fan, label: "warm-up"}); err != nil {
					return err
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	for i, n := range c.heap {
		err := b.onFreshKeys(ctx, fmt.Sprintf("h%d", i), batches, func() error {
			p, err := b.heapSize(ctx, n)
			r.Sizes = append(r.Sizes, p)
			return err
		})
		if err != nil {
			return nil, err
		}
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

// heapSize measures one size of the heap comparison on the current keys,
// with a pool of its own.
func (b *bench) heapSize(ctx context.Context, n int) (heapPoint, error) {
	c := b.cfg
	p := heapPoint{Elements: n, KeyPrefix: b.prefix, Queue: b.queue}
	base := rollbackRun{n: n, batch: c.batch, heapEvery: 100 * time.Millisecond, persistence: true}
	inRun, fanRun := base, base
	inRun.label = fmt.Sprintf("inline map, %d elements", n)
	fanRun.fanOut, fanRun.label = true, fmt.Sprintf("fan-out map, %d elements", n)
	var in, fan rollbackResult
	err := b.withPool(ctx, b.spec(kindReactor, []int{c.batch}), 0, func() error {
		p.RedisUsedMemoryStart = usedMemory(ctx, b.admin)
		var err error
		if in, err = b.rollback(ctx, inRun); err != nil {
			return err
		}
		if fan, err = b.rollback(ctx, fanRun); err != nil {
			return err
		}
		p.RedisUsedMemoryEnd = usedMemory(ctx, b.admin)
		return nil
	})
	if err != nil {
		return p, err
	}
	p.InlineHeapBytes, p.FanoutHeapBytes = in.HeapInuse, fan.HeapInuse
	p.InlineRollbackSeconds, p.FanoutRollbackSeconds = seconds(in.Rollback), seconds(fan.Rollback)
	p.InlineForwardSeconds, p.FanoutForwardSeconds = seconds(in.Forward), seconds(fan.Forward)
	p.FanoutMaxWaiting = fan.MaxPending
	p.InlinePersistence, p.FanoutPersistence = in.Persistence, fan.Persistence
	b.checkWaiting(fanRun.label, fan.MaxPending, c.batch)
	// The workers have stopped: the burst counts are complete.
	burst, err := b.checkBurst(ctx, fanRun.label, fan.Run, c.batch)
	p.FanoutMaxBurst = burst.N
	return p, err
}

// onFreshKeys runs f with the bench's key prefix and main queue switched
// to fresh ones named after name (under the run's own, so the deletion at
// exit covers them too) and an owner engine on them serving batches; once
// f has returned (its workers stopped) their keys are deleted and the
// bench's own are back.
func (b *bench) onFreshKeys(ctx context.Context, name string, batches []int, f func() error) (err error) {
	prefix, queue := b.prefix+":"+name, b.queue+"-"+name
	b.queues = append(b.queues, queue)
	spec := b.spec(kindReactor, batches)
	spec.Prefix, spec.Queue = prefix, queue
	h, err := newHost(ctx, spec, b.owner, b.owner, nil, b.bursts)
	if err != nil {
		return err
	}
	savedPrefix, savedQueue, savedHost := b.prefix, b.queue, b.host
	b.prefix, b.queue, b.host = prefix, queue, h
	defer func() {
		b.prefix, b.queue, b.host = savedPrefix, savedQueue, savedHost
		h.close()
		if cerr := cleanup(b.admin, prefix, []string{queue}); cerr != nil {
			err = errors.Join(err, fmt.Errorf("delete the keys of %s (prefix %s): %w", name, prefix, cerr))
		}
	}()
	return f()
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
	fmt.Fprintln(tw, "elements\tinline heap\tinline rollback\tfan-out heap\tfan-out rollback\tmax burst\tmax waiting\tredis writes in / fo\tsaves in / fo\tredis memory start / end\t")
	var disturbed []string
	for _, p := range r.Sizes {
		fmt.Fprintf(tw, "%d\t%s\t%.1fs\t%s\t%.1fs\t%d\t%d\t%s / %s\t%s / %s\t%s / %s\t\n", p.Elements, mib(p.InlineHeapBytes), p.InlineRollbackSeconds,
			mib(p.FanoutHeapBytes), p.FanoutRollbackSeconds, p.FanoutMaxBurst, p.FanoutMaxWaiting,
			p.InlinePersistence.writes(), p.FanoutPersistence.writes(), p.InlinePersistence.saves(), p.FanoutPersistence.saves(),
			mibp(p.RedisUsedMemoryStart), mibp(p.RedisUsedMemoryEnd))
		if p.InlinePersistence.disturbed() {
			disturbed = append(disturbed, fmt.Sprintf("inline at %d", p.Elements))
		}
		if p.FanoutPersistence.disturbed() {
			disturbed = append(disturbed, fmt.Sprintf("fan-out at %d", p.Elements))
		}
	}
	tw.Flush()
	fmt.Fprintln(w, "(each size on fresh keys, deleted before the next; redis writes: rdb_changes_since_last_save during the run, every client's;",
		"saves: RDB saves or AOF rewrites that ran during it)")
	if len(disturbed) > 0 {
		fmt.Fprintf(w, "WARNING: Redis saved or rewrote its AOF during %s: those heap and time figures may be skewed\n", strings.Join(disturbed, ", "))
	}
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

// writes is the run's rdb_changes delta for the table.
func (a *persistActivity) writes() string {
	switch {
	case a == nil:
		return "n/a"
	case a.RDBChanges == nil:
		return "reset"
	}
	return fmt.Sprintf("%d", *a.RDBChanges)
}

// saves says which saves or rewrites ran during the run, for the table.
func (a *persistActivity) saves() string {
	if a == nil {
		return "n/a"
	}
	var out []string
	if a.RDBSaves > 0 {
		out = append(out, fmt.Sprintf("%d rdb", a.RDBSaves))
	} else if a.BgsaveSeen {
		out = append(out, "bgsave")
	}
	if a.AOFRewrites > 0 {
		out = append(out, fmt.Sprintf("%d aof rewrite", a.AOFRewrites))
	} else if a.AOFRewriteSeen {
		out = append(out, "aof rewrite")
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "+")
}

func mibp(b *int64) string {
	if b == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", float64(*b)/(1<<20))
}
