package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// report is the default run's result; its JSON names are the issue's.
type report struct {
	Redis         string  `json:"redis"`
	KeyPrefix     string  `json:"key_prefix"`
	Queue         string  `json:"queue"`
	Machine       string  `json:"machine"`
	Elements      int     `json:"elements"`
	Workers       int     `json:"workers"`
	Procs         int     `json:"procs"`
	BatchSize     int     `json:"batch_size"`
	UndoLatencyMS float64 `json:"undo_latency_ms"`

	InlineSeconds        float64 `json:"inline_seconds"`
	FanoutSeconds        float64 `json:"fanout_seconds"`
	Speedup              float64 `json:"speedup"`
	InlineForwardSeconds float64 `json:"inline_forward_seconds"`
	FanoutForwardSeconds float64 `json:"fanout_forward_seconds"`

	AsynqBaselineTasksPerSec float64 `json:"asynq_baseline_tasks_per_sec"`
	FanoutElementsPerSec     float64 `json:"fanout_elements_per_sec"`
	// FanoutTracedElementsPerSec and FanoutUntracedElementsPerSec are the
	// same measure with a recording tracer provider on the owner and the
	// workers and without one: medians of alternated rounds.
	FanoutTracedElementsPerSec   float64 `json:"fanout_traced_elements_per_sec"`
	FanoutUntracedElementsPerSec float64 `json:"fanout_untraced_elements_per_sec"`
	BaselineRatio                float64 `json:"baseline_ratio"`

	// The fan-out map against bare asynq running the same tasks (as many,
	// each doing the same modelled work) on the same workers and processes:
	// goreactor's time over bare asynq's (see versus.go). Rollback: the
	// fan-out rollback above (undo latency) against bare tasks sleeping the
	// undo latency; forward: a completing fan-out map whose elements' forward
	// step does work of WorkLatencyMS against bare tasks sleeping that.
	WorkLatencyMS             float64 `json:"work_latency_ms"`
	BareAsynqRollbackSeconds  float64 `json:"bare_asynq_rollback_seconds"`
	FanoutVsBareAsynqRollback float64 `json:"fanout_vs_bare_asynq_rollback"`
	FanoutForwardWorkSeconds  float64 `json:"fanout_forward_work_seconds"`
	BareAsynqForwardSeconds   float64 `json:"bare_asynq_forward_seconds"`
	FanoutVsBareAsynqForward  float64 `json:"fanout_vs_bare_asynq_forward"`

	// The zero-latency throughput repeated: ThroughputRounds rounds, each a
	// fan-out map (one batch) on a fresh pool and then as many bare asynq
	// no-op tasks on a fresh pool, so drift on a shared machine hits both.
	// ThroughputRatioOfMedians is the goreactor median over the bare asynq
	// median; ThroughputRatioRounds the ratio of each round's pair.
	ThroughputRounds           int     `json:"throughput_rounds"`
	FanoutElementsPerSecRounds spread  `json:"fanout_elements_per_sec_rounds"`
	BareAsynqTasksPerSecRounds spread  `json:"bare_asynq_tasks_per_sec_rounds"`
	ThroughputRatioOfMedians   float64 `json:"throughput_ratio_of_medians"`
	ThroughputRatioRounds      spread  `json:"throughput_ratio_rounds"`

	RoundtripsPerElementForward       float64  `json:"roundtrips_per_element_forward"`
	RoundtripsPerElementRollback      float64  `json:"roundtrips_per_element_rollback"`
	AsynqRoundtripsPerElementForward  float64  `json:"asynq_roundtrips_per_element_forward"`
	AsynqRoundtripsPerElementRollback float64  `json:"asynq_roundtrips_per_element_rollback"`
	BareAsynqRoundtripsPerTask        float64  `json:"bare_asynq_roundtrips_per_task"`
	RedisCmdsPerElementForward        *float64 `json:"redis_cmds_per_element_forward"`
	RedisCmdsPerElementRollback       *float64 `json:"redis_cmds_per_element_rollback"`
	BareAsynqCmdsPerTask              *float64 `json:"bare_asynq_cmds_per_task"`
	RoundtripSizes                    [2]int   `json:"roundtrip_map_sizes"`
	// RedisOtherClients counts connections of other clients seen while
	// commands were counted: when > 0 the command counts include theirs.
	RedisOtherClients int `json:"redis_other_clients"`

	// MaxBurst is the most tasks one action enqueued in the fan-out
	// rollback run (forward and rollback), MaxBurstAction that action
	// ("owner" or "<task id>#<retry>"); the design bounds it by B.
	// MaxWaiting and MaxQueued are sampled from the queue every 2 ms: the
	// most tasks pending, and pending + active (informational; waiting is
	// bounded by B + B/2).
	MaxBurst       int    `json:"max_burst"`
	MaxBurstAction string `json:"max_burst_action"`
	MaxWaiting     int    `json:"max_waiting"`
	MaxQueued      int    `json:"max_queued"`

	InlineRollbackHeapBytes uint64 `json:"inline_rollback_heap_inuse_bytes"`
	FanoutRollbackHeapBytes uint64 `json:"fanout_rollback_heap_inuse_bytes"`

	Targets  []targetCheck `json:"targets"`
	OK       bool          `json:"ok"`
	Failures []string      `json:"check_failures"`
}

