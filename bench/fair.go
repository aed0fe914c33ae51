package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// The -fair run: the fairness figure. Two tenants share one limit
// of -limit slots (10 by default in this mode) over -workers worker slots:
// a big tenant's fan-out map of -fair elements fills the limit, and a
// small tenant's map of -fair-small elements (10) arrives while it runs.
// The small map's time (its owner's start to its completion) is measured
// alone first, then while the big map runs, -fair-rounds times each
// (medians compared); once with the limit declared Fair (keyed by
// tenant) and once with a plain limit of one key for all, the control.
// The target: with Fair, the small tenant's time under load within 2x of
// its time alone. It fails (exit 1) when the limit's slots ever hold more
// than -limit, or an element does not run exactly once.

const (
	fairOwnerName   = "bench.fair"
	fairElementName = "bench.fair.element"
	fairTarget      = 2.0
)

type fairItem struct {
	Tenant string `json:"tenant"`
	N      int    `json:"n"`
}

type fairIn struct {
	Item   fairItem `json:"item"`
	WorkNS int64    `json:"work_ns"`
}

// fairWorld counts what the elements do.
type fairWorld struct {
	inFlight, maxInFlight atomic.Int64
	ran                   map[string][]atomic.Int32 // per tenant, per item
}

func (w *fairWorld) work(ctx context.Context, in fairIn) (int, error) {
	n := w.inFlight.Add(1)
	for {
		m := w.maxInFlight.Load()
		if n <= m || w.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	err := sleep(ctx, time.Duration(in.WorkNS))
	w.inFlight.Add(-1)
	if err != nil {
		return 0, err
	}
	if r := w.ran[in.Item.Tenant]; in.Item.N >= 0 && in.Item.N < len(r) {
		r[in.Item.N].Add(1)
	}
	return in.Item.N, nil
}

// definitions is the element (one step under the limit name, Fair or
// not) and its owner (a fan-out map over "items").
func (w *fairWorld) definitions(name string, limit, batch int, fair bool) (owner, element *reactor.Definition, err error) {
	l := reactor.Limit{Name: name, Concurrency: limit}
	if fair {
		l.Fair = true
		l.Key = func(a reactor.Args) (string, error) {
			it, err := reactor.Arg[fairItem](a, "item")
			return it.Tenant, err
		}
	}
	element, err = reactor.Define(fairElementName+"."+name,
		reactor.Input[fairItem]("item", reactor.Required()),
		reactor.Input[int64]("work_ns", reactor.Default[int64](0)),
		reactor.Step("work", reactor.StepConfig[fairIn, int]{
			Args:   reactor.Bindings{"item": reactor.FromInput("item"), "work_ns": reactor.FromInput("work_ns")},
			Limits: []reactor.Limit{l},
			Run:    w.work,
		}),
	)
	if err != nil {
		return nil, nil, err
	}
	owner, err = reactor.Define(fairOwnerName+"."+name,
		reactor.Input[[]fairItem]("items", reactor.Required()),
		reactor.Input[int64]("work_ns", reactor.Default[int64](0)),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true, BatchSize: batch,
			With: reactor.Bindings{"work_ns": reactor.FromInput("work_ns")}}),
	)
	return owner, element, err
}

// fairReport is the -fair run's result.
type fairReport struct {
	Redis      string `json:"redis"`
	KeyPrefix  string `json:"key_prefix"`
	Queue      string `json:"queue"`
	Machine    string `json:"machine"`
	Big        int    `json:"big_elements"`
	Small      int    `json:"small_elements"`
	Limit      int    `json:"limit"`
	ElementMS  int    `json:"element_ms"`
	Workers    int    `json:"workers"`
	WorkerSets int    `json:"worker_sets"`
	Batch      int    `json:"batch"`
	Rounds     int    `json:"rounds"`

	Fair  fairCase `json:"fair"`
	Plain fairCase `json:"plain"`

	MaxInFlight int      `json:"max_in_flight_in_process"`
	OK          bool     `json:"ok"`
	Failures    []string `json:"check_failures"`
}

// fairCase is one limit's figures: the small map's times alone and under
// the big map, in ms, and the ratio of their medians.
type fairCase struct {
	AloneMS      []float64 `json:"alone_ms"`
	LoadedMS     []float64 `json:"under_load_ms"`
	AloneMedian  float64   `json:"alone_median_ms"`
	LoadedMedian float64   `json:"under_load_median_ms"`
	Ratio        float64   `json:"ratio"`
	// BigSeconds is the big map's time, start to completion.
	BigSeconds float64 `json:"big_seconds"`
	// MaxHeld is the most holders of the limit's slots seen in Redis.
	MaxHeld int `json:"max_held_redis"`
}

