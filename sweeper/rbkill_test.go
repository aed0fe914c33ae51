package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

const (
	// rbkItems is the map's size: one rollback job per element.
	rbkItems = 1000
	// rbkBatch is the map's batch size, forward and rolling back.
	rbkBatch = 50
	// rbkConcurrency is each worker process's concurrency: at most that
	// many rollback jobs are in flight when the first worker is killed.
	rbkConcurrency = 8
	// rbkLockExpiry: a dead worker's element locks are gone within 2 s.
	rbkLockExpiry = 2 * time.Second
	// rbkUndoWork is how long an undo works after recording its effect;
	// a kill in that window leaves the entry done but not checkpointed.
	rbkUndoWork = 5 * time.Millisecond
	// rbkOwnerName is the owner reactor's name.
	rbkOwnerName = "rbkill_owner"
	// rbkRecoveryLimit bounds kill -> owner terminal. asynq's own recoverer
	// cannot reclaim a dead worker's task before its lease has been expired
	// for 30 s, that is 55 s or more after the kill (the lease is 30 s past
	// its last extension, extended every 5 s), and it runs once a minute:
	// finishing within this limit means the sweeper did the recovery.
	rbkRecoveryLimit = 40 * time.Second
)

// rbkKeys are the Redis keys the element steps and the owner hook record
// into, under the test's prefix. undos and undoLog share a hash tag: an
// undo writes both in one MULTI, which a cluster runs only within a slot.
type rbkKeys struct{ prefix string }

// runs: hash "<i>:<step>" -> number of forward executions.
func (k rbkKeys) runs() string { return k.prefix + ":runs" }

// undos: hash "<i>:<step>" -> number of undo executions.
func (k rbkKeys) undos() string { return k.prefix + ":{undo}:undos" }

// undoLog: list of "<i>:<step>:<pid>", one per undo execution, in order.
func (k rbkKeys) undoLog() string { return k.prefix + ":{undo}:undo_log" }

// ownerFinal: hash event kind -> number of terminal events of the owner.
func (k rbkKeys) ownerFinal() string { return k.prefix + ":owner_final" }

type rbkIn struct {
	N int `json:"n"`
}

// rbkStep is an element step that counts its runs and, as its undo,
// records "<i>:<step>" in the undo hash and the undo log (atomically), then
// works for rbkUndoWork.
func rbkStep(rdb redis.UniversalClient, k rbkKeys, name string, after ...string) reactor.Part {
	return reactor.Step(name, reactor.StepConfig[rbkIn, int]{
		Args:  reactor.Bindings{"n": reactor.FromInput("item")},
		After: after,
		Run: func(ctx context.Context, in rbkIn) (int, error) {
			field := strconv.Itoa(in.N) + ":" + name
			if err := rdb.HIncrBy(context.WithoutCancel(ctx), k.runs(), field, 1).Err(); err != nil {
				return 0, err
			}
			return in.N, nil
		},
		Undo: func(ctx context.Context, in rbkIn, out int) error {
			if out != in.N {
				return fmt.Errorf("element %d step %s: undo got result %d", in.N, name, out)
			}
			field := strconv.Itoa(in.N) + ":" + name
			bg := context.WithoutCancel(ctx)
			_, err := rdb.TxPipelined(bg, func(p redis.Pipeliner) error {
				p.HIncrBy(bg, k.undos(), field, 1)
				p.RPush(bg, k.undoLog(), field+":"+strconv.Itoa(os.Getpid()))
				return nil
			})
			if err != nil {
				return err
			}
			t := time.NewTimer(rbkUndoWork) // the undo's own work
			defer t.Stop()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
				return nil
			}
		},
	})
}

