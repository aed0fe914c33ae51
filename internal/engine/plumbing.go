package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/store"
)

// The functions in this file are the engine's plumbing for goreactor's own
// packages (mapstep's element runs, worker, sweeper, dashboard). They are
// package-level functions rather than methods so that package reactor's
// aliases of Engine and Definition carry none of them: package reactor
// re-exports every exported identifier of this package except the ones
// declared in plumbing*.go files (see reactor/facade_test.go).

// Process executes the stored run id the way a worker's delivery does.
func Process(e *Engine, ctx context.Context, id string) (*Result, error) { return e.process(ctx, id) }

// ExecuteElement runs a map element under id with the given inputs.
func ExecuteElement(e *Engine, ctx context.Context, def *Definition, id string, inputs map[string]Raw) (*Result, error) {
	return e.executeElement(ctx, def, id, inputs)
}

// Element loads an element run.
func Element(e *Engine, ctx context.Context, id string) (*Run, error) { return e.element(ctx, id) }

// UndoElement rolls an element run back.
func UndoElement(e *Engine, ctx context.Context, id string, wait time.Duration) (*Result, error) {
	return e.undoElement(ctx, id, wait)
}

// RetryElementRollback retries generation gen of an element's rollback.
func RetryElementRollback(e *Engine, ctx context.Context, id string, gen int, wait time.Duration) (*Result, error) {
	return e.retryElementRollback(ctx, id, gen, wait)
}

// StopElement stops an element that has not started, under its lock.
func StopElement(e *Engine, ctx context.Context, reactorName, id string, fn func(ctx context.Context) error) error {
	return e.stopElement(ctx, reactorName, id, fn)
}

// Locked reports whether run id's lock is held.
func Locked(e *Engine, ctx context.Context, id string) (bool, error) { return e.locked(ctx, id) }

// Runs loads the listed runs (nil for one not found).
func Runs(e *Engine, ctx context.Context, ids []string) ([]*Run, error) { return e.runs(ctx, ids) }

// ElementRuns returns the stored element runs of fan-out maps, by id
// ("<map id>.<i>"), in one round trip, nil where none is stored.
func ElementRuns(e *Engine, ctx context.Context, ids []string) ([]*Run, error) {
	return e.elementRuns(ctx, ids)
}

// WaitsForPerson reports, per id, whether its stored run waits for a person.
func WaitsForPerson(e *Engine, ctx context.Context, ids []string) ([]bool, error) {
	return e.waitingForPerson(ctx, ids)
}

// Client is the engine's Redis client.
func Client(e *Engine) redis.UniversalClient { return e.client() }

// Prefix is the engine's key prefix.
func Prefix(e *Engine) string { return e.prefix() }

// Acks is how the engine's progress writes wait for replicas
// (Config.ReplicaAcks), nil when they do not: the map layer's settles
// wait the same way.
func Acks(e *Engine) *store.Acks { return e.store.Acks() }

// EnqueuerOf is the engine's configured Enqueuer (nil if none).
func EnqueuerOf(e *Engine) Enqueuer { return e.enqueuer() }

// Logger is the engine's logger.
func Logger(e *Engine) *slog.Logger { return e.logger() }

// Tracer is the engine's tracer.
func Tracer(e *Engine) trace.Tracer { return e.tracer() }

// Emit delivers ev to the engine's hooks.
func Emit(e *Engine, ctx context.Context, ev Event) { e.emit(ctx, ev) }

// LockExpiry is the engine's run lock lease.
func LockExpiry(e *Engine) time.Duration { return e.lockExpiry() }

// Retention is how long a finished run's keys live.
func Retention(e *Engine) time.Duration { return e.retention() }

// SetClockSkew shifts the engine's view of the Redis clock (tests).
func SetClockSkew(e *Engine, d time.Duration) { e.clockSkew.Store(d.Milliseconds()) }

// EngineFrom is the engine executing the step whose context ctx is.
func EngineFrom(ctx context.Context) *Engine { return engineFrom(ctx) }

// ConstructAt is the construct at a step path of def.
func ConstructAt(def *Definition, path string) (Construct, bool) {
	c, ok := def.constructAt(path)
	return c, ok && c != nil
}

// DefinitionFor is the registered definition that may execute a stored run.
func DefinitionFor(e *Engine, id, name, fp string) (*Definition, error) {
	return e.definitionFor(id, name, fp, 0)
}

// NoteDefinitionWait records that run id waits for its definition.
func NoteDefinitionWait(e *Engine, ctx context.Context, id, name string, err error) error {
	return e.noteDefinitionWait(ctx, id, name, err)
}

// InterruptStep returns the path of an interrupt step of d or of a child
// it composes ("" when it has none): what a construct that cannot pause
// its parts (a map's elements) refuses at Define.
func InterruptStep(d *Definition) string {
	for _, s := range d.order {
		switch {
		case s.kind == kindInterrupt:
			return s.name
		case s.child != nil:
			if p := InterruptStep(s.child); p != "" {
				return s.name + "/" + p
			}
		}
	}
	return ""
}
