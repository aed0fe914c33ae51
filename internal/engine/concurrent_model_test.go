package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// dagLog is what a random DAG's steps did, each event stamped with a
// global sequence number.
type dagLog struct {
	seq                    atomic.Int64
	mu                     sync.Mutex
	started, ended, undone map[string]int64 // step -> stamp (ended: Run returned nil)
	starts, undos, comps   map[string]int
	inFlight, most         int
}

func newDagLog() *dagLog {
	return &dagLog{started: map[string]int64{}, ended: map[string]int64{}, undone: map[string]int64{},
		starts: map[string]int{}, undos: map[string]int{}, comps: map[string]int{}}
}

// TestConcurrentStepsModel runs random DAGs of 2 to 12 steps (each step
// depends on earlier ones at random, through After) at MaxConcurrency 1 to
// 4, one step failing permanently or none, and checks each history against
// the rules of a reference: a step starts only after every step it depends
// on completed; at most MaxConcurrency run at once; without a failure every
// step runs once and none is undone; with one, no step that depends
// (transitively) on the failed one starts, the failed step is compensated
// once, every step that completed is undone exactly once, and never before
// a completed step that consumed it. GOREACTOR_MODEL_SEED replays a seed.
func TestConcurrentStepsModel(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GOREACTOR_MODEL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	histories := 40
	if testing.Short() {
		histories = 12
	}
	ctx := context.Background()
	overlapped := 0 // histories in which steps ran at once
	for h := range histories {
		rng := rand.New(rand.NewPCG(seed, uint64(h)))
		n, conc := 2+rng.IntN(11), 1+rng.IntN(4)
		deps := make([][]string, n)
		for i := range n {
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
		name := fmt.Sprintf("dag-%d", h)
		msg := fmt.Sprintf("seed %d history %d: %d steps, concurrency %d, deps %v, failing %q", seed, h, n, conc, deps, fail)
		log := newDagLog()
		parts := []engine.Part{engine.MaxConcurrency(conc)}
		for i := range n {
			step := fmt.Sprintf("s%02d", i)
			work := time.Duration(rng.IntN(3)) * time.Millisecond
			parts = append(parts, engine.Step(step, engine.StepConfig[engine.Args, string]{
				After: deps[i],
				Run: func(context.Context, engine.Args) (string, error) {
					log.mu.Lock()
					log.started[step] = log.seq.Add(1)
					log.starts[step]++
					log.inFlight++
					log.most = max(log.most, log.inFlight)
					log.mu.Unlock()
					time.Sleep(work) // the step's own work
					log.mu.Lock()
					log.inFlight--
					defer log.mu.Unlock()
					if step == fail {
						return "", engine.Permanent(errors.New("declined"))
					}
					log.ended[step] = log.seq.Add(1)
					return step, nil
				},
				Undo: func(context.Context, engine.Args, string) error {
					log.mu.Lock()
					log.undone[step] = log.seq.Add(1)
					log.undos[step]++
					log.mu.Unlock()
					return nil
				},
				Compensate: func(context.Context, engine.Args, error) error {
					log.mu.Lock()
					log.comps[step]++
					log.mu.Unlock()
					return nil
				},
			}))
		}
		def, err := engine.Define(name, parts...)
		require.NoError(t, err, msg)
		res, err := env.engine.Run(ctx, def, nil)
		require.NoError(t, err, msg)

		log.mu.Lock()
		require.LessOrEqual(t, log.most, conc, "%s: at most MaxConcurrency at once", msg)
		if log.most > 1 {
			overlapped++
		}
		for i := range n {
			step := fmt.Sprintf("s%02d", i)
			if at, ok := log.started[step]; ok {
				for _, d := range deps[i] {
					end, done := log.ended[d]
					require.True(t, done && end < at, "%s: %s started before its dependency %s completed", msg, step, d)
				}
				require.Equal(t, 1, log.starts[step], "%s: %s ran once", msg, step)
			}
		}
		if fail == "" {
			require.Equal(t, engine.StatusCompleted, res.Status, msg)
			require.Len(t, log.ended, n, msg)
			require.Empty(t, log.undos, msg)
		} else {
			require.Equal(t, engine.StatusFailed, res.Status, msg)
			require.Equal(t, fail, res.Failure.Step, msg)
			require.Equal(t, map[string]int{fail: 1}, log.comps, "%s: the failed step compensated once", msg)
			// Its consumers, transitively, never start.
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
					require.NotContains(t, log.started, s, "%s: %s depends on the failed step", msg, s)
				}
			}
			for s := range log.ended {
				require.Equal(t, 1, log.undos[s], "%s: %s completed, undone once", msg, s)
			}
			require.Len(t, log.undos, len(log.ended), "%s: only completed steps are undone", msg)
			for i := range n {
				c := fmt.Sprintf("s%02d", i)
				for _, d := range deps[i] {
					if cu, ok := log.undone[c]; ok {
						require.Less(t, cu, log.undone[d], "%s: %s undone before %s, which it consumed", msg, d, c)
					}
				}
			}
		}
		log.mu.Unlock()
	}
	require.Positive(t, overlapped, "seed %d: no history ran two steps at once", seed)
}