// rbkOwner is a fan-out map of rbkItems elements (steps a -> b, both with an
// Undo) in batches of rbkBatch, then a step that fails: the owner rolls the
// map back through rbkItems rollback jobs and ends failed.
func rbkOwner(rdb redis.UniversalClient, k rbkKeys) *reactor.Definition {
	items := make([]int, rbkItems)
	for i := range items {
		items[i] = i
	}
	elem := reactor.MustDefine(rbkOwnerName+"_el",
		reactor.Input[int]("item", reactor.Required()),
		rbkStep(rdb, k, "a"),
		rbkStep(rdb, k, "b", "a"),
	)
	return reactor.MustDefine(rbkOwnerName,
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.Const(items), FanOut: true, BatchSize: rbkBatch}),
		reactor.Step("boom", reactor.StepConfig[reactor.Args, int]{
			After: []string{"each"},
			Run:   func(context.Context, reactor.Args) (int, error) { return 0, errors.New("boom") },
		}),
	)
}

// rbkOwnerFinalHook counts the owner's terminal events in k.ownerFinal.
// The worker processes run with it.
func rbkOwnerFinalHook(rdb redis.UniversalClient, k rbkKeys) reactor.Hook {
	return reactor.HookFunc(func(ctx context.Context, ev reactor.Event) {
		if ev.Reactor != rbkOwnerName || ev.Step != "" {
			return
		}
		switch ev.Kind {
		case reactor.EventRunCompleted, reactor.EventRunFailed, reactor.EventRunHalted,
			reactor.EventRunCancelled, reactor.EventRunAborted:
			_ = rdb.HIncrBy(context.WithoutCancel(ctx), k.ownerFinal(), string(ev.Kind), 1).Err()
		}
	})
}

// rbkWorker is a worker process of the test: rbkConcurrency jobs at a time,
// and only the tail of its output logged on failure.
var rbkWorker = workerSpec{set: "rbmap", concurrency: rbkConcurrency, logTail: 8000}

