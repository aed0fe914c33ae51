package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// resourceStep is a step that changes resource res and records its undo;
// failUndo makes its undo fail that many times first.
func resourceStep(tr *trail, name, res string, failUndo *atomic.Int32, after ...string) engine.Part {
	return engine.Step(name, engine.StepConfig[engine.Args, string]{
		After: after,
		Run: func(ctx context.Context, _ engine.Args) (string, error) {
			tr.add("run:" + name)
			return res, nil
		},
		Undo: func(ctx context.Context, _ engine.Args, out string) error {
			tr.add("undo:" + name)
			if failUndo != nil && failUndo.Add(-1) >= 0 {
				return errors.New(name + " could not be undone")
			}
			return nil
		},
		Resource: func(_ engine.Args, out string) string { return out },
	})
}

// kept is a step without an Undo.
func kept(tr *trail, name string, after ...string) engine.Part {
	return engine.Step(name, engine.StepConfig[engine.Args, string]{
		After: after,
		Run: func(ctx context.Context, _ engine.Args) (string, error) {
			tr.add("run:" + name)
			return "", nil
		},
	})
}

func entrySteps(es []*engine.LedgerEntry, prefix string) []string {
	var out []string
	for _, e := range es {
		if len(e.Children) > 0 {
			out = append(out, entrySteps(e.Children, prefix+e.Step+"/")...)
			continue
		}
		out = append(out, prefix+e.Step)
	}
	return out
}

func reportOf(rep *engine.RollbackReport) []string {
	var out []string
	for _, e := range rep.Entries {
		out = append(out, e.Step+"="+string(e.Status))
	}
	return out
}

func auditKinds(t *testing.T, env *env, id string) []string {
	t.Helper()
	trail, err := env.engine.Audit(context.Background(), id)
	require.NoError(t, err)
	var out []string
	for _, a := range trail {
		s := string(a.Kind)
		if a.Step != "" {
			s += ":" + a.Step
		}
		out = append(out, s)
	}
	return out
}

// UndoSteps undoes only the named entries, newest first, with entries left
// between them untouched; the run keeps its status; a later Undo undoes
// the rest in the next generation.
func TestUndoStepsUndoesOnlyTheNamedSteps(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	def := engine.MustDefine("targeted-basic",
		resourceStep(tr, "a", "r:a", nil), resourceStep(tr, "b", "r:b", nil, "a"), kept(tr, "mail", "b"),
		resourceStep(tr, "c", "r:c", nil, "mail"), resourceStep(tr, "d", "r:d", nil, "c"))
	require.NoError(t, env.engine.Register(def))
	res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("tb"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)

	out, err := env.engine.UndoSteps(ctx, "tb", []string{"b", "d", "mail"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, out.Result.Status, "the run keeps its status")
	require.Empty(t, out.Unresolved)
	require.Equal(t, []string{"undo:d", "undo:b"}, undos(tr), "newest first; c in between untouched")
	require.Equal(t, 1, out.Rollback.Generation)
	require.Equal(t, []string{"mail=no_compensation_registered", "d=compensated", "b=compensated"}, reportOf(out.Rollback))
	require.Equal(t, engine.RollbackReverted, out.Rollback.Summary.Outcome)
	require.Equal(t, []string{"mail"}, out.Rollback.Summary.Kept)
	run, err := env.engine.Get(ctx, "tb")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status)
	require.Equal(t, []string{"a", "c"}, entrySteps(run.Ledger, ""), "what was not named stays applied")
	require.Contains(t, auditKinds(t, env, "tb"), "rollback_started")
	trail, err := env.engine.Audit(ctx, "tb")
	require.NoError(t, err)
	var started *engine.AuditEntry
	for i := range trail {
		if trail[i].Kind == engine.AuditRollbackStarted {
			started = &trail[i]
		}
	}
	require.NotNil(t, started)
	require.Equal(t, engine.TriggerTargeted, started.Trigger)
	require.Equal(t, engine.AuditRollbackCompleted, trail[len(trail)-1].Kind)
	require.Equal(t, engine.RollbackReverted, trail[len(trail)-1].Outcome)

	// The whole undo takes what is left, in the next generation.
	und, err := env.engine.Undo(ctx, "tb")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, und.Status)
	require.Equal(t, []string{"undo:d", "undo:b", "undo:c", "undo:a"}, undos(tr))
	rep, err := env.engine.RollbackReport(ctx, "tb")
	require.NoError(t, err)
	require.Equal(t, 2, rep.Generation)
	for _, e := range rep.Entries {
		require.NotEqual(t, engine.RollbackFailed, e.Status, e.Step)
	}
}