func (r *fairReport) missed() []string {
	if r.Fair.Ratio > fairTarget {
		return []string{fmt.Sprintf("fair_small_tenant_ratio (got %.2f, want <= %.1f)", r.Fair.Ratio, fairTarget)}
	}
	return nil
}

func (r *fairReport) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "fair share: a big tenant's map of %d elements and a small tenant's of %d under one limit of %d, %d ms each, %d workers in %d worker.Worker(s), batch %d, %d rounds\n",
		r.Big, r.Small, r.Limit, r.ElementMS, r.Workers, r.WorkerSets, r.Batch, r.Rounds)
	fmt.Fprintf(tw, "redis\t%s\n", r.Redis)
	fmt.Fprintf(tw, "machine\t%s\n", r.Machine)
	for _, c := range []struct {
		name string
		c    fairCase
	}{{"Fair (keyed by tenant)", r.Fair}, {"plain (one key, the control)", r.Plain}} {
		fmt.Fprintf(tw, "%s: small map alone, median (each)\t%.0f ms %v\n", c.name, c.c.AloneMedian, c.c.AloneMS)
		fmt.Fprintf(tw, "%s: small map under the big one, median (each)\t%.0f ms %v\n", c.name, c.c.LoadedMedian, c.c.LoadedMS)
		fmt.Fprintf(tw, "%s: under load / alone\t%.2f\n", c.name, c.c.Ratio)
		fmt.Fprintf(tw, "%s: big map, start to completed\t%.2f s\n", c.name, c.c.BigSeconds)
		fmt.Fprintf(tw, "%s: most holders in Redis\t%d\t(limit %d)\n", c.name, c.c.MaxHeld, r.Limit)
	}
	fmt.Fprintf(tw, "target: Fair's under load / alone\t<= %.1f\n", fairTarget)
	fmt.Fprintf(tw, "max in flight in-process\t%d\n", r.MaxInFlight)
	ok := "ok"
	if !r.OK {
		ok = "FAILED"
	}
	fmt.Fprintf(tw, "checks\t%s\n", ok)
	for _, f := range r.Failures {
		fmt.Fprintf(tw, "  \t%s\n", f)
	}
	_ = tw.Flush()
}

// fairRun is the -fair run.
func (b *bench) fairRun(ctx context.Context) (*fairReport, error) {
	c := b.cfg
	r := &fairReport{Redis: b.tgt.desc, KeyPrefix: b.prefix, Queue: b.queue, Machine: machine(), Big: c.fair, Small: c.fairSmall, Limit: c.limit,
		ElementMS: int(c.elementWork / time.Millisecond), Workers: c.workers, WorkerSets: min(c.workerSets, c.workers),
		Batch: c.batch, Rounds: c.fairRounds}
	var err error
	if r.Fair, err = b.fairCase(ctx, r, true); err != nil {
		return nil, err
	}
	if r.Plain, err = b.fairCase(ctx, r, false); err != nil {
		return nil, err
	}
	b.mu.Lock()
	r.Failures = append([]string(nil), b.failures...)
	b.mu.Unlock()
	r.OK = len(r.Failures) == 0
	return r, nil
}

