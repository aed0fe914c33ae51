// Command demo shows goreactor in a few seconds: a checkout run in-process,
// a checkout handed to a worker that fails at its last step and is rolled
// back, a composed trip that is undone afterwards, fan-out maps, and a
// refund that pauses at an interrupt until an operator continues it with
// the goreactor command (cmd/goreactor), whose code the demo runs.
//
//	go run ./cmd/demo
//	go run ./cmd/demo -version   # prints "goreactor <version>"
//
// It uses the Redis named by -redis or REDIS_URL, or the Redis Cluster
// whose seeds -redis-cluster or REDIS_CLUSTER_ADDRS lists (host:port,...
// or redis://...,...; see worker.Main), and fails if that does not answer;
// with neither set, one on 127.0.0.1:6379, else an embedded in-process
// Redis (miniredis), and says which. GOREACTOR_EMBEDDED=1 forces the
// embedded one. Its keys and queue
// carry a random suffix, and are deleted from a real Redis at exit. It exits
// non-zero if anything turns out differently than it expects, the worker
// logging a warning included.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/examples"
	"github.com/goreactor/goreactor/internal/envflag"
	"github.com/goreactor/goreactor/internal/redisnode"
	"github.com/goreactor/goreactor/internal/redisurl"
	"github.com/goreactor/goreactor/internal/version"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

func main() {
	os.Exit(mainStatus(os.Args[1:], os.Stdout, os.Stderr))
}

// mainStatus is main up to its exit status: 0, 1 when the demo failed, 2
// for a bad command line. Its flags are -redis, -redis-cluster and
// -version.
func mainStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var target redisurl.Target
	envflag.Redis(fs, envflag.New(os.Getenv), &target, "")
	showVersion := fs.Bool("version", false, "print goreactor's version and exit")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "demo: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, version.Line())
		return 0
	}
	if err := run(target); err != nil {
		fmt.Fprintf(stderr, "\ndemo FAILED: %v\n", err)
		return 1
	}
	return 0
}

// The demo takes a few seconds on a real Redis (longer on the embedded
// one, whose scripts run in a Go Lua interpreter, and under -race); these
// bound it when something is wrong, with room for a loaded CI machine.
const (
	demoTimeout  = 120 * time.Second
	waitTimeout  = 60 * time.Second
	stopTimeout  = 10 * time.Second
	localTimeout = 300 * time.Millisecond
	urlTimeout   = 2 * time.Second
	localAddr    = "127.0.0.1:6379"
)

// run is the demo on the Redis target names (when it names one).
func run(target redisurl.Target) (err error) {
	began := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, demoTimeout)
	defer cancel()

	// The narrative goes to stdout. The engine's events would only repeat it
	// (a failing step is logged as a warning), so they are dropped. Anything
	// else that logs a warning (the worker, asynq) means trouble: it goes to
	// stderr and fails the demo.
	var warnings atomic.Int64
	logger := slog.New(countingHandler{
		Handler: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}),
		n:       &warnings,
	})
	slog.SetDefault(logger)

	conn, err := connect(ctx, target)
	if err != nil {
		return err
	}
	defer conn.close()
	rdb := conn.rdb

	id := reactor.NewRunID()[:8]
	prefix, queue := "goreactor-demo:"+id, "goreactor-demo-"+id
	if !conn.embedded {
		defer func() {
			if cerr := cleanup(rdb, prefix, queue); cerr != nil {
				err = errors.Join(err, fmt.Errorf("delete the demo's keys (prefix %s, queue %s): %w", prefix, queue, cerr))
			}
		}()
	}

	fmt.Println("goreactor demo")
	fmt.Printf("  redis   %s\n", conn.desc)
	fmt.Printf("  keys    prefix %s, queue %s\n", prefix, queue)

	client := worker.NewClient(rdb, queue)
	defer client.Close()
	engine, err := reactor.NewEngine(ctx, reactor.Config{
		Client:   rdb,
		Prefix:   prefix,
		Logger:   slog.New(slog.DiscardHandler),
		Enqueuer: client,
	})
	if err != nil {
		return err
	}
	if err := examples.Register(engine); err != nil {
		return err
	}
	if err := engine.Register(refundFlow); err != nil {
		return err
	}
	// The operator's engine is the goreactor command's: the same Redis,
	// prefix and queue, and no definitions.
	operator, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Logger: slog.New(slog.DiscardHandler), Enqueuer: client})
	if err != nil {
		return err
	}
	w := worker.New(engine, rdb, worker.Config{
		Concurrency:     4,
		Queues:          map[string]int{queue: 1},
		ShutdownTimeout: stopTimeout / 2,
		Logger:          logger,
	})
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("start worker: %w", err)
	}
	fmt.Println("  worker  started in this process, 4 tasks at a time")

	approve := func(ctx context.Context, engine *reactor.Engine) error { return refundApproved(ctx, engine, operator) }
	for _, part := range []func(context.Context, *reactor.Engine) error{checkoutInProcess, checkoutOnWorker, tripUndone, fulfilmentFanOut, fulfilmentRollback, approve} {
		if err = part(ctx, engine); err != nil {
			break
		}
	}

	stopCtx, stopCancel := context.WithTimeout(context.Background(), stopTimeout)
	defer stopCancel()
	if serr := w.Stop(stopCtx); serr != nil {
		err = errors.Join(err, fmt.Errorf("stop worker: %w", serr))
	}
	if n := warnings.Load(); n > 0 {
		err = errors.Join(err, fmt.Errorf("%d warning(s) logged (on stderr above)", n))
	}
	if err != nil {
		return err
	}
	fmt.Printf("\nworker stopped; demo finished in %s\n", time.Since(began).Round(time.Millisecond))
	return nil
}