// targetCheck is one performance target of issue #7 and whether this run
// met it. A missed target fails the run (exit status 1, unless -no-fail)
// when it is enforced: a target set for another configuration than the
// run's is reported with a note saying so, and does not count.
type targetCheck struct {
	Name     string  `json:"name"`
	Want     string  `json:"want"`
	Got      float64 `json:"got"`
	Met      bool    `json:"met"`
	Note     string  `json:"note,omitempty"`
	Enforced bool    `json:"enforced"`
}

// missed names the enforced targets the run missed, with what it got.
func (r *report) missed() []string {
	var out []string
	for _, t := range r.Targets {
		if t.Enforced && !t.Met {
			out = append(out, fmt.Sprintf("%s %.2f (want %s)", t.Name, t.Got, t.Want))
		}
	}
	return out
}

// defaultRun is the run without -sweep or -heap.
func (b *bench) defaultRun(ctx context.Context) (*report, error) {
	c := b.cfg
	r := &report{Redis: b.tgt.desc, KeyPrefix: b.prefix, Queue: b.queue, Machine: machine(), Elements: c.elements, Workers: c.workers, Procs: c.procs,
		BatchSize: c.batch, UndoLatencyMS: ms(c.undoLatency), WorkLatencyMS: ms(c.workLatency)}
	procs := "in this process"
	if c.procs > 0 {
		procs = fmt.Sprintf("in %d worker process(es)", min(c.procs, c.workers))
	}
	b.bar.note("%d elements, %d workers %s, batch %d, undo latency %v\n", c.elements, c.workers, procs, c.batch, c.undoLatency)

	var in, fan rollbackResult
	var fanRate float64
	var tpRun string
	err := b.withPool(ctx, b.spec(kindReactor, []int{c.batch, c.elements}), c.procs, func() error {
		var err error
		base := rollbackRun{n: c.elements, batch: c.batch, undo: c.undoLatency, heapEvery: 250 * time.Millisecond}
		inRun, fanRun := base, base
		inRun.label, fanRun.label, fanRun.fanOut = "inline map", "fan-out map", true
		if in, err = b.rollback(ctx, inRun); err != nil {
			return err
		}
		if fan, err = b.rollback(ctx, fanRun); err != nil {
			return err
		}
		fanRate, tpRun, err = b.fanOutThroughput(ctx, "fan-out throughput (no latency)", c.elements)
		return err
	})
	if err != nil {
		return nil, err
	}
	r.InlineSeconds, r.FanoutSeconds = seconds(in.Rollback), seconds(fan.Rollback)
	r.InlineForwardSeconds, r.FanoutForwardSeconds = seconds(in.Forward), seconds(fan.Forward)
	r.Speedup = r.InlineSeconds / r.FanoutSeconds
	r.MaxWaiting, r.MaxQueued = fan.MaxPending, fan.MaxQueued
	r.InlineRollbackHeapBytes, r.FanoutRollbackHeapBytes = in.HeapInuse, fan.HeapInuse
	// The workers have stopped: their counts are published.
	burst, err := b.checkBurst(ctx, "fan-out map", fan.Run, c.batch)
	if err != nil {
		return nil, err
	}
	r.MaxBurst, r.MaxBurstAction = burst.N, burst.Action
	b.checkWaiting("fan-out map", r.MaxWaiting, c.batch)
	if _, err := b.checkBurst(ctx, "fan-out throughput", tpRun, c.elements); err != nil {
		return nil, err
	}
	r.FanoutElementsPerSec = fanRate
	if err := b.versusBareAsynq(ctx, r); err != nil {
		return nil, err
	}

	// The same throughput with tracing on, owner and workers alike, against
	// tracing off: alternated rounds (a busy machine drifts), medians.
	var on, off []float64
	for range tracingRounds {
		for _, tr := range []bool{false, true} {
			rate, err := b.throughputRound(ctx, fmt.Sprintf("fan-out throughput, tracing %s", map[bool]string{false: "off", true: "on"}[tr]), tr)
			if err != nil {
				return nil, err
			}
			if tr {
				on = append(on, rate)
			} else {
				off = append(off, rate)
			}
		}
	}
	r.FanoutUntracedElementsPerSec, r.FanoutTracedElementsPerSec = median(off), median(on)

	took, err := b.bareRun(ctx, "bare asynq no-op tasks", c.elements, 0)
	if err != nil {
		return nil, err
	}
	r.AsynqBaselineTasksPerSec = float64(c.elements) / took.Seconds()
	r.BaselineRatio = r.FanoutElementsPerSec / r.AsynqBaselineTasksPerSec

	if err := b.throughputRounds(ctx, r); err != nil {
		return nil, err
	}

	rt, err := b.roundTrips(ctx)
	if err != nil {
		return nil, err
	}
	r.RoundtripsPerElementForward, r.RoundtripsPerElementRollback = rt.EngineForward, rt.EngineRollback
	r.AsynqRoundtripsPerElementForward, r.AsynqRoundtripsPerElementRollback = rt.AsynqForward, rt.AsynqRollback
	r.BareAsynqRoundtripsPerTask = rt.BareRTs
	r.RoundtripSizes = [2]int{rt.Small, rt.Large}
	r.RedisOtherClients = rt.OtherClients
	if rt.ServerCounts {
		r.RedisCmdsPerElementForward, r.RedisCmdsPerElementRollback, r.BareAsynqCmdsPerTask = &rt.CmdsForward, &rt.CmdsRollback, &rt.BareCmds
	}

	speedNote, rollbackNote, forwardNote := shapeNote(c, c.undoLatency), shapeNote(c, c.undoLatency), shapeNote(c, c.workLatency)
	r.Targets = []targetCheck{
		{Name: "speedup", Want: ">= 8", Got: r.Speedup, Met: r.Speedup >= 8, Note: speedNote, Enforced: speedNote == ""},
		{Name: "baseline_ratio", Want: ">= 0.33", Got: r.BaselineRatio, Met: r.BaselineRatio >= 0.33, Enforced: true},
		{Name: "roundtrips_per_element_forward", Want: "<= 3", Got: r.RoundtripsPerElementForward, Met: r.RoundtripsPerElementForward <= 3, Enforced: true},
		{Name: "roundtrips_per_element_rollback", Want: "<= 3 (one undone entry)", Got: r.RoundtripsPerElementRollback,
			Met: r.RoundtripsPerElementRollback <= 3, Enforced: true},
		{Name: "fanout_vs_bare_asynq_rollback", Want: "<= 1.05", Got: r.FanoutVsBareAsynqRollback, Met: r.FanoutVsBareAsynqRollback <= 1.05,
			Note: rollbackNote, Enforced: rollbackNote == ""},
		{Name: "fanout_vs_bare_asynq_forward", Want: "<= 1.05", Got: r.FanoutVsBareAsynqForward, Met: r.FanoutVsBareAsynqForward <= 1.05,
			Note: forwardNote, Enforced: forwardNote == ""},
		{Name: "throughput_ratio_of_medians", Want: ">= 0.6", Got: r.ThroughputRatioOfMedians, Met: r.ThroughputRatioOfMedians >= 0.6, Enforced: true},
	}
	b.mu.Lock()
	r.Failures = append([]string{}, b.failures...)
	b.mu.Unlock()
	r.OK = len(r.Failures) == 0
	return r, nil
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\ngoreactor bench: %d elements, %d workers, %d worker process(es), batch %d, undo latency %gms\n",
		r.Elements, r.Workers, r.Procs, r.BatchSize, r.UndoLatencyMS)
	fmt.Fprintf(w, "redis: %s\nmachine: %s\n\n", r.Redis, r.Machine)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	row("rollback of every element", "inline", "fan-out", "")
	row("  failure -> final status", fmt.Sprintf("%.2fs", r.InlineSeconds), fmt.Sprintf("%.2fs", r.FanoutSeconds), fmt.Sprintf("speedup %.1fx (ideal %d)", r.Speedup, r.Workers))
	row("  forward pass (for scale)", fmt.Sprintf("%.2fs", r.InlineForwardSeconds), fmt.Sprintf("%.2fs", r.FanoutForwardSeconds), "")
	row("  heap in use during rollback", mib(r.InlineRollbackHeapBytes), mib(r.FanoutRollbackHeapBytes), "this process, max after GC")
	row("  most tasks one action enqueued", "-", fmt.Sprintf("%d", r.MaxBurst), fmt.Sprintf("bound B = %d (%s)", r.BatchSize, r.MaxBurstAction))
	row("  max tasks waiting / queued", "-", fmt.Sprintf("%d / %d", r.MaxWaiting, r.MaxQueued), fmt.Sprintf("sampled; waiting bound B + B/2 = %d", waitingBound(r.BatchSize)))
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row = func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	row("throughput (no latency)", "per second", "")
	row("  bare asynq no-op tasks", fmt.Sprintf("%.0f", r.AsynqBaselineTasksPerSec), "same server configuration")
	row("  fan-out elements", fmt.Sprintf("%.0f", r.FanoutElementsPerSec), fmt.Sprintf("B = %d (one batch)", r.Elements))
	row("  ratio", fmt.Sprintf("%.2f", r.BaselineRatio), fmt.Sprintf("an element costs %.1f bare tasks", 1/r.BaselineRatio))
	row("  fan-out elements, tracing off / on", fmt.Sprintf("%.0f / %.0f", r.FanoutUntracedElementsPerSec, r.FanoutTracedElementsPerSec),
		fmt.Sprintf("on = %.2fx off (medians of %d alternated rounds; on: every span recorded and batched)",
			r.FanoutTracedElementsPerSec/r.FanoutUntracedElementsPerSec, tracingRounds))
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row = func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	row(fmt.Sprintf("throughput, %d alternated rounds", r.ThroughputRounds), "median", "min - max", "")
	fr, br, rr := r.FanoutElementsPerSecRounds, r.BareAsynqTasksPerSecRounds, r.ThroughputRatioRounds
	row("  fan-out elements per second", fmt.Sprintf("%.0f", fr.Median), fmt.Sprintf("%.0f - %.0f", fr.Min, fr.Max), "fresh pool and owner each round, B = elements")
	row("  bare asynq no-op tasks per second", fmt.Sprintf("%.0f", br.Median), fmt.Sprintf("%.0f - %.0f", br.Min, br.Max), "fresh pool each round")
	row("  ratio of medians", f2(r.ThroughputRatioOfMedians), fmt.Sprintf("%.2f - %.2f", rr.Min, rr.Max), "per round: that round's pair")
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row = func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	row("fan-out against bare asynq", "goreactor", "bare asynq", "fanout_vs_bare_asynq", "")
	row(fmt.Sprintf("  rollback: %d undos of %gms", r.Elements, r.UndoLatencyMS), fmt.Sprintf("%.2fs", r.FanoutSeconds),
		fmt.Sprintf("%.2fs", r.BareAsynqRollbackSeconds), f2(r.FanoutVsBareAsynqRollback), "failure -> final status; first enqueue -> queue empty")
	row(fmt.Sprintf("  forward: %d elements doing %gms", r.Elements, r.WorkLatencyMS), fmt.Sprintf("%.2fs", r.FanoutForwardWorkSeconds),
		fmt.Sprintf("%.2fs", r.BareAsynqForwardSeconds), f2(r.FanoutVsBareAsynqForward), "start -> completed; first enqueue -> queue empty")
	tw.Flush()
	fmt.Fprintf(w, "  (same tasks, %d workers in the same processes; bare asynq: one asynq.Client enqueue per task, a handler that only sleeps)\n", r.Workers)
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row = func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	row(fmt.Sprintf("per element (slope %d -> %d elements)", r.RoundtripSizes[0], r.RoundtripSizes[1]), "forward", "rollback", "")
	row("  goreactor round trips", f2(r.RoundtripsPerElementForward), f2(r.RoundtripsPerElementRollback), "engine client; one undone entry per element")
	row("  asynq round trips", f2(r.AsynqRoundtripsPerElementForward), f2(r.AsynqRoundtripsPerElementRollback),
		fmt.Sprintf("bare asynq task: %.2f", r.BareAsynqRoundtripsPerTask))
	if r.RedisCmdsPerElementForward != nil {
		row("  Redis commands (server side)", f2(*r.RedisCmdsPerElementForward), f2(*r.RedisCmdsPerElementRollback),
			fmt.Sprintf("INFO commandstats; bare asynq task: %.2f", *r.BareAsynqCmdsPerTask))
	} else {
		row("  Redis commands (server side)", "n/a", "n/a", "no INFO commandstats on this Redis")
	}
	tw.Flush()
	if r.RedisOtherClients > 0 && r.RedisCmdsPerElementForward != nil {
		fmt.Fprintf(w, "  (%d other client(s) were connected to this Redis: the command counts include their traffic)\n", r.RedisOtherClients)
	}
	fmt.Fprintln(w)
	printTargets(w, r.Targets)
	if r.OK {
		fmt.Fprintln(w, "\ncorrectness: every element undone exactly once on both sides; both runs failed with their rollback complete; back pressure held")
	} else {
		fmt.Fprintf(w, "\ncorrectness: %d WRONG RESULT(S)\n", len(r.Failures))
	}
}