// fairCase measures one limit: Fair (keyed by tenant) or plain.
func (b *bench) fairCase(ctx context.Context, r *fairReport, fair bool) (fairCase, error) {
	c := b.cfg
	var out fairCase
	name := "bench-plain"
	if fair {
		name = "bench-fair"
	}
	rounds := c.fairRounds
	w := &fairWorld{ran: map[string][]atomic.Int32{"big": make([]atomic.Int32, c.fair)}}
	for i := range 2 * rounds {
		w.ran[fmt.Sprintf("small-%d", i)] = make([]atomic.Int32, c.fairSmall)
	}
	owner, element, err := w.definitions(name, c.limit, c.batch, fair)
	if err != nil {
		return out, err
	}
	quiet := slog.New(slog.DiscardHandler)
	newEngine := func(rdb redis.UniversalClient) (*reactor.Engine, error) {
		e, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: b.prefix, Enqueuer: worker.NewClient(rdb, b.queue), Logger: quiet})
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		return e, e.Register(owner, element)
	}
	oe, err := newEngine(b.owner)
	if err != nil {
		return out, err
	}
	stopWorkers, err := b.workerSets(ctx, r.WorkerSets, newEngine)
	if err != nil {
		return out, err
	}
	defer stopWorkers()
	k := keys.New(b.prefix)
	slots := k.Slots(name, "")
	if fair {
		slots = k.Fair(name)
	}
	// The sampler: the limit's holders in Redis, every millisecond.
	var maxHeld atomic.Int64
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
			if n, err := b.admin.ZCard(sctx, slots).Result(); err == nil && n > maxHeld.Load() {
				maxHeld.Store(n)
			}
		}
	}()
	stop := sync.OnceFunc(func() { stopSampling(); <-sampled })
	defer stop()

	items := func(tenant string, n int) []fairItem {
		its := make([]fairItem, n)
		for i := range its {
			its[i] = fairItem{Tenant: tenant, N: i}
		}
		return its
	}
	runSmall := func(round int) (float64, error) {
		id := fmt.Sprintf("fair-%s-small-%d-%s", name, round, shortID())
		start := time.Now()
		_, err := oe.Run(ctx, owner, map[string]any{"items": items(fmt.Sprintf("small-%d", round), c.fairSmall), "work_ns": int64(c.elementWork)},
			reactor.WithRunID(id))
		var run *reactor.Run
		if err == nil {
			run, err = awaitRun(ctx, oe, id)
		}
		if err != nil {
			return 0, err
		}
		if run.Status != reactor.StatusCompleted {
			b.fail(fmt.Sprintf("small map %s ended %s, want completed", id, run.Status))
		}
		return ms(time.Since(start)), nil
	}
	b.bar.note("fair (%s): the small map alone, %d rounds\n", name, rounds)
	for i := range rounds {
		d, err := runSmall(i)
		if err != nil {
			return out, err
		}
		out.AloneMS = append(out.AloneMS, d)
	}
	b.bar.note("fair (%s): the big map of %d, and the small one %d times under it\n", name, c.fair, rounds)
	bigID := fmt.Sprintf("fair-%s-big-%s", name, shortID())
	bigStart := time.Now()
	if _, err := oe.Run(ctx, owner, map[string]any{"items": items("big", c.fair), "work_ns": int64(c.elementWork)},
		reactor.WithRunID(bigID), reactor.NoWait()); err != nil {
		return out, err
	}
	// Under load: once the big map holds every slot.
	var most int64
	for deadline := time.Now().Add(30 * time.Second); ; {
		n, err := b.admin.ZCard(ctx, slots).Result()
		if err != nil {
			return out, fmt.Errorf("fair: read the limit's holders: %w", err)
		}
		if most = max(most, n); int(n) >= c.limit {
			break
		}
		run, err := oe.Get(ctx, bigID)
		if err != nil {
			return out, err
		}
		if run.Status.Terminal() || time.Now().After(deadline) {
			return out, fmt.Errorf("fair: the big map never filled the limit of %d (%s held %d at most; the map is %s)", c.limit, slots, most, run.Status)
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return out, err
		}
	}
	for i := range rounds {
		d, err := runSmall(rounds + i)
		if err != nil {
			return out, err
		}
		out.LoadedMS = append(out.LoadedMS, d)
	}
	if run, err := oe.Get(ctx, bigID); err == nil && run.Status.Terminal() {
		b.fail("the big map ended before the small ones under it did: they did not run under load (raise -fair)")
	}
	big, err := awaitRun(ctx, oe, bigID)
	if err != nil {
		return out, err
	}
	out.BigSeconds = seconds(time.Since(bigStart))
	if big.Status != reactor.StatusCompleted {
		b.fail(fmt.Sprintf("big map %s ended %s, want completed", bigID, big.Status))
	}
	median := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
	}
	out.AloneMedian, out.LoadedMedian = median(out.AloneMS), median(out.LoadedMS)
	if out.AloneMedian > 0 {
		out.Ratio = out.LoadedMedian / out.AloneMedian
	}
	for i := range out.AloneMS {
		out.AloneMS[i] = float64(int(out.AloneMS[i]))
	}
	for i := range out.LoadedMS {
		out.LoadedMS[i] = float64(int(out.LoadedMS[i]))
	}
	stop()
	out.MaxHeld = int(maxHeld.Load())
	if out.MaxHeld > c.limit {
		b.fail(fmt.Sprintf("%s: the limit's slots reached %d holders, over the limit of %d", name, out.MaxHeld, c.limit))
	}
	r.MaxInFlight = max(r.MaxInFlight, int(w.maxInFlight.Load()))
	if int(w.maxInFlight.Load()) > c.limit {
		b.fail(fmt.Sprintf("%s: %d element steps ran at once, over the limit of %d", name, w.maxInFlight.Load(), c.limit))
	}
	for tenant, ran := range w.ran {
		for i := range ran {
			if n := ran[i].Load(); n != 1 {
				b.fail(fmt.Sprintf("%s: tenant %s element %d ran %d times, want once", name, tenant, i, n))
				break
			}
		}
	}
	return out, nil
}
