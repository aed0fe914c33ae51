package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// The recovery tests run worker processes the way production does:
// worker.Run (worker.Main's settings) with its defaults, 3 s locks and the
// in-process sweeper every second, so that a kill takes the sweeper down
// with the workers and the new worker's own sweeper recovers.

const (
	// recItems is the size of each map of TestRecoveryAfterKillingEveryWorker.
	recItems = 60
	// recBatch is its batch size: with recBatch + recBatch/2 positions
	// claimed ahead, fewer than the recWorkers x recConcurrency slots, the
	// claimed positions are in flight rather than queued when the workers
	// are killed.
	recBatch = 4
	// recWorkers worker processes run at a time, recConcurrency jobs each.
	recWorkers, recConcurrency = 2, 4
	// recUndoWork is how long each undo works.
	recUndoWork = 20 * time.Millisecond
	// recKills is the number of times every worker is killed.
	recKills = 10
	// recBound bounds each kill -> the lost jobs settled. The dead workers'
	// element locks lapse within 3 s, an idle task is dead at the second
	// look a second later, and the new worker's sweeper passes every
	// second, so 4 to 5 s is expected; asynq's lease alone (the sweeper's
	// verdict for a task it cannot tell idle) takes 15 s and more. The
	// bound leaves room for a loaded machine; the log line reports the
	// distribution.
	recBound = 12 * time.Second
	// recSlow is how long each slow part of TestRecoverySlowStepsAreNotTakenOver
	// works: longer than asynq's 5 s heartbeat.
	recSlow = 6 * time.Second
)

// recKeys are the keys the recovery tests' steps record into.
type recKeys struct{ prefix string }

// undos: hash element index -> undo executions.
func (k recKeys) undos() string { return k.prefix + ":undos" }

// slow: hash part -> executions started, of TestRecoverySlowStepsAreNotTakenOver.
func (k recKeys) slow() string { return k.prefix + ":slow" }

// recOwner maps recItems elements (one undoable step each) in batches of
// recBatch, then fails: its rollback is recItems jobs.
func recOwner(rdb redis.UniversalClient, k recKeys) *reactor.Definition {
	items := make([]int, recItems)
	for i := range items {
		items[i] = i
	}
	elem := reactor.MustDefine("recovery_el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("a", reactor.StepConfig[rbkIn, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run:  func(_ context.Context, in rbkIn) (int, error) { return in.N, nil },
			Undo: func(ctx context.Context, in rbkIn, _ int) error {
				if err := rdb.HIncrBy(context.WithoutCancel(ctx), k.undos(), strconv.Itoa(in.N), 1).Err(); err != nil {
					return err
				}
				t := time.NewTimer(recUndoWork)
				defer t.Stop()
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-t.C:
					return nil
				}
			},
		}))
	return reactor.MustDefine("recovery_owner",
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.Const(items), FanOut: true, BatchSize: recBatch}),
		reactor.Step("boom", reactor.StepConfig[reactor.Args, int]{
			After: []string{"each"},
			Run:   func(context.Context, reactor.Args) (int, error) { return 0, errors.New("boom") },
		}))
}

// recSlowOwner is a slow root step, then a fan-out map of two elements
// whose element 0 is slow forward and slow to undo, then a failure: every
// slow part runs recSlow on a live worker, holding its run's or element's
// lock, and counts its executions in k.slow().
func recSlowOwner(rdb redis.UniversalClient, k recKeys) *reactor.Definition {
	slow := func(ctx context.Context, part string) error {
		if err := rdb.HIncrBy(context.WithoutCancel(ctx), k.slow(), part, 1).Err(); err != nil {
			return err
		}
		t := time.NewTimer(recSlow)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}
	elem := reactor.MustDefine("recovery_slow_el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("a", reactor.StepConfig[rbkIn, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run: func(ctx context.Context, in rbkIn) (int, error) {
				if in.N == 0 {
					return in.N, slow(ctx, "element")
				}
				return in.N, nil
			},
			Undo: func(ctx context.Context, in rbkIn, _ int) error {
				if in.N == 0 {
					return slow(ctx, "undo")
				}
				return nil
			},
		}))
	return reactor.MustDefine("recovery_slow_owner",
		reactor.Step("root", reactor.StepConfig[reactor.Args, int]{
			Run: func(ctx context.Context, _ reactor.Args) (int, error) { return 1, slow(ctx, "root") },
		}),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.Const([]int{0, 1}), FanOut: true, After: []string{"root"}}),
		reactor.Step("boom", reactor.StepConfig[reactor.Args, int]{
			After: []string{"each"},
			Run:   func(context.Context, reactor.Args) (int, error) { return 0, errors.New("boom") },
		}))
}