func undos(tr *trail) []string {
	var out []string
	for _, s := range tr.all() {
		if len(s) > 5 && s[:5] == "undo:" {
			out = append(out, s)
		}
	}
	return out
}

// A step of a composed child is named by its path and undone inside its
// parent's entry; naming the compose step takes what is left of it.
func TestUndoStepsInsideAComposedChild(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	child := engine.MustDefine("targeted-child", resourceStep(tr, "reserve", "seat", nil), resourceStep(tr, "pay", "card", nil, "reserve"))
	def := engine.MustDefine("targeted-compose", resourceStep(tr, "a", "r:a", nil),
		engine.Compose("book", child, engine.ComposeConfig{After: []string{"a"}}), resourceStep(tr, "z", "r:z", nil, "book"))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("tc"))
	require.NoError(t, err)

	_, err = env.engine.UndoSteps(ctx, "tc", []string{"book/pay"})
	require.NoError(t, err)
	require.Equal(t, []string{"undo:pay"}, undos(tr))
	run, err := env.engine.Get(ctx, "tc")
	require.NoError(t, err)
	require.Equal(t, []string{"a", "book/reserve", "z"}, entrySteps(run.Ledger, ""))

	out, err := env.engine.UndoSteps(ctx, "tc", []string{"book", "a"})
	require.NoError(t, err)
	require.Equal(t, []string{"undo:pay", "undo:reserve", "undo:a"}, undos(tr))
	require.Equal(t, 2, out.Rollback.Generation)
	run, err = env.engine.Get(ctx, "tc")
	require.NoError(t, err)
	require.Equal(t, []string{"z"}, entrySteps(run.Ledger, ""), "the emptied compose entry leaves the stack")
	require.Equal(t, engine.StatusCompleted, run.Status)
}

// A request that would undo an entry while a newer entry on the same
// resource stays applied is refused before anything runs, naming it.
func TestUndoStepsRefusesToSkipANewerEntryOnTheSameResource(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	def := engine.MustDefine("targeted-suffix",
		resourceStep(tr, "debit", "acct:1", nil), resourceStep(tr, "credit", "acct:2", nil, "debit"),
		resourceStep(tr, "fee", "acct:1", nil, "credit"))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("ts"))
	require.NoError(t, err)
	before, err := env.engine.Get(ctx, "ts")
	require.NoError(t, err)

	_, err = env.engine.UndoSteps(ctx, "ts", []string{"debit"})
	var roe *engine.ResourceOrderError
	require.ErrorAs(t, err, &roe)
	require.Equal(t, "debit", roe.Step)
	require.Equal(t, "fee", roe.Newer)
	require.Equal(t, "acct:1", roe.Resource)
	require.ErrorContains(t, err, `include "fee" in the request`)
	require.Empty(t, undos(tr), "refused before anything ran")
	after, err := env.engine.Get(ctx, "ts")
	require.NoError(t, err)
	require.Equal(t, before.Version, after.Version, "nothing was written")

	_, err = env.engine.UndoSteps(ctx, "ts", []string{"credit"})
	require.NoError(t, err, "another resource is independent")
	_, err = env.engine.UndoSteps(ctx, "ts", []string{"debit", "fee"})
	require.NoError(t, err)
	require.Equal(t, []string{"undo:credit", "undo:fee", "undo:debit"}, undos(tr))
}