// The acceptance test of a worker killed in the middle of a fan-out map's
// rollback: 1,000 elements of two undoable steps each are rolled back by
// 1,000 rollback jobs on a worker process, which is killed with SIGKILL
// about 30% of the way through. A new worker process and the combined
// sweeper finish the rollback:
//   - every element is undone: each of its two undo entries ran once or
//     twice, and only an entry of an element whose rollback job was in
//     flight on the killed worker ran twice (first there, then on the new
//     worker), at most one entry per such element;
//   - the owner ends failed with the failing step's Failure and no rollback
//     failures, and its terminal event happened exactly once;
//   - the sweeper redelivered the dead jobs (under fresh task ids), within
//     rbkRecoveryLimit of the kill: before asynq's own recoverer could.
func TestRbKillWorkerMidMapRollback(t *testing.T) {
	if testing.Short() {
		t.Skip("worker subprocesses and a 1,000-element rollback: skipped with -short")
	}
	began := time.Now()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	queue := redistest.Queue(t)
	ctx := ctxTimeout(t, 90*time.Second)
	k := rbkKeys{prefix}
	client := worker.NewClient(rdb, queue)
	engine, err := reactor.NewEngine(ctx, reactor.Config{
		Client: rdb, Prefix: prefix, Enqueuer: client, Logger: discard, LockExpiry: rbkLockExpiry,
	})
	require.NoError(t, err)
	def := rbkOwner(rdb, k)
	const owner = "rbkill-1"
	mapID := mapstep.MapID(owner, "each")
	rbTask := "rb:" + mapID + ":1:"

	// The first worker runs the map forward and starts its rollback.
	first := startWorkerProcess(t, prefix, queue, rbkWorker)
	res, err := engine.Enqueue(ctx, def, nil, reactor.WithRunID(owner))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusPending, res.Status)

	// Kill it once about 30% of the rollback has settled, half way through
	// a batch: the next batch is claimed by the last job of the current one
	// (back pressure), so at a batch boundary the worker has drained and
	// only that job is in flight; mid-batch every slot of the worker is busy.
	killAt := rbkItems*3/10 + rbkBatch/2
	midBatch := func(settled int) bool { return settled%rbkBatch >= 5 && settled%rbkBatch < rbkBatch-5 }
	var rbBegan time.Time
	require.Eventually(t, func() bool {
		p, ok, err := mapstep.RollbackProgressOf(ctx, engine, mapID)
		require.NoError(t, err)
		if ok && rbBegan.IsZero() {
			rbBegan = time.Now()
		}
		return ok && p.Settled >= killAt && midBatch(p.Settled) || first.gone()
	}, 60*time.Second, 2*time.Millisecond, "the rollback did not get 30% through")
	require.False(t, first.gone(), "the first worker exited: %s", first.cmd.ProcessState)
	first.kill()
	killedAt := time.Now()
	require.Equal(t, -1, first.cmd.ProcessState.ExitCode(), "killed by a signal")
	atKill, _, err := mapstep.RollbackProgressOf(ctx, engine, mapID)
	require.NoError(t, err)

	// The jobs the dead worker held: still active in asynq, for nobody.
	insp := asynq.NewInspectorFromRedisClient(rdb)
	active, err := insp.ListActiveTasks(queue)
	require.NoError(t, err)
	orphans := map[int]bool{} // element index -> its rollback job was in flight
	var orphanPos []string
	for _, ti := range active {
		pos, ok := strings.CutPrefix(ti.ID, rbTask)
		require.True(t, ok, "only rollback jobs are active mid-rollback, got %s", ti.ID)
		p, err := strconv.Atoi(pos)
		require.NoError(t, err)
		orphans[rbkItems-1-p] = true
		orphanPos = append(orphanPos, pos)
	}
	require.NotEmpty(t, orphans, "the kill left rollback jobs in flight")
	require.LessOrEqual(t, len(orphans), rbkConcurrency)
	// Those without an outcome can only finish through a redelivery.
	km := keys.New(prefix)
	outcomes, err := rdb.HMGet(ctx, km.MapRbResults(mapID, 1), orphanPos...).Result()
	require.NoError(t, err)
	unsettled := 0
	for _, o := range outcomes {
		if o == nil {
			unsettled++
		}
	}
	require.Positive(t, unsettled, "some job in flight at the kill had not settled")

	// The second worker, and the sweeper every 500 ms.
	second := startWorkerProcess(t, prefix, queue, rbkWorker)
	sw, err := sweeper.New(sweeper.Config{Engine: engine, StaleAfter: time.Second, Interval: 500 * time.Millisecond, Logger: discard})
	require.NoError(t, err)
	sweepCtx, stopSweeping := context.WithCancel(ctx)
	var (
		sweepMu        sync.Mutex
		sweepErrs      []error
		firstRedeliver time.Duration
	)
	sweeping := make(chan struct{})
	go func() {
		defer close(sweeping)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			rep, err := sw.Once(sweepCtx)
			sweepMu.Lock()
			if err != nil && sweepCtx.Err() == nil {
				sweepErrs = append(sweepErrs, err)
			}
			if rep.Maps.Fresh > 0 && firstRedeliver == 0 {
				firstRedeliver = time.Since(killedAt)
			}
			sweepMu.Unlock()
			select {
			case <-sweepCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	waitCtx, cancel := context.WithDeadline(ctx, killedAt.Add(rbkRecoveryLimit))
	defer cancel()
	res, err = engine.Wait(waitCtx, owner)
	recovery := time.Since(killedAt)
	stopSweeping()
	<-sweeping
	require.NoError(t, err, "the owner did not finish within %s of the kill", rbkRecoveryLimit)
	require.False(t, second.gone(), "the second worker exited: %s", second.cmd.ProcessState)

	// The owner: failed by its failing step, its rollback complete and clean.
	require.Equal(t, reactor.StatusFailed, res.Status, "%v", res.Failure)
	require.NotNil(t, res.Failure)
	require.Equal(t, "boom", res.Failure.Step)
	require.Equal(t, "boom", res.Failure.Message)
	require.Empty(t, res.Failure.RollbackFailures)
	require.Zero(t, res.Failure.RollbackFailuresOmitted)
	p, ok, err := mapstep.RollbackProgressOf(ctx, engine, mapID)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, mapstep.RollbackProgress{Total: rbkItems, Settled: rbkItems, Dispatched: rbkItems, Done: true}, p)
	require.Equal(t, strconv.Itoa(rbkItems), rdb.HGet(ctx, km.MapRbMeta(mapID, 1), "n:undone").Val(), "every position undone")

	// The owner's terminal write happened once: one terminal event, failed.
	// The worker's hook records the event just after the terminal write
	// that Wait hears, in another process: wait for the record.
	require.Eventually(t, func() bool { return rdb.HLen(ctx, k.ownerFinal()).Val() > 0 }, 5*time.Second, 10*time.Millisecond,
		"the worker recorded no terminal event of the owner")
	require.Equal(t, map[string]string{string(reactor.EventRunFailed): "1"}, rdb.HGetAll(ctx, k.ownerFinal()).Val(),
		"the owner finished exactly once")

	// Forward: every step of every element ran, once (no kill then).
	runs := rdb.HGetAll(ctx, k.runs()).Val()
	require.Len(t, runs, 2*rbkItems)
	for f, n := range runs {
		require.Equal(t, "1", n, "forward %s", f)
	}

	// Undo: every entry done, at most twice; a repeat only for an element
	// in flight at the kill, at most one of its entries, first on the dead
	// worker and then on the new one.
	undos := rdb.HGetAll(ctx, k.undos()).Val()
	twice := map[string]bool{}
	perElement := map[int]int{}
	for i := range rbkItems {
		for _, s := range []string{"a", "b"} {
			f := strconv.Itoa(i) + ":" + s
			switch undos[f] {
			case "1":
			case "2":
				twice[f] = true
				perElement[i]++
				require.True(t, orphans[i], "undo %s repeated, but element %d was not in flight at the kill", f, i)
			default:
				require.Failf(t, "undo entry done neither once nor twice", "%s: %q", f, undos[f])
			}
		}
	}
	require.Len(t, undos, 2*rbkItems)
	require.LessOrEqual(t, len(twice), rbkConcurrency, "at most the entries in flight repeat")
	for i, n := range perElement {
		require.Equal(t, 1, n, "element %d: only the entry in flight repeats", i)
	}
	byEntry := map[string][]string{}
	pids := map[string]int{}
	for _, e := range rdb.LRange(ctx, k.undoLog(), 0, -1).Val() {
		at := strings.LastIndexByte(e, ':')
		byEntry[e[:at]] = append(byEntry[e[:at]], e[at+1:])
		pids[e[at+1:]]++
	}
	require.Len(t, pids, 2, "undos ran on the two workers only: %v", pids)
	require.Contains(t, pids, first.pid)
	require.Contains(t, pids, second.pid)
	for f := range twice {
		require.Equal(t, []string{first.pid, second.pid}, byEntry[f], "undo %s: on the killed worker, then again", f)
	}

	// The sweeper redelivered the dead jobs itself.
	tot := sw.Totals()
	sweepMu.Lock()
	require.Empty(t, sweepErrs)
	redelivered := firstRedeliver
	sweepMu.Unlock()
	require.Zero(t, tot.Errors)
	require.GreaterOrEqual(t, tot.FreshIDs, int64(unsettled), "every unsettled job in flight was redelivered under a fresh id")
	require.GreaterOrEqual(t, tot.Rollbacks, tot.FreshIDs)
	require.Positive(t, redelivered)
	require.Less(t, recovery, rbkRecoveryLimit)

	twiceList := slices.Sorted(maps.Keys(twice))
	t.Logf("%d elements (%d undo entries); rollback began %s after the enqueue, killed worker %s at %d/%d settled with %d jobs in flight (%d unsettled); "+
		"entries undone twice: %d %v; first redelivery %s and owner finished %s after the kill; "+
		"sweeper: %d passes, rollbacks %d, fresh ids %d, claims %d, resumes %d, runs woken %d, maps examined %d; test %s",
		rbkItems, 2*rbkItems, rbBegan.Sub(began).Round(time.Millisecond), first.pid, atKill.Settled, rbkItems, len(orphans), unsettled,
		len(twice), twiceList, redelivered.Round(time.Millisecond), recovery.Round(time.Millisecond),
		tot.Passes, tot.Rollbacks, tot.FreshIDs, tot.Claims, tot.Resumes, tot.RunsWoken, tot.Examined, time.Since(began).Round(time.Millisecond))
}
