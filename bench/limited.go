package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
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

// The -limited run: one fan-out map over -limited elements whose element
// step declares a concurrency limit of -limit (StepConfig.Limits) and
// sleeps -element-ms, on -workers worker slots split between -worker-sets
// worker.Worker instances in this process (each with its engine and Redis
// client, as separate processes would have). The ideal rate is
// limit x 1000 / element-ms elements a second (2,000/s at 20 and 10 ms).
// It samples the limit's sorted set (ZCARD: the slots held, the ground
// truth in Redis) and asynq's retry set (snoozed tasks) every millisecond,
// counts the steps running in-process exactly, and the limit events of
// every engine with a Hook. It fails (exit 1) when either count of holders
// ever exceeds the limit, or an element did not run exactly once; a rate
// under 90 % of the ideal is a missed target.

const (
	limitedOwnerName   = "bench.limited"
	limitedElementName = "bench.limited.element"
	limitedName        = "bench-limited"
	limitedTarget      = 0.9
)

// limitedIn is the limited element step's arguments.
type limitedIn struct {
	Item   int   `json:"item"`
	WorkNS int64 `json:"work_ns"`
}

// limitedWorld counts what the limited run's steps and engines do.
type limitedWorld struct {
	inFlight, maxInFlight atomic.Int64
	done                  atomic.Int64
	runNS                 atomic.Int64   // the steps' time in Run, summed
	ran                   []atomic.Int32 // per item: times its step ran

	waited, refused, taken atomic.Int64
	mu                     sync.Mutex
	firstTaken, lastDone   time.Time
	refusedAfter           []time.Duration // RetryAfter of each refusal
	firstWait              map[string]time.Time
	waitingNow             map[string]bool // attempts waiting in-process for a slot now
	waiting                atomic.Int64    // len(waitingNow)
	waits                  []time.Duration // first wait to take, per attempt that waited
}

