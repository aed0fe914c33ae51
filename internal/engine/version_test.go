package engine_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// order is the rename scenario's reactor: v1 is reserve, charge, ship; v2
// renames ship to dispatch. Every call is recorded in tr with the
// version's tag ("v1 run:ship").
func order(tr *trail, version int, last string, parts ...engine.Part) *engine.Definition {
	tag := "v1 "
	if version > 1 {
		tag = "v2 "
	}
	step := func(name string, after ...string) engine.Part {
		return engine.Step(name, engine.StepConfig[engine.Args, string]{
			After: after,
			Run: func(context.Context, engine.Args) (string, error) {
				tr.add(tag + "run:" + name)
				return name, nil
			},
			Undo: func(context.Context, engine.Args, string) error {
				tr.add(tag + "undo:" + name)
				return nil
			},
		})
	}
	ps := []engine.Part{step("reserve"), step("charge", "reserve"), step(last, "charge")}
	if version > 1 {
		ps = append(ps, engine.Version(version))
	}
	return engine.MustDefine("order", append(ps, parts...)...)
}

// otherEngine is a second engine on env's prefix: another process of the
// same deploy, or of another one.
func (e *env) otherEngine(defs ...*engine.Definition) *engine.Engine {
	e.t.Helper()
	eng, err := engine.NewEngine(context.Background(), engine.Config{Client: e.rdb, Prefix: e.prefix,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Enqueuer: nopEnqueuer{}})
	require.NoError(e.t, err)
	require.NoError(e.t, eng.Register(defs...))
	return eng
}

func TestFingerprintIsTheShape(t *testing.T) {
	tr := &trail{}
	v1 := order(tr, 1, "ship")
	require.Equal(t, 1, v1.Version())
	require.Len(t, v1.Fingerprint(), 16)
	// The same shape defined again (other function values) has the same
	// fingerprint: step bodies may change between deploys.
	require.Equal(t, v1.Fingerprint(), order(&trail{}, 1, "ship").Fingerprint())
	// What execution policy leaves the shape alone.
	retried := engine.MustDefine("order",
		engine.Step("reserve", engine.StepConfig[engine.Args, string]{
			Run:   func(context.Context, engine.Args) (string, error) { return "", nil },
			Undo:  func(context.Context, engine.Args, string) error { return nil },
			Retry: engine.Retry{MaxAttempts: 5}, Timeout: time.Minute,
		}),
		engine.Step("charge", engine.StepConfig[engine.Args, string]{After: []string{"reserve"},
			Run:  func(context.Context, engine.Args) (string, error) { return "", nil },
			Undo: func(context.Context, engine.Args, string) error { return nil }}),
		engine.Step("ship", engine.StepConfig[engine.Args, string]{After: []string{"charge"},
			Run:  func(context.Context, engine.Args) (string, error) { return "", nil },
			Undo: func(context.Context, engine.Args, string) error { return nil }}),
		engine.UndoWindow(time.Hour))
	require.Equal(t, v1.Fingerprint(), retried.Fingerprint())

	// What changes the meaning of a stored run changes it.
	changed := map[string]*engine.Definition{
		"a renamed step": order(tr, 1, "dispatch"),
		"a new version":  order(tr, 2, "ship"),
		"a step without undo": engine.MustDefine("order",
			engine.Step("reserve", engine.StepConfig[engine.Args, string]{
				Run:  func(context.Context, engine.Args) (string, error) { return "", nil },
				Undo: func(context.Context, engine.Args, string) error { return nil }}),
			engine.Step("charge", engine.StepConfig[engine.Args, string]{After: []string{"reserve"},
				Run:  func(context.Context, engine.Args) (string, error) { return "", nil },
				Undo: func(context.Context, engine.Args, string) error { return nil }}),
			engine.Step("ship", engine.StepConfig[engine.Args, string]{After: []string{"charge"},
				Run: func(context.Context, engine.Args) (string, error) { return "", nil }})),
		"another result type": engine.MustDefine("order",
			engine.Step("reserve", engine.StepConfig[engine.Args, int]{
				Run:  func(context.Context, engine.Args) (int, error) { return 0, nil },
				Undo: func(context.Context, engine.Args, int) error { return nil }}),
			engine.Step("charge", engine.StepConfig[engine.Args, string]{After: []string{"reserve"},
				Run:  func(context.Context, engine.Args) (string, error) { return "", nil },
				Undo: func(context.Context, engine.Args, string) error { return nil }}),
			engine.Step("ship", engine.StepConfig[engine.Args, string]{After: []string{"charge"},
				Run:  func(context.Context, engine.Args) (string, error) { return "", nil },
				Undo: func(context.Context, engine.Args, string) error { return nil }})),
		"a new input": order(tr, 1, "ship", engine.Input[int]("qty")),
	}
	for what, d := range changed {
		require.NotEqual(t, v1.Fingerprint(), d.Fingerprint(), what)
	}
	// A composed child's shape is part of its parent's.
	parent := func(child *engine.Definition) *engine.Definition {
		return engine.MustDefine("checkout", engine.Compose("order", child, engine.ComposeConfig{}))
	}
	require.NotEqual(t, parent(v1).Fingerprint(), parent(order(tr, 1, "dispatch")).Fingerprint())
	require.Equal(t, parent(v1).Fingerprint(), parent(order(tr, 1, "ship")).Fingerprint())

	_, err := engine.Define("order", engine.Version(0))
	require.ErrorContains(t, err, "Version must be 1 or more")
	_, err = engine.Define("order", engine.Version(2), engine.Version(3))
	require.ErrorContains(t, err, "Version declared twice")
}

