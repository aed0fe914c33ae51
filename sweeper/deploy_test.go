package sweeper_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// deployLockExpiry: a killed worker's run lock is gone within a second.
const deployLockExpiry = time.Second

// deployOrder is the rolling deploy's reactor. Version 1 is reserve,
// charge, ship; version 2 renames ship to dispatch. Every call pushes
// "v<version> <what>:<step>:<pid>" to <prefix>:trace. The first ship to
// find <prefix>:crash-armed pushes "ship-started" to <prefix>:signal and
// blocks until its process is killed; every later ship fails (the carrier
// refuses the parcel), so the run rolls back.
func deployOrder(rdb redis.UniversalClient, prefix string, version int) *reactor.Definition {
	tag := "v" + strconv.Itoa(version) + " "
	record := func(ctx context.Context, what, step string) error {
		return rdb.RPush(context.WithoutCancel(ctx), prefix+":trace", tag+what+":"+step+":"+strconv.Itoa(os.Getpid())).Err()
	}
	step := func(name string, after ...string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			After: after,
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				if err := record(ctx, "run", name); err != nil {
					return "", err
				}
				if name != "ship" {
					return name + "-done", nil
				}
				armed, err := rdb.GetDel(context.WithoutCancel(ctx), prefix+":crash-armed").Result()
				if err != nil && !errors.Is(err, redis.Nil) {
					return "", err
				}
				if armed == "" {
					return "", reactor.Permanent(errors.New("the carrier refused the parcel"))
				}
				if err := rdb.RPush(context.WithoutCancel(ctx), prefix+":signal", "ship-started").Err(); err != nil {
					return "", err
				}
				<-ctx.Done() // killed before it returns
				return "", ctx.Err()
			},
			Undo: func(ctx context.Context, _ reactor.Args, _ string) error { return record(ctx, "undo", name) },
			Compensate: func(ctx context.Context, _ reactor.Args, _ error) error {
				return record(ctx, "compensate", name)
			},
		})
	}
	last := "ship"
	parts := []reactor.Part{}
	if version > 1 {
		last = "dispatch"
		parts = append(parts, reactor.Version(version))
	}
	parts = append(parts, step("reserve"), step("charge", "reserve"), step(last, "charge"))
	return reactor.MustDefine("order", parts...)
}

// The acceptance test of versioned definitions, through worker processes: a
// v1 worker is killed in the middle of ship; the deploy that replaced it
// has only v2 (ship renamed dispatch), and refuses the run instead of
// completing it with ship forgotten; a worker that has both versions then
// resumes the run under v1, whose ship fails, and the rollback compensates
// ship (the step in flight at the kill) and undoes charge and reserve.
// Nothing of v2 ever runs for it.
func TestARollingDeployNeverRunsARunUnderAnotherDefinition(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	queue := redistest.Queue(t)
	ctx := ctxTimeout(t, 80*time.Second)
	client := worker.NewClient(rdb, queue)
	engine, err := reactor.NewEngine(ctx, reactor.Config{
		Client: rdb, Prefix: prefix, Enqueuer: client, Logger: discard, LockExpiry: deployLockExpiry,
	})
	require.NoError(t, err)
	v1, v2 := deployOrder(rdb, prefix, 1), deployOrder(rdb, prefix, 2)
	const id = "order-deploy-1"

	// v1 takes the run and is killed in ship.
	require.NoError(t, rdb.Set(ctx, prefix+":crash-armed", "1", 0).Err())
	first := startWorkerProcess(t, prefix, queue, workerSpec{set: "order-v1"})
	_, err = engine.Enqueue(ctx, v1, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	require.Equal(t, "ship-started", first.await(ctx, rdb, prefix+":signal", 30*time.Second))
	first.kill()

	// The new deploy has v2 only. The sweeper wakes the run once its lock
	// lapsed; every delivery is refused.
	second := startWorkerProcess(t, prefix, queue, workerSpec{set: "order-v2"})
	sw, err := sweeper.NewRunSweeper(sweeper.RunConfig{Engine: engine, Client: rdb, Enqueuer: client,
		Queue: queue, StaleAfter: time.Second, Logger: discard})
	require.NoError(t, err)
	sweepCtx, stopSweeping := context.WithCancel(ctx)
	var sweeping sync.WaitGroup
	sweeping.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			_, _ = sw.Sweep(sweepCtx)
			select {
			case <-sweepCtx.Done():
				return
			case <-tick.C:
			}
		}
	})
	t.Cleanup(func() { stopSweeping(); sweeping.Wait() })

	var firstRefusal time.Time
	require.Eventually(t, func() bool {
		dw, err := engine.DefinitionWait(ctx, id)
		require.NoError(t, err)
		if dw == nil {
			return false
		}
		require.Equal(t, reactor.DefinitionVersion{Version: 1, Fingerprint: v1.Fingerprint()}, dw.Want)
		require.Equal(t, []reactor.DefinitionVersion{{Version: 2, Fingerprint: v2.Fingerprint()}}, dw.Have)
		require.True(t, strings.HasSuffix(dw.By, ":"+second.pid), "refused by %s", dw.By)
		if firstRefusal.IsZero() {
			firstRefusal = dw.At
		}
		return dw.At.After(firstRefusal) // refused more than once
	}, 30*time.Second, 20*time.Millisecond, "the v2-only worker did not refuse the v1 run")
	run, err := engine.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusRunning, run.Status, "refused, not finished")
	require.Equal(t, []string{"reserve", "charge"}, run.Completed)
	out := second.output()
	require.Equal(t, 1, strings.Count(out, `"level":"WARN","msg":"refusing a task`), "one Warn however many refusals:\n%s", out)
	require.Contains(t, out, v1.Fingerprint())
	require.Contains(t, out, v2.Fingerprint())

	// A deploy that keeps v1 beside v2 finishes it, under v1.
	third := startWorkerProcess(t, prefix, queue, workerSpec{set: "order-both"})
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := engine.Wait(waitCtx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.ErrorContains(t, res.Failure, "carrier refused")

	a, c := first.pid, third.pid
	require.Equal(t, []string{
		"v1 run:reserve:" + a, "v1 run:charge:" + a, "v1 run:ship:" + a, // killed in ship
		"v1 run:ship:" + c, "v1 compensate:ship:" + c, // ship again, under v1: it fails and is compensated
		"v1 undo:charge:" + c, "v1 undo:reserve:" + c,
	}, rdb.LRange(ctx, prefix+":trace", 0, -1).Val(), "every step of the run ran under v1; ship was never skipped")
}