func (w *limitedWorld) work(ctx context.Context, in limitedIn) (int, error) {
	n := w.inFlight.Add(1)
	for {
		m := w.maxInFlight.Load()
		if n <= m || w.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	began := time.Now()
	err := sleep(ctx, time.Duration(in.WorkNS))
	w.runNS.Add(int64(time.Since(began)))
	w.inFlight.Add(-1)
	if err != nil {
		return 0, err
	}
	if in.Item >= 0 && in.Item < len(w.ran) {
		w.ran[in.Item].Add(1)
	}
	w.done.Add(1)
	w.mu.Lock()
	w.lastDone = time.Now()
	w.mu.Unlock()
	return in.Item, nil
}

// OnEvent counts the limit events of every engine of the run.
func (w *limitedWorld) OnEvent(_ context.Context, e reactor.Event) {
	switch e.Kind {
	case reactor.EventLimitWaited:
		w.waited.Add(1)
		w.mu.Lock()
		if _, ok := w.firstWait[e.RunID]; !ok {
			w.firstWait[e.RunID] = time.Now()
		}
		if !w.waitingNow[e.RunID] {
			w.waitingNow[e.RunID] = true
			w.waiting.Add(1)
		}
		w.mu.Unlock()
	case reactor.EventLimitRefused:
		w.refused.Add(1)
		var le *reactor.LimitError
		w.mu.Lock()
		if errors.As(e.Err, &le) {
			w.refusedAfter = append(w.refusedAfter, le.RetryAfter)
		}
		w.notWaiting(e.RunID)
		w.mu.Unlock()
	case reactor.EventLimitTaken:
		w.taken.Add(1)
		now := time.Now()
		w.mu.Lock()
		if w.firstTaken.IsZero() {
			w.firstTaken = now
		}
		w.notWaiting(e.RunID)
		if t, ok := w.firstWait[e.RunID]; ok {
			w.waits = append(w.waits, now.Sub(t))
			delete(w.firstWait, e.RunID)
		}
		w.mu.Unlock()
	}
}

func (w *limitedWorld) notWaiting(id string) {
	if w.waitingNow[id] {
		delete(w.waitingNow, id)
		w.waiting.Add(-1)
	}
}

// limitedDefinitions is the element (one limited step) and its owner (a
// fan-out map of it over [0, n)).
func (w *limitedWorld) definitions(limit, batch int) (owner, element *reactor.Definition, err error) {
	element, err = reactor.Define(limitedElementName,
		reactor.Input[int]("item", reactor.Required()),
		reactor.Input[int]("n", reactor.Required()),
		reactor.Input[int64]("work_ns", reactor.Default[int64](0)),
		reactor.Step("work", reactor.StepConfig[limitedIn, int]{
			Args:   reactor.Bindings{"item": reactor.FromInput("item"), "work_ns": reactor.FromInput("work_ns")},
			Limits: []reactor.Limit{{Name: limitedName, Concurrency: limit}},
			Run:    w.work,
		}),
		reactor.Returns(reactor.FromStep("work")),
	)
	if err != nil {
		return nil, nil, err
	}
	owner, err = reactor.Define(limitedOwnerName,
		reactor.Input[int]("n", reactor.Required()),
		reactor.Input[int64]("work_ns", reactor.Default[int64](0)),
		mapstep.Map(mapStep, mapstep.Config{
			Element:   element,
			Pages:     rangeSource{},
			With:      reactor.Bindings{"n": reactor.FromInput("n"), "work_ns": reactor.FromInput("work_ns")},
			FanOut:    true,
			BatchSize: batch,
		}),
	)
	return owner, element, err
}

// limitedReport is the -limited run's result.
type limitedReport struct {
	Redis      string `json:"redis"`
	KeyPrefix  string `json:"key_prefix"`
	Queue      string `json:"queue"`
	Machine    string `json:"machine"`
	Elements   int    `json:"elements"`
	Limit      int    `json:"limit"`
	ElementMS  int    `json:"element_ms"`
	Workers    int    `json:"workers"`
	WorkerSets int    `json:"worker_sets"`
	Batch      int    `json:"batch"`

	// Elapsed: the owner's start to the run's completion; Elements (the
	// element phase): the first slot taken to the last element done.
	ElapsedSeconds  float64 `json:"elapsed_seconds"`
	ElementsSeconds float64 `json:"element_phase_seconds"`
	PerSecond       float64 `json:"elements_per_second"`
	PhasePerSecond  float64 `json:"element_phase_per_second"`
	IdealPerSecond  float64 `json:"ideal_per_second"`
	Ratio           float64 `json:"ratio_to_ideal"`
	PhaseRatio      float64 `json:"element_phase_ratio_to_ideal"`

	MaxInFlightRedis      int      `json:"max_in_flight_redis"`
	MaxInFlightProc       int      `json:"max_in_flight_in_process"`
	MeanHeldRedis         float64  `json:"mean_slots_held_redis"`
	IdleSlotShare         float64  `json:"idle_slot_share"`
	FullSampleShare       float64  `json:"full_sample_share"`
	Samples               int      `json:"samples"`
	IdleWhileWaitingShare float64  `json:"samples_idle_while_waiting_share"`
	IdleSlotsWhileWaiting float64  `json:"idle_slot_share_while_waiting"`
	MeanWaiting           float64  `json:"mean_attempts_waiting"`
	MeanHoldMS            float64  `json:"mean_slot_hold_ms"`
	MeanRunMS             float64  `json:"mean_run_ms"`
	MaxSnoozed            int      `json:"max_snoozed_tasks"`
	Waited                int64    `json:"limit_waits"`
	Refused               int64    `json:"limit_refusals"`
	Taken                 int64    `json:"limit_takes"`
	RetryAfterMedian      float64  `json:"refusal_retry_after_median_ms"`
	WaitedAttempts        int      `json:"attempts_that_waited"`
	WaitToTakeMedian      float64  `json:"wait_to_take_median_ms"`
	WaitToTakeP99         float64  `json:"wait_to_take_p99_ms"`
	WaitToTakeMax         float64  `json:"wait_to_take_max_ms"`
	RanOnce               int      `json:"elements_run_once"`
	OK                    bool     `json:"ok"`
	Failures              []string `json:"check_failures"`
}

func (r *limitedReport) missed() []string {
	if r.Ratio < limitedTarget {
		return []string{fmt.Sprintf("limited_ratio_to_ideal (got %.2f, want >= %.2f)", r.Ratio, limitedTarget)}
	}
	return nil
}

func (r *limitedReport) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "limited fan-out map: %d elements, limit %d, %d ms each, %d workers in %d worker.Worker(s), batch %d\n",
		r.Elements, r.Limit, r.ElementMS, r.Workers, r.WorkerSets, r.Batch)
	fmt.Fprintf(tw, "redis\t%s\n", r.Redis)
	fmt.Fprintf(tw, "machine\t%s\n", r.Machine)
	fmt.Fprintf(tw, "elapsed (start to completed)\t%.2f s\n", r.ElapsedSeconds)
	fmt.Fprintf(tw, "element phase (first take to last done)\t%.2f s\n", r.ElementsSeconds)
	fmt.Fprintf(tw, "elements/s (elapsed / element phase)\t%.0f / %.0f\n", r.PerSecond, r.PhasePerSecond)
	fmt.Fprintf(tw, "ideal (limit x 1000 / element-ms)\t%.0f/s\n", r.IdealPerSecond)
	fmt.Fprintf(tw, "achieved / ideal (elapsed / element phase)\t%.3f / %.3f\t(target >= %.2f)\n", r.Ratio, r.PhaseRatio, limitedTarget)
	fmt.Fprintf(tw, "max in flight: redis ZCARD / in-process\t%d / %d\t(limit %d)\n", r.MaxInFlightRedis, r.MaxInFlightProc, r.Limit)
	fmt.Fprintf(tw, "slots held, mean (element phase, %d samples)\t%.1f of %d; idle share %.1f %%; samples full %.1f %%\n",
		r.Samples, r.MeanHeldRedis, r.Limit, 100*r.IdleSlotShare, 100*r.FullSampleShare)
	fmt.Fprintf(tw, "attempts waiting in-process, mean\t%.1f\n", r.MeanWaiting)
	fmt.Fprintf(tw, "samples with a slot idle while an attempt waits\t%.1f %% (%.1f %% of slot time idle while someone waits)\n",
		100*r.IdleWhileWaitingShare, 100*r.IdleSlotsWhileWaiting)
	fmt.Fprintf(tw, "mean slot hold (mean held / phase rate) / mean Run\t%.2f / %.2f ms\n", r.MeanHoldMS, r.MeanRunMS)
	fmt.Fprintf(tw, "limit events: waits / refusals (= snoozes) / takes\t%d / %d / %d\n", r.Waited, r.Refused, r.Taken)
	fmt.Fprintf(tw, "refusals' RetryAfter, median\t%.0f ms\n", r.RetryAfterMedian)
	fmt.Fprintf(tw, "snoozed tasks at once (asynq retry set), max\t%d\n", r.MaxSnoozed)
	fmt.Fprintf(tw, "attempts that waited: first wait to take, median / p99 / max\t%d: %.0f / %.0f / %.0f ms\n",
		r.WaitedAttempts, r.WaitToTakeMedian, r.WaitToTakeP99, r.WaitToTakeMax)
	fmt.Fprintf(tw, "elements run exactly once\t%d of %d\n", r.RanOnce, r.Elements)
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

