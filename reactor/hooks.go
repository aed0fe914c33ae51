package reactor

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/enginehook"
)

// The engine's plumbing (executing a run as a worker does, element runs,
// its client, prefix and Enqueuer) is for goreactor's own packages, which
// reach it through internal/engineapi; it is not part of this package's API.
func init() {
	eng := func(e any) *Engine { return e.(*Engine) }
	enginehook.Process = func(e any, ctx context.Context, id string) (any, error) { return eng(e).process(ctx, id) }
	enginehook.ExecuteElement = func(e any, ctx context.Context, def any, id string, inputs map[string]Raw) (any, error) {
		return eng(e).executeElement(ctx, def.(*Definition), id, inputs)
	}
	enginehook.Element = func(e any, ctx context.Context, id string) (any, error) { return eng(e).element(ctx, id) }
	enginehook.UndoElement = func(e any, ctx context.Context, id string, wait time.Duration) (any, error) {
		return eng(e).undoElement(ctx, id, wait)
	}
	enginehook.StopElement = func(e any, ctx context.Context, reactorName, id string, fn func(ctx context.Context) error) error {
		return eng(e).stopElement(ctx, reactorName, id, fn)
	}
	enginehook.Locked = func(e any, ctx context.Context, id string) (bool, error) { return eng(e).locked(ctx, id) }
	enginehook.Runs = func(e any, ctx context.Context, ids []string) ([]any, error) {
		runs, err := eng(e).runs(ctx, ids)
		out := make([]any, len(runs))
		for i, r := range runs {
			if r != nil {
				out[i] = r
			}
		}
		return out, err
	}
	enginehook.Client = func(e any) redis.UniversalClient { return eng(e).client() }
	enginehook.Prefix = func(e any) string { return eng(e).prefix() }
	enginehook.Enqueuer = func(e any) any {
		if q := eng(e).enqueuer(); q != nil {
			return q
		}
		return nil
	}
	enginehook.Logger = func(e any) *slog.Logger { return eng(e).logger() }
	enginehook.Tracer = func(e any) trace.Tracer { return eng(e).tracer() }
	enginehook.Emit = func(e any, ctx context.Context, ev any) { eng(e).emit(ctx, ev.(Event)) }
	enginehook.LockExpiry = func(e any) time.Duration { return eng(e).lockExpiry() }
	enginehook.Retention = func(e any) time.Duration { return eng(e).retention() }
	enginehook.EngineFrom = func(ctx context.Context) any {
		if e := engineFrom(ctx); e != nil {
			return e
		}
		return nil
	}
	enginehook.ConstructAt = func(def any, path string) (any, bool) { return def.(*Definition).constructAt(path) }
}
