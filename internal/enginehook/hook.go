// Package enginehook carries the engine's plumbing from package reactor to
// internal/engineapi without reactor exporting it: reactor sets these
// functions when it is imported, and engineapi calls them with typed
// wrappers. The values are reactor's own types behind any; nothing else
// touches them.
package enginehook

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/codec"
)

// Set by package reactor (hooks.go). e is an *reactor.Engine, def a
// *reactor.Definition; results are *reactor.Result, *reactor.Run,
// reactor.Enqueuer and reactor.Construct.
var (
	Process        func(e any, ctx context.Context, id string) (any, error)
	ExecuteElement func(e any, ctx context.Context, def any, id string, inputs map[string]codec.Raw) (any, error)
	Element        func(e any, ctx context.Context, id string) (any, error)
	UndoElement    func(e any, ctx context.Context, id string, wait time.Duration) (any, error)
	// RetryElementRollback is set by reactor/retrigger.go.
	RetryElementRollback func(e any, ctx context.Context, id string, gen int, wait time.Duration) (any, error)
	// WaitsForPerson is set by reactor/needs_human.go.
	WaitsForPerson func(e any, ctx context.Context, ids []string) ([]bool, error)
	// SetClockSkew is set by reactor/window.go (tests only).
	SetClockSkew func(e any, d time.Duration)
	StopElement  func(e any, ctx context.Context, reactorName, id string, fn func(ctx context.Context) error) error
	Locked       func(e any, ctx context.Context, id string) (bool, error)
	Runs         func(e any, ctx context.Context, ids []string) ([]any, error)
	Client       func(e any) redis.UniversalClient
	Prefix       func(e any) string
	Enqueuer     func(e any) any
	Logger       func(e any) *slog.Logger
	Tracer       func(e any) trace.Tracer
	Emit         func(e any, ctx context.Context, ev any)
	LockExpiry   func(e any) time.Duration
	Retention    func(e any) time.Duration
	EngineFrom   func(ctx context.Context) any
	ConstructAt  func(def any, path string) (any, bool)
	// DefinitionFor and NoteDefinitionWait are set by reactor/version.go.
	DefinitionFor      func(e any, id, name, fp string) (any, error)
	NoteDefinitionWait func(e any, ctx context.Context, id, name string, err error) error
)
