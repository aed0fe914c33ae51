package sweeper_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// killLockExpiry: the heartbeat extends the lock every ~0.7 s, and a dead
// worker's lock is gone within 2 s.
const killLockExpiry = 2 * time.Second

// killDefinition is s1 -> s2 -> s3 -> s4. Each step records into Redis, in
// <prefix>:trace, "start:<step>:<pid>" and, when it returns successfully,
// "end:<step>:<pid>". A guard key <prefix>:running:<step> (SET NX) is held
// while a step executes: finding it taken records "overlap:<step>:<pid>",
// two executions of the same step at once. The first s2 to find
// <prefix>:crash-armed (consumed with GETDEL) pushes "s2-started:<pid>" to
// <prefix>:signal and blocks for a minute: the test kills its process then.
func killDefinition(rdb redis.UniversalClient, prefix string) *reactor.Definition {
	traced := func(name string, after ...string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			After: after,
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				bg := context.WithoutCancel(ctx)
				pid := strconv.Itoa(os.Getpid())
				guard := prefix + ":running:" + name
				free, err := rdb.SetNX(bg, guard, pid, time.Minute).Result()
				if err != nil {
					return "", err
				}
				if !free {
					if err := rdb.RPush(bg, prefix+":trace", "overlap:"+name+":"+pid).Err(); err != nil {
						return "", err
					}
				}
				defer rdb.Del(bg, guard)
				if err := rdb.RPush(bg, prefix+":trace", "start:"+name+":"+pid).Err(); err != nil {
					return "", err
				}
				if name == "s2" {
					armed, err := rdb.GetDel(bg, prefix+":crash-armed").Result()
					if err != nil && !errors.Is(err, redis.Nil) {
						return "", err
					}
					if armed != "" {
						if err := rdb.RPush(bg, prefix+":signal", "s2-started:"+pid).Err(); err != nil {
							return "", err
						}
						t := time.NewTimer(time.Minute)
						defer t.Stop()
						select {
						case <-ctx.Done():
							return "", ctx.Err()
						case <-t.C:
						}
					}
				}
				if err := rdb.RPush(bg, prefix+":trace", "end:"+name+":"+pid).Err(); err != nil {
					return "", err
				}
				return name + "-done", nil
			},
		})
	}
	return reactor.MustDefine("killed_worker", traced("s1"), traced("s2", "s1"), traced("s3", "s2"), traced("s4", "s3"))
}

// The acceptance test of crash recovery: a worker process killed with
// SIGKILL in the middle of a run; another worker and the run sweeper finish
// the run within 30 s, without re-running completed steps and without
// running any step twice at once.
func TestKilledWorkerRunIsFinishedByTheSweeper(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	queue := redistest.Queue(t)
	ctx := ctxTimeout(t, 50*time.Second)
	client := worker.NewClient(rdb, queue)
	eng, err := reactor.NewEngine(ctx, reactor.Config{
		Client: rdb, Prefix: prefix, Enqueuer: client, Logger: discard, LockExpiry: killLockExpiry,
	})
	require.NoError(t, err)
	def := killDefinition(rdb, prefix)
	trace, signal := prefix+":trace", prefix+":signal"
	const id = "killed-1"

	// The first worker: a process of its own, armed to hang in s2.
	require.NoError(t, rdb.Set(ctx, prefix+":crash-armed", "1", 0).Err())
	first := startWorkerProcess(t, prefix, queue, workerSpec{set: "steps"})
	firstPID := first.pid
	res, err := eng.Enqueue(ctx, def, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusPending, res.Status)
	require.Equal(t, "s2-started:"+firstPID, first.await(ctx, rdb, signal, 30*time.Second))
	run, err := eng.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusRunning, run.Status)
	require.Equal(t, []string{"s1"}, run.Completed, "s1 is checkpointed before s2 starts")
	locked, err := engine.Locked(eng, ctx, id)
	require.NoError(t, err)
	require.True(t, locked)

	killedAt := time.Now()
	first.kill()
	require.Equal(t, -1, first.cmd.ProcessState.ExitCode(), "killed by a signal")
	// The dead process cannot release its overlap guard. That is what it
	// leaves besides its lock (expiring) and its task (active for asynq's
	// lease, 30 s, and then some before asynq recovers it).
	guard := prefix + ":running:s2"
	require.Equal(t, firstPID, rdb.Get(ctx, guard).Val())
	require.NoError(t, rdb.Del(ctx, guard).Err())

	// The second worker, in this process, and the sweeper every 200 ms.
	second := worker.New(eng, rdb, worker.Config{Queues: map[string]int{queue: 1}, Logger: discard})
	require.NoError(t, second.Start(ctx))
	t.Cleanup(func() { require.NoError(t, second.Stop(context.Background())) })
	sw, err := sweeper.NewRunSweeper(sweeper.RunConfig{Engine: eng, Client: rdb, Enqueuer: client,
		Queue: queue, StaleAfter: time.Second, Logger: discard})
	require.NoError(t, err)
	sweepCtx, stopSweeping := context.WithCancel(ctx)
	var (
		sweepMu   sync.Mutex
		sweepErrs []error
		woken     int
		firstWake time.Duration
	)
	sweeping := make(chan struct{})
	go func() {
		defer close(sweeping)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			rep, err := sw.Sweep(sweepCtx)
			sweepMu.Lock()
			if err != nil && sweepCtx.Err() == nil {
				sweepErrs = append(sweepErrs, err)
			}
			if rep.Woken > 0 && woken == 0 {
				firstWake = time.Since(killedAt)
			}
			woken += rep.Woken
			sweepMu.Unlock()
			select {
			case <-sweepCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	waitCtx, cancel := context.WithDeadline(ctx, killedAt.Add(30*time.Second))
	defer cancel()
	res, err = eng.Wait(waitCtx, id)
	recovery := time.Since(killedAt)
	stopSweeping()
	<-sweeping
	require.NoError(t, err, "the run was not finished within 30 s of the kill")
	require.Equal(t, reactor.StatusCompleted, res.Status)
	t.Logf("killed worker %s: run woken %s and completed %s after the kill", firstPID, firstWake, recovery)
	require.Less(t, recovery, 30*time.Second)

	sweepMu.Lock()
	require.Empty(t, sweepErrs)
	require.Equal(t, 1, woken, "one wake-up")
	sweepMu.Unlock()

	me := strconv.Itoa(os.Getpid())
	require.Equal(t, []string{
		"start:s1:" + firstPID, "end:s1:" + firstPID,
		"start:s2:" + firstPID, // killed
		"start:s2:" + me, "end:s2:" + me,
		"start:s3:" + me, "end:s3:" + me,
		"start:s4:" + me, "end:s4:" + me,
	}, rdb.LRange(ctx, trace, 0, -1).Val(), "s1 ran once, s2 again after the kill, no step twice at once")
	final, err := eng.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, []string{"s1", "s2", "s3", "s4"}, final.Completed)
}
