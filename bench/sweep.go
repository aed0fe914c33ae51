package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"
)

// sweepReport is the -sweep run's result.
type sweepReport struct {
	Redis         string       `json:"redis"`
	KeyPrefix     string       `json:"key_prefix"`
	Queue         string       `json:"queue"`
	Machine       string       `json:"machine"`
	Elements      int          `json:"elements"`
	Procs         int          `json:"procs"`
	BatchSize     int          `json:"batch_size"`
	UndoLatencyMS float64      `json:"undo_latency_ms"`
	InlineSeconds float64      `json:"inline_seconds"`
	Points        []sweepPoint `json:"points"`
	Plot          string       `json:"plot,omitempty"`
	OK            bool         `json:"ok"`
	Failures      []string     `json:"check_failures"`
}

type sweepPoint struct {
	Workers              int     `json:"workers"`
	FanoutSeconds        float64 `json:"fanout_seconds"`
	FanoutForwardSeconds float64 `json:"fanout_forward_seconds"`
	Speedup              float64 `json:"speedup"`
	Ideal                float64 `json:"ideal"`
	// Efficiency is speedup / ideal.
	Efficiency float64 `json:"efficiency"`
	// MaxBurst is the most tasks one action enqueued (bound: B);
	// MaxWaiting the most tasks seen waiting in the queue (bound: B + B/2).
	MaxBurst   int `json:"max_burst"`
	MaxWaiting int `json:"max_waiting"`
}

// sweepRun rolls the inline map back once (its time does not depend on the
// workers: it runs where the owner runs), then the fan-out map once per
// worker count, restarting the workers with that concurrency each time.
func (b *bench) sweepRun(ctx context.Context) (*sweepReport, error) {
	c := b.cfg
	r := &sweepReport{Redis: b.tgt.desc, KeyPrefix: b.prefix, Queue: b.queue, Machine: machine(), Elements: c.elements, Procs: c.procs, BatchSize: c.batch,
		UndoLatencyMS: ms(c.undoLatency), Plot: c.plot}
	b.bar.note("sweep: %d elements, batch %d, undo latency %v, workers %v\n", c.elements, c.batch, c.undoLatency, c.sweepWorkers)
	base := rollbackRun{n: c.elements, batch: c.batch, undo: c.undoLatency}
	inRun := base
	inRun.label = "inline map"
	// The inline owner runs in this process; no worker is involved.
	in, err := b.rollback(ctx, inRun)
	if err != nil {
		return nil, err
	}
	r.InlineSeconds = seconds(in.Rollback)
	for _, w := range c.sweepWorkers {
		fanRun := base
		fanRun.fanOut, fanRun.label = true, fmt.Sprintf("fan-out map, %d workers", w)
		spec := b.spec(kindReactor, []int{c.batch})
		spec.Concurrency = w
		var fan rollbackResult
		err := b.withPool(ctx, spec, c.procs, func() error {
			var err error
			fan, err = b.rollback(ctx, fanRun)
			return err
		})
		if err != nil {
			return nil, err
		}
		burst, err := b.checkBurst(ctx, fanRun.label, fan.Run, c.batch)
		if err != nil {
			return nil, err
		}
		b.checkWaiting(fanRun.label, fan.MaxPending, c.batch)
		s := r.InlineSeconds / seconds(fan.Rollback)
		r.Points = append(r.Points, sweepPoint{Workers: w, FanoutSeconds: seconds(fan.Rollback), FanoutForwardSeconds: seconds(fan.Forward),
			Speedup: s, Ideal: float64(w), Efficiency: s / float64(w), MaxBurst: burst.N, MaxWaiting: fan.MaxPending})
	}
	if c.plot != "" {
		if err := os.WriteFile(c.plot, []byte(sweepSVG(r)), 0o644); err != nil {
			return nil, fmt.Errorf("write the chart: %w", err)
		}
	}
	b.mu.Lock()
	r.Failures = append([]string{}, b.failures...)
	b.mu.Unlock()
	r.OK = len(r.Failures) == 0
	return r, nil
}

func (r *sweepReport) print(w io.Writer) {
	fmt.Fprintf(w, "\ngoreactor bench -sweep: %d elements, %d worker process(es), batch %d, undo latency %gms\n",
		r.Elements, r.Procs, r.BatchSize, r.UndoLatencyMS)
	fmt.Fprintf(w, "redis: %s\nmachine: %s\n", r.Redis, r.Machine)
	fmt.Fprintf(w, "inline rollback: %.2fs (%s per element)\n\n", r.InlineSeconds,
		(time.Duration(r.InlineSeconds*float64(time.Second)) / time.Duration(r.Elements)).Round(10*time.Microsecond))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workers\tfan-out rollback\tspeedup\tideal\tefficiency\tmax burst\tmax waiting\t")
	for _, p := range r.Points {
		fmt.Fprintf(tw, "%d\t%.2fs\t%.1fx\t%.0fx\t%.0f%%\t%d\t%d\t\n", p.Workers, p.FanoutSeconds, p.Speedup, p.Ideal, 100*p.Efficiency, p.MaxBurst, p.MaxWaiting)
	}
	tw.Flush()
	if r.Plot != "" {
		fmt.Fprintf(w, "\nchart: %s\n", r.Plot)
	}
	if !r.OK {
		fmt.Fprintf(w, "\ncorrectness: %d WRONG RESULT(S)\n", len(r.Failures))
	}
}