func printTargets(w io.Writer, ts []targetCheck) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "target\twant\tgot\t")
	for _, t := range ts {
		met := "met"
		if !t.Met {
			met = "MISSED"
		}
		if t.Note != "" {
			met += " (" + t.Note + ")"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%.2f\t%s\n", t.Name, t.Want, t.Got, met)
	}
	tw.Flush()
}

func f2(v float64) string { return fmt.Sprintf("%.2f", v) }

func mib(b uint64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// tracingRounds is how many times the throughput is measured with tracing
// off and on, alternately.
const tracingRounds = 3

// throughputRound measures the fan-out throughput on a fresh pool (and
// owner) with tracing on or off.
func (b *bench) throughputRound(ctx context.Context, label string, traced bool) (rate float64, err error) {
	spec := b.spec(kindReactor, []int{b.cfg.batch, b.cfg.elements})
	spec.Traced = traced
	err = b.withPool(ctx, spec, b.cfg.procs, func() error {
		owner, err := newHost(ctx, spec, b.owner, b.owner, nil, b.bursts)
		if err != nil {
			return err
		}
		defer owner.close()
		main := b.host
		b.host = owner
		defer func() { b.host = main }()
		rate, _, err = b.fanOutThroughput(ctx, label, b.cfg.elements)
		return err
	})
	return rate, err
}

// shapeNote is "" when the run has the shape the timing targets are set
// for (10 workers, 2,000 elements, latency 10 ms per element), else the
// note saying that the target is not enforced.
func shapeNote(c config, latency time.Duration) string {
	if c.workers != 10 || latency != 10*time.Millisecond || c.elements != 2000 {
		return "the target is set for 10 workers, 10 ms, 2,000 elements: not enforced"
	}
	return ""
}
