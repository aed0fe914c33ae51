package worker_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// notifier is the reactor the tests spawn: it sends to its input "to",
// counting sends in the hash key under "to", and, when hold is set, waits
// for its context to end (a cancel) first.
func notifier(rdb redis.UniversalClient, key string, hold bool, undone chan<- string) *reactor.Definition {
	return reactor.MustDefine("notifier", reactor.Input[string]("to", reactor.Required()),
		reactor.Step("send", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"to": reactor.FromInput("to")},
			Run: func(ctx context.Context, a reactor.Args) (string, error) {
				to, err := reactor.Arg[string](a, "to")
				if err != nil {
					return "", err
				}
				rdb.HIncrBy(context.Background(), key, to, 1)
				if hold {
					<-ctx.Done()
					return "", ctx.Err()
				}
				return "sent to " + to, nil
			},
			Undo: func(_ context.Context, a reactor.Args, _ string) error {
				to, _ := reactor.Arg[string](a, "to")
				undone <- to
				return nil
			},
		}),
		reactor.Returns(reactor.FromStep("send")))
}

// order spawns the notifier (on queue, with policy undo), then runs a step
// that fails when fail is set.
func order(child *reactor.Definition, queue string, undo reactor.SpawnUndo, fail bool) *reactor.Definition {
	return reactor.MustDefine("order", reactor.Input[string]("customer"),
		reactor.Spawn("notify", child, reactor.SpawnConfig{Args: reactor.Bindings{"to": reactor.FromInput("customer")}, Queue: queue, Undo: undo}),
		reactor.Step("charge", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"n": reactor.FromStep("notify")},
			Run: func(_ context.Context, a reactor.Args) (string, error) {
				sp, err := reactor.Arg[reactor.Spawned](a, "n")
				if err != nil {
					return "", err
				}
				if fail {
					return "", reactor.Permanent(errors.New("card declined"))
				}
				return "charged, told " + sp.RunID, nil
			},
		}),
		reactor.Returns(reactor.FromStep("charge")))
}

// A spawn step starts an independent run of another reactor, on its own
// queue, under an id derived from the spawning run's and the step's: the
// spawning run goes on without waiting for it, and each run names the
// other.
func TestSpawnStartsAnIndependentRun(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	side := redistest.Queue(t)
	sends := f.prefix + ":sends"
	child := notifier(f.rdb, sends, false, nil)
	def := order(child, side, reactor.SpawnKept, false)
	e := f.engine("w")
	require.NoError(t, e.Register(def))
	f.startWorker(e, func(c *worker.Config) { c.Queues = map[string]int{f.queue: 1, side: 1} })
	res, err := e.Enqueue(ctx, def, map[string]any{"customer": "ada"})
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	childID := reactor.SpawnID(res.RunID, "notify")
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "charged, told "+childID, got)

	spawned, err := e.Wait(ctx, childID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, spawned.Status, "%v", spawned.Err())
	parent, err := e.Get(ctx, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, []reactor.SpawnLink{{Run: childID, Reactor: "notifier", Step: "notify"}}, parent.Spawned)
	run, err := e.Get(ctx, childID)
	require.NoError(t, err)
	require.NotNil(t, run.SpawnedBy)
	assert.Equal(t, reactor.SpawnLink{Run: res.RunID, Reactor: "order", Step: "notify"}, *run.SpawnedBy)
	assert.Equal(t, side, run.Queue, "on its own queue")
	assert.Equal(t, "1", f.rdb.HGet(ctx, sends, "ada").Val())
}

