package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// The -interrupts run: N runs of a one-interrupt reactor are started on the
// workers and pause; the run checks that they hold no worker slot and no
// task, and measures the Redis commands the paused runs cost while idle
// (the workers polling, and one run sweeper pass over all of them, then a
// second pass), then continues all N from -continuers goroutines and times
// the continues and the runs' completion, beside bare asynq's enqueue rate
// (asynq.Client.Enqueue of N no-op tasks from as many goroutines) measured
// in the same run.

const (
	approvalName = "bench.approval"
	approveStep  = "approve"
)

// approvalPayload is the interrupt's payload.
type approvalPayload struct {
	By string `json:"by"`
}

// approvalDefinition is prepare -> approve (an interrupt without timeout)
// -> ship, which returns who approved.
func approvalDefinition() *reactor.Definition {
	return reactor.MustDefine(approvalName,
		reactor.Step("prepare", reactor.StepConfig[reactor.Args, int]{
			Run: func(context.Context, reactor.Args) (int, error) { return 1, nil },
		}),
		reactor.Interrupt(approveStep, reactor.InterruptConfig[reactor.Args, approvalPayload]{After: []string{"prepare"}}),
		reactor.Step("ship", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"by": reactor.FromStep(approveStep, "by")},
			Run: func(_ context.Context, in reactor.Args) (string, error) {
				return reactor.Arg[string](in, "by")
			},
		}),
		reactor.Returns(reactor.FromStep("ship")),
	)
}

// interruptReport is the -interrupts run's result.
type interruptReport struct {
	Redis      string `json:"redis"`
	KeyPrefix  string `json:"key_prefix"`
	Queue      string `json:"queue"`
	Machine    string `json:"machine"`
	Runs       int    `json:"runs"`
	Workers    int    `json:"workers"`
	Procs      int    `json:"procs"`
	Continuers int    `json:"continuers"`

	// Starting: enqueue of the N runs until every one is paused.
	StartSeconds float64 `json:"start_seconds"`
	Paused       int     `json:"paused"`
	// Once all are paused: the queue's active, pending and scheduled
	// tasks, and the busy worker slots of the queue's servers.
	ActiveTasks    int `json:"active_tasks"`
	PendingTasks   int `json:"pending_tasks"`
	ScheduledTasks int `json:"scheduled_tasks"`
	BusySlots      int `json:"busy_worker_slots"`
	Slots          int `json:"worker_slots"`

	// Idle: commands per second over IdleSeconds with only the workers
	// (asynq polling the queue), before any run started (the baseline)
	// and with the N runs paused, and the difference per paused run.
	IdleSeconds        float64 `json:"idle_seconds"`
	BaselineCmdsPerSec float64 `json:"idle_commands_per_second_no_run"`
	IdleCmdsPerSec     float64 `json:"idle_commands_per_second"`
	IdleCmdsPerRunPS   float64 `json:"idle_commands_per_paused_run_per_second"`
	// The first sweeper pass examines every paused run once and moves it
	// PausedRecheck ahead; the idle rate over its length is taken off.
	Pass1Examined   int     `json:"sweep_pass1_examined"`
	Pass1Paused     int     `json:"sweep_pass1_left_paused"`
	Pass1Woken      int     `json:"sweep_pass1_woken"`
	Pass1Seconds    float64 `json:"sweep_pass1_seconds"`
	Pass1CmdsPerRun float64 `json:"sweep_pass1_commands_per_paused_run"`
	// The second pass, right after: what a pass costs while the paused
	// runs wait (their entries are ahead: none is examined).
	Pass2Examined int     `json:"sweep_pass2_examined"`
	Pass2Cmds     float64 `json:"sweep_pass2_commands"`
	TasksAfter    int     `json:"tasks_after_sweeps"`

	// Continuing: the N continue calls from Continuers goroutines, and the
	// runs' completion from the first continue to the last.
	ContinueSeconds    float64 `json:"continue_seconds"`
	ContinuesPerSec    float64 `json:"continues_per_second"`
	CompleteSeconds    float64 `json:"complete_seconds"`
	CompletedPerSec    float64 `json:"completed_per_second"`
	ContinueCmds       float64 `json:"commands_per_continue_call"`
	ContinueRTs        float64 `json:"round_trips_per_continue_call"`
	CmdsPerContinueRun float64 `json:"commands_per_continued_run"`
	// A continue call alone, server side: M more runs paused in this
	// process with no worker running, then continued (their wake-ups
	// stay queued).
	AloneRuns           int     `json:"continue_alone_runs"`
	CmdsPerContinueCall float64 `json:"server_commands_per_continue_call"`
	// Bare asynq: N Enqueue calls of no-op tasks from Continuers goroutines.
	BareEnqueueSeconds float64 `json:"bare_asynq_enqueue_seconds"`
	BareEnqueuePerSec  float64 `json:"bare_asynq_enqueue_per_second"`
	BareCmdsPerEnqueue float64 `json:"bare_asynq_commands_per_enqueue"`
	ContinueVsBare     float64 `json:"continues_vs_bare_enqueue"`
	CompletedVsBare    float64 `json:"completed_vs_bare_enqueue"`

	ServerCounts bool     `json:"server_counts"`
	OtherClients int      `json:"other_clients"`
	OK           bool     `json:"ok"`
	Failures     []string `json:"check_failures"`
}