func TestVersionsAreRegisteredSideBySide(t *testing.T) {
	e := newEnv(t)
	tr := &trail{}
	v1, v2 := order(tr, 1, "ship"), order(tr, 2, "dispatch")
	require.NoError(t, e.engine.Register(v2, v1))
	got, ok := e.engine.Definition("order")
	require.True(t, ok)
	require.Same(t, v2, got, "Definition returns the highest version")
	require.Equal(t, []engine.DefinitionVersion{{Version: 1, Fingerprint: v1.Fingerprint()}, {Version: 2, Fingerprint: v2.Fingerprint()}},
		e.engine.Versions("order"))
	require.NoError(t, e.engine.Register(v1), "registering the same definition again is a no-op")

	// Another definition under a taken name and version is refused, and
	// the error says how to run it beside the old one.
	err := e.engine.Register(order(tr, 1, "ship"))
	var de *engine.DefinitionError
	require.ErrorAs(t, err, &de)
	require.ErrorContains(t, err, "version 1")
	require.ErrorContains(t, err, "reactor.Version(3)")
}

// A run is executed only by the definition it started with: an engine that
// has only another version refuses it without calling a step; one that has
// both versions runs it under its own.
func TestARunExecutesOnlyUnderItsOwnDefinition(t *testing.T) {
	e := newEnv(t)
	tr := &trail{}
	v1, v2 := order(tr, 1, "ship"), order(tr, 2, "dispatch")
	old := e.otherEngine(v1)
	ctx := context.Background()
	_, err := old.Enqueue(ctx, v1, nil, engine.WithRunID("order-1"))
	require.NoError(t, err)
	run, err := old.Get(ctx, "order-1")
	require.NoError(t, err)
	require.Equal(t, v1.Fingerprint(), run.Definition.Fingerprint)
	require.Equal(t, 1, run.Definition.Version)

	// The new deploy alone: refused, nothing runs, the run is as it was.
	newOnly := e.otherEngine(v2)
	_, err = engine.Process(newOnly, ctx, "order-1")
	require.ErrorIs(t, err, engine.ErrDefinitionMismatch)
	mm, ok := errors.AsType[*engine.DefinitionMismatchError](err)
	require.True(t, ok)
	require.Equal(t, "order-1", mm.Run)
	require.Equal(t, engine.DefinitionVersion{Version: 1, Fingerprint: v1.Fingerprint()}, mm.Want)
	require.Equal(t, []engine.DefinitionVersion{{Version: 2, Fingerprint: v2.Fingerprint()}}, mm.Have)
	require.ErrorContains(t, err, "v1 ("+v1.Fingerprint()+")")
	require.Empty(t, tr.all())
	_, err = newOnly.Resume(ctx, "order-1")
	require.ErrorIs(t, err, engine.ErrDefinitionMismatch)
	require.ErrorIs(t, newOnly.Cancel(ctx, "order-1"), engine.ErrDefinitionMismatch)
	// Starting the id again with the new definition is refused too: the
	// id's run goes on under its own definition or not at all.
	_, err = newOnly.Run(ctx, v2, nil, engine.WithRunID("order-1"))
	require.ErrorIs(t, err, engine.ErrDefinitionMismatch)
	require.Empty(t, tr.all())
	run, err = newOnly.Get(ctx, "order-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusPending, run.Status)

	// A deploy that keeps v1 beside v2 runs it under v1, and a new run
	// under the definition it is started with.
	both := e.otherEngine(v1, v2)
	res, err := engine.Process(both, ctx, "order-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)
	require.Equal(t, []string{"v1 run:reserve", "v1 run:charge", "v1 run:ship"}, tr.all())
	res, err = both.Run(ctx, v2, nil, engine.WithRunID("order-2"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)
	require.Equal(t, []string{"v2 run:reserve", "v2 run:charge", "v2 run:dispatch"}, tr.all()[3:])

	// Undo follows the same rule: the new deploy alone cannot undo the v1
	// run (its ship would be forgotten); with both it undoes v1's steps.
	_, err = newOnly.Undo(ctx, "order-1")
	require.ErrorIs(t, err, engine.ErrDefinitionMismatch)
	require.Len(t, tr.all(), 6)
	res, err = both.Undo(ctx, "order-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status)
	require.Equal(t, []string{"v1 undo:ship", "v1 undo:charge", "v1 undo:reserve"}, tr.all()[6:])
}

// Wait tells a run that the workers refuse for want of its definition from
// a slow one.
func TestWaitSaysWhatDefinitionARunWaitsFor(t *testing.T) {
	e := newEnv(t)
	tr := &trail{}
	v1, v2 := order(tr, 1, "ship"), order(tr, 2, "dispatch")
	old := e.otherEngine(v1)
	ctx := context.Background()
	_, err := old.Enqueue(ctx, v1, nil, engine.WithRunID("order-w"))
	require.NoError(t, err)
	dw, err := old.DefinitionWait(ctx, "order-w")
	require.NoError(t, err)
	require.Nil(t, dw, "nobody refused it yet")

	newOnly := e.otherEngine(v2)
	_, refusal := engine.Process(newOnly, ctx, "order-w")
	require.ErrorIs(t, refusal, engine.ErrDefinitionMismatch)
	require.NoError(t, engine.NoteDefinitionWait(newOnly, ctx, "order-w", "order", refusal))
	dw, err = old.DefinitionWait(ctx, "order-w")
	require.NoError(t, err)
	require.NotNil(t, dw)
	require.Equal(t, "order", dw.Reactor)
	require.Equal(t, engine.DefinitionVersion{Version: 1, Fingerprint: v1.Fingerprint()}, dw.Want)
	require.Equal(t, []engine.DefinitionVersion{{Version: 2, Fingerprint: v2.Fingerprint()}}, dw.Have)
	require.Contains(t, dw.String(), "waiting for definition v1")
	ttl := e.rdb.PTTL(ctx, e.prefix+":{run:order-w}:waitdef").Val()
	require.Greater(t, ttl, time.Duration(0), "the note expires on its own")

	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = old.Wait(wctx, "order-w")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var dwe *engine.DefinitionWaitError
	require.ErrorAs(t, err, &dwe)
	require.ErrorContains(t, err, "waiting for definition v1")

	// A process that has the definition takes the run: the note, still
	// stored, is older than the run's last write and says nothing more.
	// The write's server-time stamp (ms) must pass the note's: wait for
	// the server's clock to leave the note's millisecond.
	note := e.rdb.Get(ctx, e.prefix+":{run:order-w}:waitdef").Val()
	stamp, _, _ := strings.Cut(note, " ")
	for strconv.FormatInt(e.rdb.Time(ctx).Val().UnixMilli(), 10) <= stamp {
	}
	_, err = engine.Process(old, ctx, "order-w")
	require.NoError(t, err)
	require.Positive(t, e.rdb.Exists(ctx, e.prefix+":{run:order-w}:waitdef").Val(), "the note has not lapsed")
	dw, err = old.DefinitionWait(ctx, "order-w")
	require.NoError(t, err)
	require.Nil(t, dw, "taken since the refusal")

	// An error that is no refusal notes nothing.
	require.NoError(t, engine.NoteDefinitionWait(newOnly, ctx, "order-x", "order", errors.New("redis down")))
	dw, err = old.DefinitionWait(ctx, "order-x")
	require.NoError(t, err)
	require.Nil(t, dw)
}