// limitedSample is one sample of the limit's holders and the snoozed tasks.
type limitedSample struct {
	at            time.Time
	held, snoozed int
	waiting       int
}

// limitedRun is the -limited run.
func (b *bench) limitedRun(ctx context.Context) (*limitedReport, error) {
	c := b.cfg
	n := c.limited
	r := &limitedReport{Redis: b.tgt.desc, KeyPrefix: b.prefix, Queue: b.queue, Machine: machine(), Elements: n, Limit: c.limit,
		ElementMS: int(c.elementWork / time.Millisecond), Workers: c.workers, WorkerSets: min(c.workerSets, c.workers), Batch: c.batch}
	r.IdealPerSecond = float64(c.limit) * float64(time.Second) / float64(c.elementWork)
	b.bar.note("limited: %d elements, limit %d, %v each, %d workers in %d worker.Worker(s)\n", n, c.limit, c.elementWork, c.workers, r.WorkerSets)
	w := &limitedWorld{ran: make([]atomic.Int32, n), firstWait: map[string]time.Time{}, waitingNow: map[string]bool{}}
	owner, element, err := w.definitions(c.limit+c.limitSlack, c.batch)
	if err != nil {
		return nil, err
	}
	quiet := slog.New(slog.DiscardHandler)
	newEngine := func(rdb redis.UniversalClient) (*reactor.Engine, error) {
		e, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: b.prefix, Enqueuer: worker.NewClient(rdb, b.queue),
			Logger: quiet, Hooks: []reactor.Hook{w}})
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		return e, e.Register(owner, element)
	}
	oe, err := newEngine(b.owner)
	if err != nil {
		return nil, err
	}
	stopWorkers, err := b.workerSets(ctx, r.WorkerSets, newEngine)
	if err != nil {
		return nil, err
	}
	defer stopWorkers()

	// The sampler: ZCARD of the limit's slots and of asynq's retry set,
	// one pipelined round trip every millisecond.
	slots := keys.New(b.prefix).Slots(limitedName, "")
	retry := "asynq:{" + b.queue + "}:retry"
	var samples []limitedSample
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
			p := b.admin.Pipeline()
			h, s := p.ZCard(sctx, slots), p.ZCard(sctx, retry)
			if _, err := p.Exec(sctx); err != nil {
				continue
			}
			samples = append(samples, limitedSample{at: time.Now(), held: int(h.Val()), snoozed: int(s.Val()), waiting: int(w.waiting.Load())})
		}
	}()
	stopBar := b.bar.track("limited map", func(ctx context.Context) (string, int, int) {
		return "forward", int(w.done.Load()), n
	})
	id := "lim-" + shortID()
	start := time.Now()
	_, err = oe.Run(ctx, owner, map[string]any{"n": n, "work_ns": int64(c.elementWork)}, reactor.WithRunID(id))
	var run *reactor.Run
	if err == nil {
		run, err = awaitRun(ctx, oe, id)
	}
	elapsed := time.Since(start)
	stopBar()
	stopSampling()
	<-sampled
	if err != nil {
		return nil, err
	}
	if run.Status != reactor.StatusCompleted {
		b.fail(fmt.Sprintf("run %s ended %s, want completed", id, run.Status))
	}

	r.ElapsedSeconds = seconds(elapsed)
	r.PerSecond = float64(w.done.Load()) / elapsed.Seconds()
	r.Ratio = r.PerSecond / r.IdealPerSecond
	w.mu.Lock()
	first, last := w.firstTaken, w.lastDone
	refusedAfter, waits := w.refusedAfter, w.waits
	w.mu.Unlock()
	if phase := last.Sub(first); phase > 0 {
		r.ElementsSeconds = seconds(phase)
		r.PhasePerSecond = float64(w.done.Load()) / phase.Seconds()
		r.PhaseRatio = r.PhasePerSecond / r.IdealPerSecond
	}
	r.MaxInFlightProc = int(w.maxInFlight.Load())
	held, full, idleWaited, idleWaitedSlots, waiting := 0, 0, 0, 0, 0
	for _, s := range samples {
		r.MaxInFlightRedis = max(r.MaxInFlightRedis, s.held)
		r.MaxSnoozed = max(r.MaxSnoozed, s.snoozed)
		if s.at.Before(first) || s.at.After(last) {
			continue
		}
		r.Samples++
		held += s.held
		if s.held >= c.limit {
			full++
		} else if s.waiting > 0 {
			idleWaited++
			idleWaitedSlots += c.limit - s.held
		}
		waiting += s.waiting
	}
	if r.Samples > 0 {
		r.MeanHeldRedis = float64(held) / float64(r.Samples)
		r.IdleSlotShare = 1 - r.MeanHeldRedis/float64(c.limit)
		r.FullSampleShare = float64(full) / float64(r.Samples)
		r.IdleWhileWaitingShare = float64(idleWaited) / float64(r.Samples)
		r.IdleSlotsWhileWaiting = float64(idleWaitedSlots) / float64(r.Samples*c.limit)
		r.MeanWaiting = float64(waiting) / float64(r.Samples)
		if r.PhasePerSecond > 0 {
			r.MeanHoldMS = 1000 * r.MeanHeldRedis / r.PhasePerSecond
		}
	}
	if d := w.done.Load(); d > 0 {
		r.MeanRunMS = float64(w.runNS.Load()) / float64(d) / 1e6
	}
	r.Waited, r.Refused, r.Taken = w.waited.Load(), w.refused.Load(), w.taken.Load()
	r.RetryAfterMedian = ms(quantile(refusedAfter, 0.5))
	r.WaitedAttempts = len(waits)
	r.WaitToTakeMedian, r.WaitToTakeP99 = ms(quantile(waits, 0.5)), ms(quantile(waits, 0.99))
	r.WaitToTakeMax = ms(quantile(waits, 1))
	for i := range w.ran {
		if w.ran[i].Load() == 1 {
			r.RanOnce++
		}
	}

	if r.MaxInFlightRedis > c.limit {
		b.fail(fmt.Sprintf("the limit's slots in Redis reached %d holders, over the limit of %d", r.MaxInFlightRedis, c.limit))
	}
	if r.MaxInFlightProc > c.limit {
		b.fail(fmt.Sprintf("%d element steps ran at once in-process, over the limit of %d", r.MaxInFlightProc, c.limit))
	}
	if r.RanOnce != n {
		b.fail(fmt.Sprintf("%d of %d elements ran exactly once", r.RanOnce, n))
	}
	if r.Samples == 0 {
		b.fail("no sample of the limit's slots fell in the element phase")
	}
	b.mu.Lock()
	r.Failures = append([]string(nil), b.failures...)
	b.mu.Unlock()
	r.OK = len(r.Failures) == 0
	return r, nil
}