// readyWriter writes the ready marker of startWorkerProcess when the
// worker's log says it started.
type readyWriter struct {
	path string
	once sync.Once
}

func (w *readyWriter) Write(b []byte) (int, error) {
	if strings.Contains(string(b), `"event":"worker.started"`) {
		w.once.Do(func() { _ = os.WriteFile(w.path, []byte(strconv.Itoa(os.Getpid())), 0o644) })
	}
	return len(b), nil
}

// serveMain is a worker subprocess of the recovery tests: worker.Run with
// def, on the parent's Redis, prefix and queue, every other setting at its
// default, until the parent goes away.
func serveMain(def *reactor.Definition) error {
	// The parent's Redis: its cluster under make test-cluster, else its node.
	redisArgs := []string{"-redis", "redis://" + os.Getenv(envRedisAddr) + "/0"}
	if url := os.Getenv("REDIS_URL"); url != "" {
		redisArgs[1] = url
	}
	if seeds := redistest.ClusterAddrs(); len(seeds) > 0 {
		redisArgs = []string{"-redis-cluster", strings.Join(seeds, ",")}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the parent's end closed
		os.Exit(3)
	}()
	return worker.Run(ctx, worker.Options{
		Definitions: []*reactor.Definition{def},
		Args: append(redisArgs, "-prefix", os.Getenv(envPrefix), "-queue", os.Getenv(envQueue),
			"-concurrency", os.Getenv(envConcurrency)),
		Getenv: func(string) string { return "" },
		Stderr: io.MultiWriter(os.Stderr, &readyWriter{path: filepath.Join(os.Getenv(envMarkerDir), "ready")}),
	})
}

// recoveryWorker is a worker process of the recovery tests.
func recoveryWorker(set string) workerSpec {
	return workerSpec{set: set, concurrency: recConcurrency, logTail: 8000}
}