// checkoutInProcess is part 1: Engine.Run executes a Checkout in this
// process and returns its receipt.
func checkoutInProcess(ctx context.Context, engine *reactor.Engine) error {
	const order = "1001"
	fmt.Printf("\n1. Checkout in this process (engine.Run): order %s, 2 × lamp\n", order)
	res, err := engine.Run(ctx, examples.Checkout,
		map[string]any{"order": order, "item": "lamp", "qty": 2},
		reactor.WithRunID("checkout-"+order))
	if err != nil {
		return fmt.Errorf("part 1: %w", err)
	}
	printEffects(order, 0)
	if res.Status != reactor.StatusCompleted {
		return fmt.Errorf("part 1: run ended %s (%v), want completed", res.Status, res.Err())
	}
	r, err := reactor.ValueOf[examples.Receipt](res)
	if err != nil {
		return fmt.Errorf("part 1: decode receipt: %w", err)
	}
	fmt.Printf("   => %s: %d × %s, charged %s (%s), tracking %s\n", res.Status, r.Qty, r.Item, r.Charged, r.Payment, r.Tracking)
	return nil
}

// checkoutOnWorker is part 2: Engine.Enqueue stores a Checkout as pending and
// hands it to the worker; its last step fails, so the worker compensates it
// and undoes the others, newest first. Engine.Wait reads the outcome from
// Redis.
func checkoutOnWorker(ctx context.Context, engine *reactor.Engine) error {
	const order, item = "1002", "desk"
	fmt.Printf("\n2. Checkout on the worker (engine.Enqueue), told to fail at its last step: order %s, 1 × %s\n", order, item)
	stock := examples.Stock.Available(item)
	res, err := engine.Enqueue(ctx, examples.Checkout,
		map[string]any{"order": order, "item": item, "fail_at": "ship"},
		reactor.WithRunID("checkout-"+order))
	if err != nil {
		return fmt.Errorf("part 2: %w", err)
	}
	fmt.Printf("   run %s is %s; engine.Wait...\n", res.RunID, res.Status)
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	res, err = engine.Wait(wctx, res.RunID)
	if err != nil {
		return fmt.Errorf("part 2: the worker did not finish the run: %w", err)
	}
	printEffects(order, 0)
	if res.Status != reactor.StatusFailed || res.Failure == nil || res.Failure.Step != "ship" {
		return fmt.Errorf("part 2: run ended %s (%v), want failed at step ship", res.Status, res.Err())
	}
	// The Failure was read back from Redis; the registered sentinel survives.
	if !errors.Is(res.Failure, examples.ErrInjected) {
		return fmt.Errorf("part 2: errors.Is(failure, examples.ErrInjected) is false for %v", res.Failure)
	}
	fmt.Printf("   => %s at step %q: %s\n", res.Status, res.Failure.Step, res.Failure.Message)
	fmt.Println("      errors.Is(res.Failure, examples.ErrInjected) = true")
	if err := printRollbacks(ctx, engine, res.RunID,
		"ship compensate", "charge undo", "reserve undo"); err != nil {
		return fmt.Errorf("part 2: %w", err)
	}
	if after := examples.Stock.Available(item); after != stock {
		return fmt.Errorf("part 2: %s stock is %d after the rollback, want %d", item, after, stock)
	}
	fmt.Printf("   %s stock: %d before, %d after\n", item, stock, stock)
	return nil
}

