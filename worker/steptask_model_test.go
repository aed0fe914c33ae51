package worker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// TestTaskStepsModel is the engine's random-DAG model test
// (TestConcurrentStepsModel) with steps that run as tasks of their own
// among the plain ones, through a worker: DAGs of 2 to 12 steps, a third
// of them Task steps, at MaxConcurrency 1 to 4, one step failing
// permanently or none. Each history is checked against the reference's
// rules: a step starts only after every step it depends on completed, and
// runs once; without a failure every step runs and none is undone; with
// one, no step that depends (transitively) on the failed one starts, the
// failed step is compensated once, every step that completed is undone
// exactly once, never before a completed step that consumed it.
// GOREACTOR_MODEL_SEED replays a seed.
func TestTaskStepsModel(t *testing.T) {
	f := newFixture(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GOREACTOR_MODEL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	histories := 16
	if testing.Short() {
		histories = 6
	}
	ctx := ctxTimeout(t)
	e := f.engine("w")
	f.startWorker(e, func(c *worker.Config) { c.Concurrency = 8 })
	tasks := 0
	for h := range histories {
		rng := rand.New(rand.NewPCG(seed, uint64(h)))
		n, conc := 2+rng.IntN(11), 1+rng.IntN(4)
		deps := make([][]string, n)
		task := make([]bool, n)
		for i := range n {
			task[i] = rng.IntN(3) == 0
			for j := range i {
				if rng.IntN(10) < 3 {
					deps[i] = append(deps[i], fmt.Sprintf("s%02d", j))
				}
			}
		}
		fail := ""
		if rng.IntN(3) > 0 {
			fail = fmt.Sprintf("s%02d", rng.IntN(n))
		}
		msg := fmt.Sprintf("seed %d history %d: %d steps, tasks %v, concurrency %d, deps %v, failing %q", seed, h, n, task, conc, deps, fail)
		var mu sync.Mutex
		seq := int64(0)
		stamp := func() int64 { seq++; return seq }
		started, ended, undone := map[string]int64{}, map[string]int64{}, map[string]int64{}
		starts, undos, comps := map[string]int{}, map[string]int{}, map[string]int{}
		parts := []reactor.Part{reactor.MaxConcurrency(conc)}
		for i := range n {
			step := fmt.Sprintf("s%02d", i)
			if task[i] {
				tasks++
			}
			work := time.Duration(rng.IntN(3)) * time.Millisecond
			parts = append(parts, reactor.Step(step, reactor.StepConfig[reactor.Args, string]{
				After: deps[i],
				Task:  task[i],
				Run: func(ctx context.Context, _ reactor.Args) (string, error) {
					mu.Lock()
					started[step] = stamp()
					starts[step]++
					mu.Unlock()
					time.Sleep(work) // the step's own work
					mu.Lock()
					defer mu.Unlock()
					if step == fail {
						return "", reactor.Permanent(errors.New("declined"))
					}
					ended[step] = stamp()
					return step, nil
				},
				Undo: func(context.Context, reactor.Args, string) error {
					mu.Lock()
					defer mu.Unlock()
					undone[step] = stamp()
					undos[step]++
					return nil
				},
				Compensate: func(context.Context, reactor.Args, error) error {
					mu.Lock()
					defer mu.Unlock()
					comps[step]++
					return nil
				},
			}))
		}
		def, err := reactor.Define(fmt.Sprintf("task-dag-%d", h), parts...)
		require.NoError(t, err, msg)
		require.NoError(t, e.Register(def), msg)
		res, err := e.Enqueue(ctx, def, nil)
		require.NoError(t, err, msg)
		final, err := e.Wait(ctx, res.RunID)
		require.NoError(t, err, msg)

		mu.Lock()
		for i := range n {
			step := fmt.Sprintf("s%02d", i)
			if at, ok := started[step]; ok {
				for _, d := range deps[i] {
					end, done := ended[d]
					require.True(t, done && end < at, "%s: %s started before its dependency %s completed", msg, step, d)
				}
				require.Equal(t, 1, starts[step], "%s: %s ran once", msg, step)
			}
		}
		if fail == "" {
			require.Equal(t, reactor.StatusCompleted, final.Status, "%s: %v", msg, final.Err())
			require.Len(t, ended, n, msg)
			require.Empty(t, undos, msg)
		} else {
			require.Equal(t, reactor.StatusFailed, final.Status, msg)
			require.Equal(t, fail, final.Failure.Step, msg)
			require.Empty(t, final.Failure.RollbackFailures, msg)
			require.Equal(t, map[string]int{fail: 1}, comps, "%s: the failed step compensated once", msg)
			bad := map[string]bool{fail: true}
			for i := range n {
				for _, d := range deps[i] {
					if bad[d] {
						bad[fmt.Sprintf("s%02d", i)] = true
					}
				}
			}
			for s := range bad {
				if s != fail {
					require.NotContains(t, started, s, "%s: %s depends on the failed step", msg, s)
				}
			}
			for s := range ended {
				require.Equal(t, 1, undos[s], "%s: %s completed, undone once", msg, s)
			}
			require.Len(t, undos, len(ended), "%s: only completed steps are undone", msg)
			for i := range n {
				c := fmt.Sprintf("s%02d", i)
				for _, d := range deps[i] {
					if cu, ok := undone[c]; ok {
						require.Less(t, cu, undone[d], "%s: %s undone before %s, which it consumed", msg, d, c)
					}
				}
			}
		}
		mu.Unlock()
	}
	require.Positive(t, tasks, "seed %d: no history had a task step", seed)
}