// The acceptance test of fast recovery (issue 23): worker processes run
// worker.Run with its defaults (3 s locks, the sweeper in every worker every
// second). Ten times, a fan-out map of recItems elements rolls back on two
// of them, both are killed with SIGKILL mid-rollback and two new ones are
// started at once. The rest of the rollback goes on on the new workers; the
// jobs the dead ones held settle within recBound of the kill (expected: 4 to
// 5 s, the dead workers' element locks lapsing, then a second look), where
// asynq's 30 s lease alone made it 15 to 25 s. Each owner then fails once, cleanly, with every
// element undone, the elements in flight at the kill at most twice.
func TestRecoveryAfterKillingEveryWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("kills worker subprocesses ten times")
	}
	t.Parallel()
	began := time.Now()
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	ctx := ctxTimeout(t, 4*time.Minute)
	k := recKeys{prefix}
	km := keys.New(prefix)
	engine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: worker.NewClient(rdb, queue), Logger: discard})
	require.NoError(t, err)
	def := recOwner(rdb, k)

	start := func() []*workerProcess {
		ps := make([]*workerProcess, recWorkers)
		for i := range ps {
			ps[i] = startWorkerProcess(t, prefix, queue, recoveryWorker("recovery"))
		}
		return ps
	}
	workers := start()

	var (
		toFirst, toAll, toReady []time.Duration
		inFlight                []int
		twice                   int
	)
	for kill := range recKills {
		owner := "recovery-" + strconv.Itoa(kill)
		mapID := mapstep.MapID(owner, "each")
		progress := func() mapstep.RollbackProgress {
			p, _, err := mapstep.RollbackProgressOf(ctx, engine, mapID)
			require.NoError(t, err)
			return p
		}
		// open returns the claimed rollback positions with no outcome.
		open := func() []string {
			p := progress()
			if p.Dispatched == 0 {
				return nil
			}
			fields := make([]string, p.Dispatched)
			for i := range fields {
				fields[i] = strconv.Itoa(i)
			}
			vals, err := rdb.HMGet(ctx, km.MapRbResults(mapID, 1), fields...).Result()
			require.NoError(t, err)
			var out []string
			for i, v := range vals {
				if v == nil {
					out = append(out, fields[i])
				}
			}
			return out
		}
		settledAll := func(pos []string) bool {
			vals, err := rdb.HMGet(ctx, km.MapRbResults(mapID, 1), pos...).Result()
			require.NoError(t, err)
			return !slices.Contains(vals, nil)
		}

		_, err = engine.Enqueue(ctx, def, nil, reactor.WithRunID(owner))
		require.NoError(t, err)
		// Killed a third of the way through the rollback.
		require.Eventually(t, func() bool {
			p := progress()
			return p.Settled >= recItems/3 && p.Dispatched > p.Settled
		}, time.Minute, time.Millisecond, "kill %d: the rollback did not get a third of the way", kill)
		for _, w := range workers {
			w.kill()
		}
		killedAt := time.Now()
		lost := open()
		atKill := progress().Settled
		require.NotEmpty(t, lost, "kill %d: jobs in flight", kill)
		inFlight = append(inFlight, len(lost))

		workers = start()
		ready := time.Since(killedAt)
		var first time.Duration
		if !assert.Eventually(t, func() bool {
			if first == 0 && progress().Settled > atKill {
				first = time.Since(killedAt)
			}
			return settledAll(lost)
		}, recBound+5*time.Second, 5*time.Millisecond, "kill %d: the lost jobs %v did not settle", kill, lost) {
			t.Log(recDiagnose(t, ctx, rdb, prefix, queue, mapID, lost))
			t.FailNow()
		}
		all := time.Since(killedAt)
		if first == 0 {
			first = all
		}
		toFirst, toAll, toReady = append(toFirst, first), append(toAll, all), append(toReady, ready)

		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		res, err := engine.Wait(wctx, owner)
		cancel()
		require.NoError(t, err)
		require.Equal(t, reactor.StatusFailed, res.Status)
		require.Equal(t, "boom", res.Failure.Step)
		require.Empty(t, res.Failure.RollbackFailures)
		require.Equal(t, mapstep.RollbackProgress{Total: recItems, Settled: recItems, Dispatched: recItems, Done: true}, progress())
		undos := rdb.HGetAll(ctx, k.undos()).Val()
		require.Len(t, undos, recItems, "kill %d: every element undone", kill)
		for i, n := range undos {
			switch n {
			case "1":
			case "2":
				p, err := strconv.Atoi(i)
				require.NoError(t, err)
				require.Contains(t, lost, strconv.Itoa(recItems-1-p), "kill %d: element %s undone twice, but it was not in flight", kill, i)
				twice++
			default:
				require.Failf(t, "undone neither once nor twice", "kill %d: element %s: %s", kill, i, n)
			}
		}
		require.NoError(t, rdb.Del(ctx, k.undos()).Err())
	}

	stats := func(ds []time.Duration) string {
		s := slices.Clone(ds)
		slices.Sort(s)
		r := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
		all := make([]string, len(s))
		for i, d := range s {
			all[i] = r(d).String()
		}
		return fmt.Sprintf("min %s, median %s, max %s (%s)", r(s[0]), r((s[(len(s)-1)/2]+s[len(s)/2])/2), r(s[len(s)-1]),
			strings.Join(all, " "))
	}
	t.Logf("%d kills of every worker a third of the way through a rollback (%d elements, B=%d, %d workers x %d); jobs lost per kill %v",
		recKills, recItems, recBatch, recWorkers, recConcurrency, inFlight)
	t.Logf("kill -> every lost job settled: %s", stats(toAll))
	t.Logf("kill -> the rollback settled something again: %s", stats(toFirst))
	t.Logf("kill -> new workers ready: %s; elements undone twice: %d; test %s", stats(toReady), twice,
		time.Since(began).Round(time.Millisecond))
	for i, d := range toAll {
		require.Less(t, d, recBound, "kill %d", i)
	}
}

