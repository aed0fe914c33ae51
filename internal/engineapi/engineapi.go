// Package engineapi is the engine's plumbing for goreactor's own packages
// (mapstep, worker, sweeper, the tools and the tests): executing a run as a
// worker does, element runs, the engine's Redis client, prefix and
// Enqueuer. Users never call these, so package reactor keeps them out of its
// API and hands them over through internal/enginehook.
package engineapi

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/enginehook"
	"github.com/goreactor/goreactor/reactor"
)

func result(r any, err error) (*reactor.Result, error) {
	res, _ := r.(*reactor.Result)
	return res, err
}

// Process executes a stored run as a worker does: hand-off points are passed
// through, and a context that ends leaves the run for its next delivery. It
// returns reactor.ErrRunLocked when another process holds the run.
func Process(e *reactor.Engine, ctx context.Context, id string) (*reactor.Result, error) {
	return result(enginehook.Process(e, ctx, id))
}

// ExecuteElement runs (or resumes, or reads the result of) construct element
// run id ("<mapID>.<i>") in this process.
func ExecuteElement(e *reactor.Engine, ctx context.Context, def *reactor.Definition, id string, inputs map[string]codec.Raw) (*reactor.Result, error) {
	return result(enginehook.ExecuteElement(e, ctx, def, id, inputs))
}

// Element returns a stored element run.
func Element(e *reactor.Engine, ctx context.Context, id string) (*reactor.Run, error) {
	r, err := enginehook.Element(e, ctx, id)
	run, _ := r.(*reactor.Run)
	return run, err
}

// UndoElement rolls back a construct element run, waiting up to wait for its
// lock.
func UndoElement(e *reactor.Engine, ctx context.Context, id string, wait time.Duration) (*reactor.Result, error) {
	return result(enginehook.UndoElement(e, ctx, id, wait))
}

// RetryElementRollback brings a construct element run to rollback
// generation gen (a re-triggered map rollback): it retries the entries an
// older generation left failed, undoes an element never rolled back, and
// otherwise returns the stored result. It waits up to wait for the lock.
func RetryElementRollback(e *reactor.Engine, ctx context.Context, id string, gen int, wait time.Duration) (*reactor.Result, error) {
	return result(enginehook.RetryElementRollback(e, ctx, id, gen, wait))
}

// StopElement runs fn under element run id's lock after sealing a missing
// element run finished.
func StopElement(e *reactor.Engine, ctx context.Context, reactorName, id string, fn func(ctx context.Context) error) error {
	return enginehook.StopElement(e, ctx, reactorName, id, fn)
}

// Locked reports whether some process holds run id's lock.
func Locked(e *reactor.Engine, ctx context.Context, id string) (bool, error) {
	return enginehook.Locked(e, ctx, id)
}

// Runs returns the stored root runs ids in one round trip, nil where none is
// stored (the dashboard's listings).
func Runs(e *reactor.Engine, ctx context.Context, ids []string) ([]*reactor.Run, error) {
	rs, err := enginehook.Runs(e, ctx, ids)
	if err != nil {
		return nil, err
	}
	out := make([]*reactor.Run, len(rs))
	for i, r := range rs {
		out[i], _ = r.(*reactor.Run)
	}
	return out, nil
}

// WaitsForPerson reports, for each of ids (root or map element runs, as
// the needs-human index lists them), whether its stored run still waits for
// a person: false when the run's state is gone (a root id's, else the
// element's) or the run no longer waits; true for a state it cannot decode.
func WaitsForPerson(e *reactor.Engine, ctx context.Context, ids []string) ([]bool, error) {
	return enginehook.WaitsForPerson(e, ctx, ids)
}

// Client is the engine's Redis client.
func Client(e *reactor.Engine) redis.UniversalClient { return enginehook.Client(e) }

// Prefix is the engine's key prefix.
func Prefix(e *reactor.Engine) string { return enginehook.Prefix(e) }

// Enqueuer is the engine's Enqueuer (nil when runs are in-process only).
func Enqueuer(e *reactor.Engine) reactor.Enqueuer {
	q, _ := enginehook.Enqueuer(e).(reactor.Enqueuer)
	return q
}

// Logger is the engine's logger.
func Logger(e *reactor.Engine) *slog.Logger { return enginehook.Logger(e) }

// SetClockSkew shifts the engine's readings of the Redis server's clock by
// d: tests stand in a node whose clock is ahead or behind with it.
func SetClockSkew(e *reactor.Engine, d time.Duration) { enginehook.SetClockSkew(e, d) }

// LockExpiry is the engine's lock expiry.
func LockExpiry(e *reactor.Engine) time.Duration { return enginehook.LockExpiry(e) }

// Retention is how long the engine keeps a finished run.
func Retention(e *reactor.Engine) time.Duration { return enginehook.Retention(e) }

// EngineFrom returns the engine executing the step whose context ctx is, or
// nil outside a step.
func EngineFrom(ctx context.Context) *reactor.Engine {
	e, _ := enginehook.EngineFrom(ctx).(*reactor.Engine)
	return e
}

// ConstructAt returns the construct of the step at path of def.
func ConstructAt(def *reactor.Definition, path string) (reactor.Construct, bool) {
	c, ok := enginehook.ConstructAt(def, path)
	con, _ := c.(reactor.Construct)
	return con, ok && con != nil
}

// Tracer is the tracer of e's spans (reactor.Config.TracerProvider, or the
// global provider's).
func Tracer(e *reactor.Engine) trace.Tracer { return enginehook.Tracer(e) }

// Emit logs ev and passes it to e's hooks, as the engine does its own
// events (mapstep's batch claims).
func Emit(e *reactor.Engine, ctx context.Context, ev reactor.Event) { enginehook.Emit(e, ctx, ev) }

// DefinitionFor returns the definition registered under name with
// fingerprint fp ("" takes the highest version), for a task of run id
// (the owner of a map): a *reactor.DefinitionMismatchError when this engine
// has the name under other fingerprints only, an ErrUnknownReactor error
// when it does not have the name.
func DefinitionFor(e *reactor.Engine, id, name, fp string) (*reactor.Definition, error) {
	d, err := enginehook.DefinitionFor(e, id, name, fp)
	if err != nil {
		return nil, err
	}
	return d.(*reactor.Definition), nil
}

// NoteDefinitionWait records that this process refused run id (of reactor
// name) for want of its definition, as err says: Wait's error and the
// dashboard say what the run waits for. It ignores an err that is no such
// refusal.
func NoteDefinitionWait(e *reactor.Engine, ctx context.Context, id, name string, err error) error {
	return enginehook.NoteDefinitionWait(e, ctx, id, name, err)
}