// fulfilmentFanOut is part 4: a fan-out map step packs 300 parcels, one
// worker task each, never more than 50 enqueued by one action; the demo
// shows the map's progress as the worker settles elements.
func fulfilmentFanOut(ctx context.Context, engine *reactor.Engine) error {
	const n, wave = 300, "W1"
	fmt.Printf("\n4. Fulfilment of wave %s: a fan-out map step packs %d parcels, one worker task each, in batches of %d\n", wave, n, mapstep.DefaultBatchSize)
	parcels := make([]examples.Parcel, n)
	for i := range parcels {
		parcels[i] = examples.Parcel{Order: fmt.Sprintf("P%03d", i), Item: "book"}
	}
	// NoWait: Run returns where the map leaves this process, so the demo can
	// show the map's progress; without it Run would wait for the end.
	res, err := engine.Run(ctx, examples.Fulfilment, map[string]any{"wave": wave, "parcels": parcels},
		reactor.WithRunID("fulfilment-"+wave), reactor.NoWait())
	if err != nil {
		return fmt.Errorf("part 4: %w", err)
	}
	if res.Outcome() != reactor.OutcomeDispatched {
		return fmt.Errorf("part 4: engine.Run(..., NoWait()) returned %s, want dispatched", res.Status)
	}
	fmt.Printf("   engine.Run(..., NoWait()) returned %s (the map was handed to the worker); progress:\n", res.Outcome())
	mapID := mapstep.MapID(res.RunID, "pack_all")
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	last := -50
	for {
		p, ok, err := mapstep.ProgressOf(wctx, engine, mapID)
		if err != nil {
			return fmt.Errorf("part 4: %w", err)
		}
		if ok && (p.Settled >= last+50 || p.Done && p.Settled != last) {
			fmt.Printf("     settled %3d/%d, dispatched %3d, failed %d\n", p.Settled, p.Total, p.Claimed, p.Failed)
			last = p.Settled
		}
		if ok && p.Done {
			break
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("part 4: the map did not settle: %w", wctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	res, err = engine.Wait(wctx, res.RunID)
	if err != nil {
		return fmt.Errorf("part 4: %w", err)
	}
	packed, err := reactor.ValueOf[int](res)
	if err != nil || res.Status != reactor.StatusCompleted || packed != n {
		return fmt.Errorf("part 4: run ended %s with %d packed (%v), want completed with %d", res.Status, packed, res.Err(), n)
	}
	fmt.Printf("   => %s: %d parcels packed, the owner run resumed once the map settled\n", res.Status, packed)
	return nil
}

// fulfilmentRollback is part 5: the same fan-out map, then a step after it
// fails; the map rolls back the way it ran, one rollback job per packed
// parcel, and the demo shows the distributed rollback's progress until the
// run is failed.
func fulfilmentRollback(ctx context.Context, engine *reactor.Engine) error {
	const n, wave = 200, "W2"
	fmt.Printf("\n5. Fulfilment of wave %s (%d parcels) whose truck booking fails after the map: a distributed rollback\n", wave, n)
	parcels := make([]examples.Parcel, n)
	for i := range parcels {
		parcels[i] = examples.Parcel{Order: fmt.Sprintf("Q%03d", i), Item: "lamp"}
	}
	res, err := engine.Enqueue(ctx, examples.Fulfilment, map[string]any{"wave": wave, "parcels": parcels, "fail_trucks": true},
		reactor.WithRunID("fulfilment-"+wave))
	if err != nil {
		return fmt.Errorf("part 5: %w", err)
	}
	mapID := mapstep.MapID(res.RunID, "pack_all")
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	last := -50
	for {
		run, err := engine.Get(wctx, res.RunID)
		if err != nil {
			return fmt.Errorf("part 5: %w", err)
		}
		p, ok, err := mapstep.RollbackProgressOf(wctx, engine, mapID)
		if err != nil {
			return fmt.Errorf("part 5: %w", err)
		}
		if ok && run.Status == reactor.StatusRollingBack && (p.Settled >= last+50 || p.Done && p.Settled != last) {
			fmt.Printf("     %s: rolled back %3d/%d, outstanding %3d, failed %d\n", run.Status, p.Settled, p.Total, p.Outstanding, p.Failed)
			last = p.Settled
		}
		if run.Status.Terminal() {
			break
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("part 5: the run did not finish: %w", wctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	res, err = engine.Wait(wctx, res.RunID)
	if err != nil {
		return fmt.Errorf("part 5: %w", err)
	}
	p, _, err := mapstep.RollbackProgressOf(wctx, engine, mapID)
	if err != nil {
		return fmt.Errorf("part 5: %w", err)
	}
	if res.Status != reactor.StatusFailed || res.Failure == nil || res.Failure.Step != "trucks" || p.Settled != n || p.Failed != 0 {
		return fmt.Errorf("part 5: run ended %s (%v), rollback %d/%d settled, want failed at trucks with all %d rolled back", res.Status, res.Err(), p.Settled, p.Total, n)
	}
	fmt.Printf("   => %s at step %q: %s\n", res.Status, res.Failure.Step, res.Failure.Message)
	fmt.Printf("      all %d parcels unpacked by %d rollback jobs, then the resumed owner finished the run\n", p.Settled, p.Total)
	return nil
}

// tripUndone is part 3: a Trip composes the Travel reactor; Engine.Undo rolls
// the finished trip back, the child's bookings included.
func tripUndone(ctx context.Context, engine *reactor.Engine) error {
	const trip = "T7"
	fmt.Printf("\n3. Trip %s, Lisbon → Oslo (composes the travel reactor), then engine.Undo\n", trip)
	res, err := engine.Run(ctx, examples.Trip,
		map[string]any{"trip": trip, "from": "Lisbon", "to": "Oslo", "nights": 3},
		reactor.WithRunID("trip-"+trip))
	if err != nil {
		return fmt.Errorf("part 3: %w", err)
	}
	seen := printEffects(trip, 0)
	if res.Status != reactor.StatusCompleted {
		return fmt.Errorf("part 3: run ended %s (%v), want completed", res.Status, res.Err())
	}
	r, err := reactor.ValueOf[examples.TripReceipt](res)
	if err != nil {
		return fmt.Errorf("part 3: decode receipt: %w", err)
	}
	fmt.Printf("   => %s: %s seat %s, %d nights at %s, paid %s\n", res.Status,
		r.Itinerary.Flight.Flight, r.Itinerary.Flight.Seat, r.Itinerary.Hotel.Nights, r.Itinerary.Hotel.Hotel, r.Payment.Amount)

	undone, err := engine.Undo(ctx, res.RunID)
	if err != nil {
		return fmt.Errorf("part 3: undo: %w", err)
	}
	fmt.Println("   undo:")
	printEffects(trip, seen)
	if undone.Status != reactor.StatusCancelled {
		return fmt.Errorf("part 3: undo ended %s (%v), want cancelled", undone.Status, undone.Err())
	}
	fmt.Printf("   => %s\n", undone.Status)
	if err := printRollbacks(ctx, engine, res.RunID,
		"pay undo", "book/itinerary undo", "book/hotel undo", "book/flight undo"); err != nil {
		return fmt.Errorf("part 3: %w", err)
	}
	return nil
}

// printEffects prints the journal entries of ref from index from on, and
// returns how many there are in all.
func printEffects(ref string, from int) int {
	entries := examples.Effects.Entries(ref)
	for _, e := range entries[min(from, len(entries)):] {
		fmt.Printf("     %s\n", e)
	}
	return len(entries)
}

// printRollbacks prints the stored run's rollback report and checks that it
// lists want ("step kind" items) in order, every one compensated or, for a
// step without an Undo, kept (no_compensation_registered).
func printRollbacks(ctx context.Context, engine *reactor.Engine, id string, want ...string) error {
	run, err := engine.Get(ctx, id)
	if err != nil {
		return err
	}
	fmt.Println("   rollback report (run.Rollbacks, in the order it happened):")
	var got []string
	ok := true
	for _, r := range run.Rollbacks {
		fmt.Printf("     %-12s %-10s %s\n", r.Step, r.Kind, r.Status)
		got = append(got, r.Step+" "+string(r.Kind))
		ok = ok && (r.Status == reactor.RollbackCompensated || r.Status == reactor.RollbackNoCompensation)
	}
	if !ok || strings.Join(got, ", ") != strings.Join(want, ", ") {
		return fmt.Errorf("rollback report %q (all compensated or kept: %v), want %q, all compensated or kept", got, ok, want)
	}
	return nil
}

// conn is the Redis the demo uses.
type conn struct {
	rdb      redis.UniversalClient
	desc     string
	embedded bool
	close    func()
}

// connect picks the Redis: the one target names (a URL or a cluster's
// seeds), which must answer (an explicit Redis that does not is an error,
// never a reason to run somewhere else); with none named, 127.0.0.1:6379
// if it answers within 300 ms, else an embedded miniredis.
// GOREACTOR_EMBEDDED=1 goes straight to the embedded one.
func connect(ctx context.Context, target redisurl.Target) (*conn, error) {
	if forced, _ := strconv.ParseBool(os.Getenv("GOREACTOR_EMBEDDED")); forced {
		return embedded("GOREACTOR_EMBEDDED=1")
	}
	// Probes that fail are expected here; keep go-redis from logging them.
	redis.SetLogger(quietLogger{})
	if target.Named() {
		c, e, err := redisurl.Dial(ctx, target, urlTimeout)
		if err != nil {
			return nil, fmt.Errorf("%w (name no Redis to use 127.0.0.1:6379 or an embedded one)", err)
		}
		from, what := target.URLFrom, ""
		if e.IsCluster() {
			from, what = target.ClusterFrom, "Redis Cluster, seeds "
		}
		return &conn{rdb: c, desc: fmt.Sprintf("%s (%s%s)", from, what, e.Addr()), close: func() { _ = c.Close() }}, nil
	}
	if c, err := dial(ctx, &redis.Options{Addr: localAddr}, localTimeout); err == nil {
		return &conn{rdb: c, desc: "using the local Redis at " + localAddr, close: func() { _ = c.Close() }}, nil
	}
	return embedded("no Redis answers on " + localAddr)
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// dial connects and PINGs within timeout.
func dial(ctx context.Context, opts *redis.Options, timeout time.Duration) (*redis.Client, error) {
	opts.DialTimeout = timeout
	c := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// embedded starts an in-process miniredis. miniredis expires keys only when
// its clock is advanced, so a ticker advances it in step with real time.
func embedded(why string) (*conn, error) {
	mr, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("start embedded Redis: %w", err)
	}
	const tick = 100 * time.Millisecond
	done := make(chan struct{})
	ticked := make(chan struct{})
	go func() {
		defer close(ticked)
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				mr.FastForward(tick)
			}
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return &conn{
		rdb:      c,
		desc:     fmt.Sprintf("%s: using an embedded in-process Redis (miniredis at %s)", why, mr.Addr()),
		embedded: true,
		close: func() {
			_ = c.Close()
			close(done)
			<-ticked
			mr.Close()
		},
	}, nil
}

// cleanup deletes the demo's keys from a real Redis, on every master of a
// cluster: its runs and indexes, and its asynq queue.
func cleanup(rdb redis.UniversalClient, prefix, queue string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := redisnode.Unlink(ctx, rdb, prefix+":*", "asynq:{"+queue+"}:*"); err != nil {
		return err
	}
	return rdb.SRem(ctx, "asynq:queues", queue).Err()
}

// countingHandler counts the records it handles.
type countingHandler struct {
	slog.Handler
	n *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.n.Add(1)
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return countingHandler{Handler: h.Handler.WithAttrs(attrs), n: h.n}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{Handler: h.Handler.WithGroup(name), n: h.n}
}
