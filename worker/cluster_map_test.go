package worker_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// startCountedMap sets up the map the cluster tests move and fail over:
// an owner <name>_owner mapping n elements (batch by batch) of one 2 ms
// step each, which count calls at every run and undo, then failing, so the
// map rolls back; an engine and an in-process worker (concurrency 8, 2 s
// locks) on cc. The engine's and worker's logs go to logs, printed when
// the test fails.
func startCountedMap(t *testing.T, ctx context.Context, cc redis.UniversalClient, name, prefix, queue string, n, batch int,
	count func(ctx context.Context, what string, n int) error) (*reactor.Engine, *reactor.Definition, *worker.Client, *syncBuffer) {
	t.Helper()
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	elem := reactor.MustDefine(name+"_el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("a", reactor.StepConfig[migrateIn, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run: func(ctx context.Context, in migrateIn) (int, error) {
				time.Sleep(2 * time.Millisecond) // the element's work
				return in.N, count(ctx, "ran", in.N)
			},
			Undo: func(ctx context.Context, in migrateIn, _ int) error {
				time.Sleep(2 * time.Millisecond)
				return count(ctx, "undone", in.N)
			},
		}))
	owner := reactor.MustDefine(name+"_owner",
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.Const(items), FanOut: true, BatchSize: batch}),
		reactor.Step("boom", reactor.StepConfig[reactor.Args, int]{
			After: []string{"each"},
			Run:   func(context.Context, reactor.Args) (int, error) { return 0, reactor.Permanent(errors.New("boom")) },
		}))

	client := worker.NewClient(cc, queue)
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	eng, err := reactor.NewEngine(ctx, reactor.Config{Client: cc, Prefix: prefix, Enqueuer: client, Logger: logger,
		LockExpiry: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, eng.Register(owner, elem))
	w := worker.New(eng, cc, worker.Config{Queues: map[string]int{queue: 1}, Concurrency: 8, Logger: logger})
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range strings.Split(logs.String(), "\n") {
				if l != "" && !strings.Contains(l, "event=reactor.step") {
					t.Log(l)
				}
			}
		}
	})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	return eng, owner, client, logs
}