// The spawning run's rollback leaves a spawned run alone by default (the
// spawn step is reported kept), and with SpawnCancelled cancels a spawned
// run still in flight (it rolls itself back) or undoes one that completed.
func TestSpawnedRunOnTheSpawningRunsRollback(t *testing.T) {
	for _, tc := range []struct {
		name   string
		undo   reactor.SpawnUndo
		hold   bool
		status reactor.Status
		undone bool
	}{
		{"kept", reactor.SpawnKept, false, reactor.StatusCompleted, false},
		{"cancelled in flight", reactor.SpawnCancelled, true, reactor.StatusCancelled, false},
		{"completed, undone", reactor.SpawnCancelled, false, reactor.StatusCancelled, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := ctxTimeout(t)
			undone := make(chan string, 1)
			child := notifier(f.rdb, f.prefix+":sends", tc.hold, undone)
			def := order(child, "", tc.undo, true)
			e := f.engine("w")
			require.NoError(t, e.Register(def))
			if !tc.hold && tc.undo == reactor.SpawnCancelled {
				// The spawned run completes before the spawning run fails:
				// charge waits for it.
				def = reactor.MustDefine("order-after", reactor.Input[string]("customer"),
					reactor.Spawn("notify", child, reactor.SpawnConfig{Args: reactor.Bindings{"to": reactor.FromInput("customer")}, Undo: tc.undo}),
					reactor.Step("charge", reactor.StepConfig[reactor.Args, string]{
						Args: reactor.Bindings{"n": reactor.FromStep("notify")},
						Run: func(ctx context.Context, a reactor.Args) (string, error) {
							sp, err := reactor.Arg[reactor.Spawned](a, "n")
							if err != nil {
								return "", err
							}
							if _, err := e.Wait(ctx, sp.RunID); err != nil {
								return "", err
							}
							return "", reactor.Permanent(errors.New("card declined"))
						},
					}))
				require.NoError(t, e.Register(def))
			}
			f.startWorker(e, func(c *worker.Config) { c.Concurrency = 4 })
			res, err := e.Enqueue(ctx, def, map[string]any{"customer": "bob"})
			require.NoError(t, err)
			final, err := e.Wait(ctx, res.RunID)
			require.NoError(t, err)
			require.Equal(t, reactor.StatusFailed, final.Status)
			assert.Empty(t, final.Failure.RollbackFailures)
			spawned, err := e.Wait(ctx, reactor.SpawnID(res.RunID, "notify"))
			require.NoError(t, err)
			assert.Equal(t, tc.status, spawned.Status, "%v", spawned.Err())
			if tc.undone {
				assert.Equal(t, "bob", <-undone, "the completed spawned run was undone")
			}
			parent, err := e.Get(ctx, res.RunID)
			require.NoError(t, err)
			statuses := map[string]reactor.RollbackStatus{}
			for _, r := range parent.Rollbacks {
				statuses[r.Step] = r.Status
			}
			if tc.undo == reactor.SpawnKept {
				assert.Equal(t, reactor.RollbackNoCompensation, statuses["notify"], "%v", statuses)
			} else {
				assert.Equal(t, reactor.RollbackCompensated, statuses["notify"], "%v", statuses)
			}
		})
	}
}

func TestSpawnDefinitionErrors(t *testing.T) {
	child := reactor.MustDefine("kid", reactor.Input[string]("to", reactor.Required()),
		reactor.Step("s", reactor.StepConfig[reactor.Args, string]{Run: func(context.Context, reactor.Args) (string, error) { return "", nil }}))
	for _, tc := range []struct {
		name string
		part reactor.Part
		want string
	}{
		{"nil child", reactor.Spawn("sp", nil, reactor.SpawnConfig{}), "nil definition"},
		{"unbound required input", reactor.Spawn("sp", child, reactor.SpawnConfig{}), `needs input "to"`},
		{"unknown input", reactor.Spawn("sp", child, reactor.SpawnConfig{Args: reactor.Bindings{"to": reactor.Const("x"), "cc": reactor.Const("y")}}), `"cc"`},
		{"bad policy", reactor.Spawn("sp", child, reactor.SpawnConfig{Args: reactor.Bindings{"to": reactor.Const("x")}, Undo: 7}), "not a SpawnUndo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reactor.Define("parent", tc.part)
			var de *reactor.DefinitionError
			require.ErrorAs(t, err, &de)
			assert.Equal(t, "sp", de.Step)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