// A slow step on a live worker is never taken over, however eager the
// sweeper: a root step, a map element and an element's undo each work 6 s
// (longer than asynq's 5 s heartbeat) on a worker process with the
// defaults, while a second sweeper in this process passes every 100 ms
// with StaleAfter 100 ms. Each runs once, and no sweeper recovers anything.
func TestRecoverySlowStepsAreNotTakenOver(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out three slow steps")
	}
	t.Parallel()
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	ctx := ctxTimeout(t, 2*time.Minute)
	k := recKeys{prefix}
	client := worker.NewClient(rdb, queue)
	engine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: client, Logger: discard})
	require.NoError(t, err)
	w := startWorkerProcess(t, prefix, queue, recoveryWorker("recovery-slow"))

	sw := newEagerSweeper(t, ctx, engine)
	const owner = "recovery-slow-1"
	_, err = engine.Enqueue(ctx, recSlowOwner(rdb, k), nil, reactor.WithRunID(owner))
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := engine.Wait(wctx, owner)
	require.NoError(t, err)
	tot := sw.stop()
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.Equal(t, "boom", res.Failure.Step)
	require.Empty(t, res.Failure.RollbackFailures)
	require.Equal(t, map[string]string{"root": "1", "element": "1", "undo": "1"}, rdb.HGetAll(ctx, k.slow()).Val(),
		"each slow part ran once")
	require.Positive(t, tot.Passes)
	require.Zero(t, tot.RunsWoken+tot.Elements+tot.Rollbacks+tot.Resumes+tot.Claims+tot.FreshIDs,
		"the eager sweeper recovered nothing: %+v", tot)
	require.NotContains(t, w.output(), `"event":"reactor.sweep.run"`, "the worker's sweeper woke nothing")
	require.NotContains(t, w.output(), `"event":"reactor.sweep.map"`, "the worker's sweeper recovered no map work")
}

// eagerSweeper is a combined sweeper passing every 100 ms with StaleAfter
// 100 ms, in this process, until stop.
type eagerSweeper struct {
	sw     *sweeper.Sweeper
	cancel context.CancelFunc
	done   chan struct{}
}

func newEagerSweeper(t *testing.T, ctx context.Context, engine *reactor.Engine) *eagerSweeper {
	t.Helper()
	sw, err := sweeper.New(sweeper.Config{Engine: engine, Interval: 100 * time.Millisecond, StaleAfter: 100 * time.Millisecond,
		LeaderTTL: time.Second, Logger: discard})
	require.NoError(t, err)
	sctx, cancel := context.WithCancel(ctx)
	e := &eagerSweeper{sw: sw, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		_ = sw.Run(sctx)
	}()
	t.Cleanup(func() { e.stop() })
	return e
}

// stop ends the loop and returns its totals.
func (e *eagerSweeper) stop() sweeper.Totals {
	e.cancel()
	<-e.done
	return e.sw.Totals()
}

// recDiagnose describes what became of the rollback jobs of positions pos:
// their tasks' states and their elements' locks.
func recDiagnose(t *testing.T, ctx context.Context, rdb redis.UniversalClient, prefix, queue, mapID string, pos []string) string {
	insp := asynq.NewInspectorFromRedisClient(rdb)
	km := keys.New(prefix)
	var b strings.Builder
	for _, p := range pos {
		n, _ := strconv.Atoi(p)
		for _, suffix := range []string{"", ":r1", ":r2", ":r3"} {
			id := "rb:" + mapID + ":1:" + p + suffix
			info, err := insp.GetTaskInfo(queue, id)
			state := "missing"
			if err == nil {
				state = info.State.String()
			}
			fmt.Fprintf(&b, "%s: %s\n", id, state)
		}
		el := mapstep.ElementID(mapID, recItems-1-n)
		fmt.Fprintf(&b, "lock of %s: pttl %s\n", el, rdb.PTTL(ctx, km.ElemLock(el)).Val())
	}
	fmt.Fprintf(&b, "map meta %v\nrollback meta %v\nleader pttl %s", rdb.HGetAll(ctx, km.MapMeta(mapID)).Val(),
		rdb.HGetAll(ctx, km.MapRbMeta(mapID, 1)).Val(), rdb.PTTL(ctx, km.SweeperLeader()).Val())
	return b.String()
}