// interruptRun is the -interrupts run.
func (b *bench) interruptRun(ctx context.Context) (*interruptReport, error) {
	c := b.cfg
	n := c.interrupts
	r := &interruptReport{Redis: b.tgt.desc, KeyPrefix: b.prefix, Queue: b.queue, Machine: machine(), Runs: n,
		Workers: c.workers, Procs: c.procs, Continuers: c.continuers, ServerCounts: !b.tgt.embedded, IdleSeconds: seconds(c.idleWindow)}
	b.bar.note("interrupts: %d runs, %d workers in %d process(es), %d continuers\n", n, c.workers, c.procs, c.continuers)
	k := keys.New(b.prefix)
	insp := asynq.NewInspectorFromRedisClient(b.admin)
	defer insp.Close()
	calls := func() int64 {
		if !r.ServerCounts {
			return 0
		}
		v, err := commandCalls(ctx, b.admin)
		if err != nil {
			b.fail(fmt.Sprintf("INFO commandstats: %v", err))
		}
		return v
	}
	others := func() {
		if r.ServerCounts {
			if o, err := otherClients(ctx, b.admin); err == nil {
				r.OtherClients = max(r.OtherClients, o)
			}
		}
	}
	ids := make([]string, n)
	run := shortID()
	for i := range ids {
		ids[i] = fmt.Sprintf("intr-%s-%d", run, i)
	}

	err := b.withPool(ctx, b.spec(kindReactor, []int{c.batch, c.elements}), c.procs, func() error {
		// ---- idle with no run: the workers' own polling, the baseline
		others()
		rate0, err := idleRate(ctx, c.idleWindow, calls)
		if err != nil {
			return err
		}
		r.BaselineCmdsPerSec = rate0

		// ---- start N runs; all pause
		stop := b.bar.track("starting", func(ctx context.Context) (string, int, int) {
			p, _ := b.admin.ZCard(ctx, k.Status(string(reactor.StatusPaused))).Result()
			return "paused", int(p), n
		})
		began := time.Now()
		err = fanOut(ctx, ids, c.continuers, func(ctx context.Context, id string) error {
			_, err := b.host.engine.Enqueue(ctx, b.host.approval, nil, reactor.WithRunID(id))
			return err
		})
		if err == nil {
			err = waitCount(ctx, b.admin, k.Status(string(reactor.StatusPaused)), n)
		}
		if err == nil {
			err = queueDrained(ctx, b.admin, b.queue)
		}
		stop()
		if err != nil {
			return fmt.Errorf("start the runs: %w", err)
		}
		r.StartSeconds = seconds(time.Since(began))
		p, err := b.admin.ZCard(ctx, k.Status(string(reactor.StatusPaused))).Result()
		if err != nil {
			return err
		}
		r.Paused = int(p)
		// The last completions of the start tasks settle (asynq moves a
		// task out of active after its handler returns).
		time.Sleep(300 * time.Millisecond)
		if err := b.queueState(insp, r); err != nil {
			return err
		}
		if r.ActiveTasks != 0 || r.PendingTasks != 0 || r.ScheduledTasks != 0 {
			b.fail(fmt.Sprintf("paused runs hold tasks: %d active, %d pending, %d scheduled",
				r.ActiveTasks, r.PendingTasks, r.ScheduledTasks))
		}

		// ---- idle: the workers only
		others()
		rate, err := idleRate(ctx, c.idleWindow, calls)
		if err != nil {
			return err
		}
		r.IdleCmdsPerSec, r.IdleCmdsPerRunPS = rate, (rate-rate0)/float64(n)
		// The servers' busy slots, as their heartbeat (every 5 s) last
		// wrote them: read at the end of the window, not at its start.
		if err := b.busySlots(ctx, insp, r); err != nil {
			return err
		}
		if r.BusySlots != 0 {
			b.fail(fmt.Sprintf("paused runs hold %d worker slots of %d", r.BusySlots, r.Slots))
		}

		// ---- sweeper passes
		sw, err := sweeper.NewRunSweeper(sweeper.RunConfig{Engine: b.host.engine, Client: b.owner, Enqueuer: b.host.enqueue,
			StaleAfter: time.Millisecond, Page: n + 10, Logger: b.log})
		if err != nil {
			return err
		}
		c2 := calls()
		t2 := time.Now()
		rep, err := sw.Sweep(ctx)
		d2 := time.Since(t2)
		c3 := calls()
		if err != nil {
			return fmt.Errorf("sweep: %w", err)
		}
		r.Pass1Examined, r.Pass1Paused, r.Pass1Woken, r.Pass1Seconds = rep.Examined, rep.Paused, rep.Woken, seconds(d2)
		r.Pass1CmdsPerRun = (float64(c3-c2) - rate*d2.Seconds()) / float64(n)
		t4 := time.Now()
		rep, err = sw.Sweep(ctx)
		d4 := time.Since(t4)
		c4 := calls()
		if err != nil {
			return fmt.Errorf("sweep: %w", err)
		}
		r.Pass2Examined, r.Pass2Cmds = rep.Examined, max(0, float64(c4-c3)-rate*d4.Seconds())
		if r.Pass1Examined != n || r.Pass1Paused != n || r.Pass1Woken != 0 || r.Pass2Examined != 0 {
			b.fail(fmt.Sprintf("sweeps: pass 1 examined %d, left %d paused, woke %d (want %d, %d, 0); pass 2 examined %d (want 0)",
				r.Pass1Examined, r.Pass1Paused, r.Pass1Woken, n, n, r.Pass2Examined))
		}
		qi, err := insp.GetQueueInfo(b.queue)
		if err != nil {
			return err
		}
		r.TasksAfter = qi.Pending + qi.Active + qi.Scheduled + qi.Retry
		if r.TasksAfter != 0 {
			b.fail(fmt.Sprintf("after the sweeps the queue holds %d tasks, want 0", r.TasksAfter))
		}

		// ---- bare asynq's enqueue rate, the yardstick
		bare, bareCmds, err := b.bareEnqueue(ctx, n, calls)
		if err != nil {
			return err
		}
		r.BareEnqueueSeconds, r.BareEnqueuePerSec = seconds(bare), float64(n)/bare.Seconds()
		r.BareCmdsPerEnqueue = float64(bareCmds) / float64(n)

		// ---- continue all N
		tl := &tally{}
		crdb := b.tgt.client(c.continuers + 4)
		defer crdb.Close()
		crdb.AddHook(tl)
		cont, err := reactor.NewEngine(ctx, reactor.Config{Client: crdb, Prefix: b.prefix, Enqueuer: worker.NewClient(crdb, b.queue), Logger: b.log})
		if err != nil {
			return err
		}
		if err := cont.Register(approvalDefinition()); err != nil {
			return err
		}
		var notWoken atomic.Int64
		stop = b.bar.track("continuing", func(ctx context.Context) (string, int, int) {
			d, _ := b.admin.ZCard(ctx, k.Status(string(reactor.StatusCompleted))).Result()
			return "completed", int(d), n
		})
		others()
		c5 := calls()
		t5 := time.Now()
		err = fanOut(ctx, ids, c.continuers, func(ctx context.Context, id string) error {
			cn, err := cont.Continue(ctx, id, approveStep, approvalPayload{By: id})
			if err == nil && !cn.Woken {
				notWoken.Add(1)
			}
			return err
		})
		d5 := time.Since(t5)
		rts, cmds := tl.rts.Load(), tl.cmds.Load()
		if err == nil {
			err = waitCount(ctx, b.admin, k.Status(string(reactor.StatusCompleted)), n)
		}
		d6 := time.Since(t5)
		stop()
		if err != nil {
			return fmt.Errorf("continue the runs: %w", err)
		}
		c6 := calls()
		others()
		r.ContinueSeconds, r.ContinuesPerSec = seconds(d5), float64(n)/d5.Seconds()
		r.CompleteSeconds, r.CompletedPerSec = seconds(d6), float64(n)/d6.Seconds()
		r.ContinueRTs, r.ContinueCmds = float64(rts)/float64(n), float64(cmds)/float64(n)
		r.CmdsPerContinueRun = (float64(c6-c5) - rate*d6.Seconds()) / float64(n)
		r.ContinueVsBare, r.CompletedVsBare = r.ContinuesPerSec/r.BareEnqueuePerSec, r.CompletedPerSec/r.BareEnqueuePerSec
		if notWoken.Load() > 0 {
			b.fail(fmt.Sprintf("%d continues did not wake their run", notWoken.Load()))
		}
		// A few results: each run shipped what its payload said.
		for _, id := range []string{ids[0], ids[n/2], ids[n-1]} {
			res, err := b.host.engine.Wait(ctx, id)
			if err != nil {
				return err
			}
			got, err := reactor.ValueOf[string](res)
			if err != nil || got != id {
				b.fail(fmt.Sprintf("run %s returned %q (%v), want its payload's %q", id, got, err, id))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if r.ServerCounts {
		if err := b.continueAlone(ctx, r, calls); err != nil {
			return nil, err
		}
	}
	r.Failures = append([]string{}, b.failures...)
	r.OK = len(r.Failures) == 0
	return r, nil
}

// continueAlone measures a continue call's server-side commands: with the
// workers stopped, min(N, 1000) more runs pause in this process (Run,
// NoWait) and are continued; nothing else runs on the Redis meanwhile.
func (b *bench) continueAlone(ctx context.Context, r *interruptReport, calls func() int64) error {
	m := min(r.Runs, 1000)
	ids := make([]string, m)
	run := shortID()
	for i := range ids {
		ids[i] = fmt.Sprintf("intr-alone-%s-%d", run, i)
	}
	err := fanOut(ctx, ids, b.cfg.continuers, func(ctx context.Context, id string) error {
		res, err := b.host.engine.Run(ctx, b.host.approval, nil, reactor.WithRunID(id), reactor.NoWait())
		if err == nil && res.Status != reactor.StatusPaused {
			err = fmt.Errorf("ran to %s, want paused", res.Status)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("pause runs in this process: %w", err)
	}
	c0 := calls()
	err = fanOut(ctx, ids, b.cfg.continuers, func(ctx context.Context, id string) error {
		_, err := b.host.engine.Continue(ctx, id, approveStep, approvalPayload{By: id})
		return err
	})
	if err != nil {
		return fmt.Errorf("continue runs in this process: %w", err)
	}
	r.AloneRuns, r.CmdsPerContinueCall = m, float64(calls()-c0)/float64(m)
	return nil
}

// idleRate is the server's commands per second over window.
func idleRate(ctx context.Context, window time.Duration, calls func() int64) (float64, error) {
	c0 := calls()
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(window):
	}
	return float64(calls()-c0) / time.Since(t0).Seconds(), nil
}

// queueState fills r's task counts.
func (b *bench) queueState(insp *asynq.Inspector, r *interruptReport) error {
	qi, err := insp.GetQueueInfo(b.queue)
	if err != nil {
		return err
	}
	r.ActiveTasks, r.PendingTasks, r.ScheduledTasks = qi.Active, qi.Pending, qi.Scheduled
	return nil
}

// busySlots fills r's worker slots and busy ones over the queue's
// servers. A server writes them with its heartbeat (every 5 s): a slot
// still busy is read again until two heartbeats have passed.
func (b *bench) busySlots(ctx context.Context, insp *asynq.Inspector, r *interruptReport) error {
	until := time.Now().Add(12 * time.Second)
	for {
		servers, err := insp.Servers()
		if err != nil {
			return err
		}
		r.Slots, r.BusySlots = 0, 0
		for _, s := range servers {
			if _, ok := s.Queues[b.queue]; ok {
				r.Slots += s.Concurrency
				r.BusySlots += len(s.ActiveWorkers)
			}
		}
		if r.Slots > 0 && r.BusySlots == 0 || time.Now().After(until) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// bareEnqueue enqueues n no-op tasks on the bare queue (no server runs
// there) from -continuers goroutines, as bareAsynq does one by one, and
// returns the time and the server's commands (calls' delta).
func (b *bench) bareEnqueue(ctx context.Context, n int, calls func() int64) (time.Duration, int64, error) {
	queue := b.bareQueue()
	client := asynq.NewClientFromRedisClient(b.owner)
	id := shortID()
	idx := make([]string, n)
	for i := range idx {
		idx[i] = fmt.Sprintf("noop:%s:%d", id, i)
	}
	c0 := calls()
	start := time.Now()
	err := fanOut(ctx, idx, b.cfg.continuers, func(ctx context.Context, tid string) error {
		_, err := client.EnqueueContext(ctx, asynq.NewTask(noopType, noopPayload),
			asynq.TaskID(tid), asynq.Queue(queue), asynq.MaxRetry(worker.DefaultMaxRetry), asynq.Timeout(worker.DefaultTaskTimeout))
		return err
	})
	took := time.Since(start)
	if err != nil {
		return 0, 0, fmt.Errorf("bare asynq: enqueue: %w", err)
	}
	return took, calls() - c0, nil
}

// fanOut calls f on every item from g goroutines; the first error stops it.
func fanOut(ctx context.Context, items []string, g int, f func(context.Context, string) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range g {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(items) || ctx.Err() != nil {
					return
				}
				if err := f(ctx, items[i]); err != nil {
					once.Do(func() { first = fmt.Errorf("%s: %w", items[i], err); cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// waitCount waits until the sorted set key holds n members.
func waitCount(ctx context.Context, rdb redis.UniversalClient, key string, n int) error {
	for {
		got, err := rdb.ZCard(ctx, key).Result()
		if err != nil {
			return err
		}
		if int(got) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("%s holds %d of %d", key, got, n), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (r *interruptReport) print(w io.Writer) {
	fmt.Fprintf(w, "goreactor interrupts: %d paused runs; redis %s; %s\n", r.Runs, r.Redis, r.Machine)
	fmt.Fprintf(w, "workers %d in %d process(es); %d continuers\n\n", r.Workers, r.Procs, r.Continuers)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string, a ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(v, a...)) }
	row("start (enqueue until all paused)", "%.2f s (%.0f runs/s)", r.StartSeconds, float64(r.Runs)/r.StartSeconds)
	row("paused", "%d of %d", r.Paused, r.Runs)
	row("tasks while paused", "%d active, %d pending, %d scheduled", r.ActiveTasks, r.PendingTasks, r.ScheduledTasks)
	row("worker slots busy", "%d of %d", r.BusySlots, r.Slots)
	if r.ServerCounts {
		row("idle Redis commands, no run", "%.1f/s over %.0f s (the workers polling)", r.BaselineCmdsPerSec, r.IdleSeconds)
		row("idle Redis commands, all paused", "%.1f/s over %.0f s (%+.5f per paused run per s)", r.IdleCmdsPerSec, r.IdleSeconds, r.IdleCmdsPerRunPS)
	}
	row("sweeper pass 1", "examined %d, left paused %d, woke %d in %.2f s; %.1f commands per paused run",
		r.Pass1Examined, r.Pass1Paused, r.Pass1Woken, r.Pass1Seconds, r.Pass1CmdsPerRun)
	row("sweeper pass 2 (at once)", "examined %d; %.0f commands", r.Pass2Examined, r.Pass2Cmds)
	row("tasks after the sweeps", "%d", r.TasksAfter)
	row("continue calls", "%.0f/s (%.2f s; %.1f round trips, %.1f commands per call, client side)", r.ContinuesPerSec, r.ContinueSeconds, r.ContinueRTs, r.ContinueCmds)
	row("completed runs (first continue to last completion)", "%.0f/s (%.2f s)", r.CompletedPerSec, r.CompleteSeconds)
	if r.ServerCounts {
		row("Redis commands per continued run", "%.1f (the continue, its wake-up, the resume to completion; server side)", r.CmdsPerContinueRun)
	}
	if r.AloneRuns > 0 {
		row("Redis commands per continue call", "%.1f (server side, scripts' commands included; %d calls, no worker running)", r.CmdsPerContinueCall, r.AloneRuns)
	}
	row("bare asynq Enqueue", "%.0f/s (%.2f s; %.1f commands per enqueue)", r.BareEnqueuePerSec, r.BareEnqueueSeconds, r.BareCmdsPerEnqueue)
	row("continues / bare enqueue", "%.2f", r.ContinueVsBare)
	row("completed runs / bare enqueue", "%.2f", r.CompletedVsBare)
	if r.OtherClients > 0 {
		row("other clients on the Redis", "%d (their commands are in the server counts)", r.OtherClients)
	}
	_ = tw.Flush()
	if !r.OK {
		fmt.Fprintf(w, "\nWRONG: %s\n", strings.Join(r.Failures, "; "))
	}
}