// A named step with nothing to undo is unresolved: audited, reported, not
// an error. Unknown names and wrong statuses are refused.
func TestUndoStepsUnresolvedIsNotAFault(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	skipper := engine.Step("maybe", engine.StepConfig[engine.Args, string]{
		After: []string{"a"},
		Run:   func(context.Context, engine.Args) (string, error) { return "", engine.Skip("not today") },
		Undo:  func(context.Context, engine.Args, string) error { tr.add("undo:maybe"); return nil },
	})
	def := engine.MustDefine("targeted-unresolved", resourceStep(tr, "a", "r:a", nil), skipper, resourceStep(tr, "b", "r:b", nil, "maybe"))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("tu"))
	require.NoError(t, err)

	out, err := env.engine.UndoSteps(ctx, "tu", []string{"maybe"})
	require.NoError(t, err, "a step that never completed is not a fault")
	require.Equal(t, []engine.UnresolvedStep{{Step: "maybe", Reason: engine.ReasonNotCompleted}}, out.Unresolved)
	require.Nil(t, out.Rollback, "nothing was undone, no rollback generation")
	require.Equal(t, engine.StatusCompleted, out.Result.Status)
	require.Contains(t, auditKinds(t, env, "tu"), "unresolved:maybe")

	_, err = env.engine.UndoSteps(ctx, "tu", []string{"b"})
	require.NoError(t, err)
	out, err = env.engine.UndoSteps(ctx, "tu", []string{"b"})
	require.NoError(t, err)
	require.Equal(t, []engine.UnresolvedStep{{Step: "b", Reason: engine.ReasonAlreadyCompensated}}, out.Unresolved)
	require.Equal(t, 1, tr.count("undo:b"), "never undone twice")
	trail, err := env.engine.Audit(ctx, "tu")
	require.NoError(t, err)
	last := trail[len(trail)-1]
	require.Equal(t, engine.AuditUnresolved, last.Kind)
	require.Equal(t, engine.ReasonAlreadyCompensated, last.Reason)

	_, err = env.engine.UndoSteps(ctx, "tu", []string{"nope"})
	require.ErrorIs(t, err, engine.ErrUnknownStep)
	_, err = env.engine.UndoSteps(ctx, "tu", []string{"a/inner"})
	require.ErrorIs(t, err, engine.ErrUnknownStep)
	_, err = env.engine.UndoSteps(ctx, "tu", nil)
	require.ErrorIs(t, err, engine.ErrNoStepsNamed)

	_, err = env.engine.Undo(ctx, "tu")
	require.NoError(t, err)
	_, err = env.engine.UndoSteps(ctx, "tu", []string{"a"})
	var se *engine.StatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, string(engine.OpUndoSteps), se.Op)
	require.ErrorIs(t, err, engine.ErrNotUndoable)
	_, err = env.engine.Check(ctx, "tu", engine.OpUndoSteps)
	require.ErrorIs(t, err, engine.ErrNotUndoable)
}

// A failing target does not stop the others; it stays applied, reported
// compensation_failed, and can be named again.
func TestUndoStepsFailedTargetStaysApplied(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	var failB atomic.Int32
	failB.Store(1)
	def := engine.MustDefine("targeted-fail", resourceStep(tr, "a", "r:a", nil), resourceStep(tr, "b", "r:b", &failB, "a"),
		resourceStep(tr, "c", "r:c", nil, "b"))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("tf"))
	require.NoError(t, err)

	out, err := env.engine.UndoSteps(ctx, "tf", []string{"a", "b", "c"})
	require.NoError(t, err)
	require.Equal(t, []string{"undo:c", "undo:b", "undo:a"}, undos(tr), "b's failure did not stop a")
	require.Equal(t, []string{"c=compensated", "b=compensation_failed", "a=compensated"}, reportOf(out.Rollback))
	require.Equal(t, engine.RollbackNeedsHuman, out.Rollback.Summary.Outcome)
	run, err := env.engine.Get(ctx, "tf")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status)
	require.Equal(t, []string{"b"}, entrySteps(run.Ledger, ""))
	require.Equal(t, engine.RollbackFailed, run.Ledger[0].Status)

	out, err = env.engine.UndoSteps(ctx, "tf", []string{"b"})
	require.NoError(t, err)
	require.Equal(t, 2, tr.count("undo:b"))
	require.Equal(t, []string{"c=compensated", "b=compensated", "a=compensated"}, reportOf(out.Rollback))
	require.Equal(t, engine.RollbackReverted, out.Rollback.Summary.Outcome)
	run, err = env.engine.Get(ctx, "tf")
	require.NoError(t, err)
	require.Empty(t, run.Ledger)
}

// A composed child's steps without an Undo are reported kept
// (no_compensation_registered) in their turn when the parent is undone,
// though the child's step records are gone once it folded.
func TestKeptStepsOfAComposedChildAreReported(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	child := engine.MustDefine("kept-child", resourceStep(tr, "reserve", "seat", nil), kept(tr, "mail", "reserve"),
		resourceStep(tr, "pay", "card", nil, "mail"))
	quiet := engine.MustDefine("kept-quiet", kept(tr, "log"))
	def := engine.MustDefine("kept-parent", engine.Compose("book", child, engine.ComposeConfig{}),
		engine.Compose("note", quiet, engine.ComposeConfig{After: []string{"book"}}))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("kept"))
	require.NoError(t, err)
	_, err = env.engine.Undo(ctx, "kept")
	require.NoError(t, err)
	rep, err := env.engine.RollbackReport(ctx, "kept")
	require.NoError(t, err)
	require.Equal(t, []string{"note/log=no_compensation_registered", "book/pay=compensated",
		"book/mail=no_compensation_registered", "book/reserve=compensated"}, reportOf(rep))
	require.Equal(t, []string{"note/log", "book/mail"}, rep.Summary.Kept)
}