// quantile is the q-quantile of ds (nearest rank), 0 when empty.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// workerSets starts the limited runs' workers: c.workers slots split over
// sets worker.Workers in this process, each with its engine (newEngine)
// and Redis client, as separate processes would have. stop stops them all.
func (b *bench) workerSets(ctx context.Context, sets int, newEngine func(redis.UniversalClient) (*reactor.Engine, error)) (stop func(), err error) {
	var stops []func() error
	stop = func() {
		for _, s := range stops {
			if serr := s(); serr != nil {
				b.log.Warn("stop a worker", "error", serr)
			}
		}
	}
	log := slog.New(slog.NewTextHandler(b.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i := range sets {
		conc := b.cfg.workers / sets
		if i < b.cfg.workers%sets {
			conc++
		}
		rdb := b.tgt.client(2*conc + 4)
		e, err := newEngine(rdb)
		if err != nil {
			_ = rdb.Close()
			stop()
			return nil, err
		}
		wk := worker.New(e, rdb, worker.Config{Concurrency: conc, Queues: map[string]int{b.queue: 1}, ShutdownTimeout: shutdownGrace, Logger: log})
		if err := wk.Start(ctx); err != nil {
			_ = rdb.Close()
			stop()
			return nil, fmt.Errorf("start a worker: %w", err)
		}
		stops = append(stops, func() error {
			sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
			defer cancel()
			return errors.Join(wk.Stop(sctx), rdb.Close())
		})
	}
	return stop, nil
}
