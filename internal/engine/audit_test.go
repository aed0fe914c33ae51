package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
)

// secret is free text a failing undo returns: personal data the audit must
// never hold in clear.
const secret = "refund to jane.doe@example.com failed"

// auditSaga: a, a composed child book (x, z), no_undo (no Undo), c (its
// Undo fails with secret), d (fails; its Compensate succeeds).
func auditSaga(tr *trail) *engine.Definition {
	child := engine.MustDefine("audit-book",
		simple(tr, "x", nil),
		simple(tr, "z", nil, "x"),
	)
	return engine.MustDefine("audit-saga",
		simple(tr, "a", nil),
		engine.Compose("book", child, engine.ComposeConfig{After: []string{"a"}}),
		engine.Step("no_undo", engine.StepConfig[engine.Args, int]{After: []string{"book"},
			Run: func(context.Context, engine.Args) (int, error) { tr.add("run:no_undo"); return 1, nil }}),
		engine.Step("c", engine.StepConfig[engine.Args, int]{
			After: []string{"no_undo"},
			Run:   func(context.Context, engine.Args) (int, error) { return 1, nil },
			Undo:  func(context.Context, engine.Args, int) error { tr.add("undo:c"); return errors.New(secret) },
		}),
		engine.Step("d", engine.StepConfig[engine.Args, int]{
			After: []string{"c"},
			Run: func(context.Context, engine.Args) (int, error) {
				return 0, engine.Permanent(errors.New("card declined"))
			},
			Compensate: func(context.Context, engine.Args, error) error { tr.add("compensate:d"); return nil },
		}),
	)
}

// auditLine renders an entry as kind:step:status.
func auditLine(a engine.AuditEntry) string {
	return fmt.Sprintf("%s:%s:%s", a.Kind, a.Step, a.Status)
}

// TestRollbackReportAndAuditTrail: a failed run is rolled back newest first,
// the composed child's entries undone inside its turn, the failing undo
// isolated (the older entries are still undone), the step without Undo
// reported kept in its turn; the report and the audit say so, entry by
// entry, and the audit holds the failure's message only as its sha256.
func TestRollbackReportAndAuditTrail(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	res, err := env.engine.Run(ctx, auditSaga(env.trail), nil, engine.WithRunID("saga-1"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, []string{"run:a", "run:x", "run:z", "run:no_undo",
		"compensate:d", "undo:c", "undo:z", "undo:x", "undo:a"}, env.trail.all(),
		"newest first, the child's entries inside the compose step's turn, and c's failure stops nothing")

	rep, err := env.engine.RollbackReport(ctx, "saga-1")
	require.NoError(t, err)
	require.Equal(t, "saga-1:rb:1", rep.RollbackID)
	require.Equal(t, 1, rep.Generation)
	require.Equal(t, engine.StatusFailed, rep.Status)
	var got []string
	for i, e := range rep.Entries {
		require.Equal(t, i+1, e.Order)
		got = append(got, fmt.Sprintf("%s:%s:%s:%d", e.Step, e.Status, e.Action, e.Attempts))
		if e.Action != engine.ActionNone {
			require.False(t, e.StartedAt.IsZero(), "%s has its start", e.Step)
			require.False(t, e.FinishedAt.Before(e.StartedAt), "%s", e.Step)
		} else {
			require.True(t, e.StartedAt.IsZero())
		}
	}
	require.Equal(t, []string{
		"d:compensated:compensate:1",
		"c:compensation_failed:undo:1",
		"no_undo:no_compensation_registered:none:0",
		"book/z:compensated:undo:1",
		"book/x:compensated:undo:1",
		"a:compensated:undo:1",
	}, got)
	require.Equal(t, secret, rep.Entries[1].Message, "the readable message stays on the run")
	require.Equal(t, engine.RollbackSummary{Outcome: engine.RollbackNeedsHuman, Settled: true, Total: 6,
		Compensated: 4, Failed: 1, Kept: []string{"no_undo"}, NeedsHuman: []string{"c"}}, rep.Summary)

	run, err := env.engine.Get(ctx, "saga-1")
	require.NoError(t, err)
	audit, err := env.engine.Audit(ctx, "saga-1")
	require.NoError(t, err)
	var lines []string
	for i, a := range audit {
		lines = append(lines, auditLine(a))
		require.Equal(t, run.TraceID, a.TraceID, "entry %d carries the run's trace id", i)
		require.NotEmpty(t, a.TraceID)
		require.False(t, a.At.IsZero())
		if i > 0 {
			require.Greater(t, a.ID, audit[i-1].ID, "stream order")
			require.False(t, a.At.Before(audit[i-1].At), "server time does not go back")
		}
		if a.Kind != engine.AuditEligible {
			require.Equal(t, 1, a.Generation, "%s", auditLine(a))
		}
	}
	require.Equal(t, []string{
		"eligible:a:pending",
		"eligible:book/x:pending",
		"eligible:book/z:pending",
		"eligible:book:pending",
		"eligible:c:pending",
		"rollback_started:d:",
		"compensating:d:compensating",
		"compensated:d:compensated",
		"compensating:c:compensating",
		"compensation_failed:c:compensation_failed",
		"no_compensation:no_undo:no_compensation_registered",
		"compensating:book/z:compensating",
		"compensated:book/z:compensated",
		"compensating:book/x:compensating",
		"compensated:book/x:compensated",
		"compensating:a:compensating",
		"compensated:a:compensated",
		"rollback_completed::",
	}, lines)
	require.Equal(t, engine.TriggerFailure, audit[5].Trigger)
	require.Equal(t, engine.RollbackNeedsHuman, audit[len(audit)-1].Outcome)
	require.Equal(t, 1, audit[0].Attempt, "an eligible entry names the attempt that completed the step")
	require.Equal(t, 2, audit[2].Ordinal, "a child's ordinals are its own")
	failed := audit[9]
	require.Equal(t, engine.ActionUndo, failed.Action)
	require.Equal(t, engine.ReasonUnregistered, failed.Reason, "a plain error has no code of its own")
	require.Equal(t, engine.HashMessage(secret), failed.MessageHash)
	require.True(t, strings.HasPrefix(failed.MessageHash, "sha256:"))
	require.Len(t, failed.MessageHash, len("sha256:")+64)

	raw, err := env.rdb.XRange(ctx, keys.New(env.prefix).RunAudit("saga-1"), "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, raw, len(audit))
	for _, m := range raw {
		for k, v := range m.Values {
			require.NotContains(t, fmt.Sprint(v), "jane.doe", "field %s of %s holds the plain message", k, m.ID)
		}
	}
}

// TestAuditCarriesTheOTelTraceID: with a tracer provider, a run started under
// a span takes its trace id, and every audit entry carries it.
func TestAuditCarriesTheOTelTraceID(t *testing.T) {
	t.Parallel()
	tp, _ := spanTracer(t)
	env := newEnv(t, func(c *engine.Config) { c.TracerProvider = tp })
	ctx, span := tp.Tracer("test").Start(ctxTimeout(t), "caller")
	defer span.End()
	res, err := env.engine.Run(ctx, auditSaga(env.trail), nil, engine.WithRunID("traced"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	want := span.SpanContext().TraceID().String()
	audit, err := env.engine.Audit(ctx, "traced")
	require.NoError(t, err)
	require.NotEmpty(t, audit)
	for _, a := range audit {
		require.Equal(t, want, a.TraceID, "%s", auditLine(a))
	}
}

// TestUndoTimeoutFailsTheEntry: an Undo that hangs is cut off by its step's
// UndoTimeout, or else Config.UndoTimeout, and its entry is
// compensation_failed; the entries after it are still undone.
func TestUndoTimeoutFailsTheEntry(t *testing.T) {
	t.Parallel()
	env := newEnv(t, func(c *engine.Config) { c.UndoTimeout = 100 * time.Millisecond })
	hang := func(name string, own time.Duration, after ...string) engine.Part {
		return engine.Step(name, engine.StepConfig[engine.Args, int]{
			After: after, UndoTimeout: own,
			Run: func(context.Context, engine.Args) (int, error) { return 1, nil },
			Undo: func(ctx context.Context, _ engine.Args, _ int) error {
				<-ctx.Done()
				return ctx.Err()
			},
		})
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // lets the abandoned call end (goleak)
	def := engine.MustDefine("audit-hang",
		simple(env.trail, "a", nil),
		hang("engine_default", 0, "a"),
		hang("own", 20*time.Millisecond, "engine_default"),
		engine.Step("deaf", engine.StepConfig[engine.Args, int]{
			After: []string{"own"}, UndoTimeout: 20 * time.Millisecond,
			Run: func(context.Context, engine.Args) (int, error) { return 1, nil },
			Undo: func(context.Context, engine.Args, int) error {
				<-release // ignores its context
				return nil
			},
		}),
		simple(env.trail, "boom", engine.Permanent(errors.New("boom")), "deaf"),
	)
	ctx := ctxTimeout(t)
	began := time.Now()
	res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("hang"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Less(t, time.Since(began), 5*time.Second)
	rep, err := env.engine.RollbackReport(ctx, "hang")
	require.NoError(t, err)
	byStep := map[string]engine.RollbackEntry{}
	for _, e := range rep.Entries {
		byStep[e.Step] = e
	}
	for _, s := range []string{"own", "engine_default"} {
		require.Equal(t, engine.RollbackFailed, byStep[s].Status, s)
		require.Equal(t, "reactor.deadline_exceeded", byStep[s].Reason, s)
	}
	require.Equal(t, engine.RollbackFailed, byStep["deaf"].Status, "an undo deaf to its context is abandoned")
	require.Equal(t, "reactor.timeout", byStep["deaf"].Reason)
	require.Contains(t, byStep["deaf"].Message, "did not return after its context ended")
	own := byStep["own"].FinishedAt.Sub(byStep["own"].StartedAt)
	def30 := byStep["engine_default"].FinishedAt.Sub(byStep["engine_default"].StartedAt)
	require.Less(t, own, 100*time.Millisecond, "the step's own UndoTimeout wins")
	require.GreaterOrEqual(t, def30, 100*time.Millisecond, "Config.UndoTimeout bounds the others")
	require.Equal(t, engine.RollbackCompensated, byStep["a"].Status, "a timed-out entry stops nothing")
	require.Equal(t, engine.RollbackNeedsHuman, rep.Summary.Outcome)
}

// TestUndoOfACompletedRunReportsKeptEffects: steps without Undo cost nothing
// forward (no ledger entry) and are reported kept when the run is undone;
// the rollback is reverted, with the kept effects listed. A run whose steps
// have no Undo at all has nothing to do.
func TestUndoOfACompletedRunReportsKeptEffects(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	plain := func(name string, after ...string) engine.Part {
		return engine.Step(name, engine.StepConfig[engine.Args, int]{After: after,
			Run: func(context.Context, engine.Args) (int, error) { return 1, nil }})
	}
	ctx := ctxTimeout(t)
	def := engine.MustDefine("audit-kept", simple(env.trail, "a", nil), plain("email", "a"), simple(env.trail, "b", nil, "email"))
	res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("kept"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)
	run, err := env.engine.Get(ctx, "kept")
	require.NoError(t, err)
	var onLedger []string
	for _, e := range run.Ledger {
		onLedger = append(onLedger, e.Step)
	}
	require.Equal(t, []string{"a", "b"}, onLedger, "a step without Undo is not on the ledger")
	_, err = env.engine.RollbackReport(ctx, "kept")
	require.ErrorIs(t, err, engine.ErrNoRollback)
	_, err = env.engine.RollbackReport(ctx, "no-such-run")
	require.ErrorIs(t, err, engine.ErrNotFound)

	_, err = env.engine.Undo(ctx, "kept")
	require.NoError(t, err)
	rep, err := env.engine.RollbackReport(ctx, "kept")
	require.NoError(t, err)
	var got []string
	for _, e := range rep.Entries {
		got = append(got, e.Step+":"+string(e.Status))
	}
	require.Equal(t, []string{"b:compensated", "email:no_compensation_registered", "a:compensated"}, got)
	require.Equal(t, engine.RollbackReverted, rep.Summary.Outcome)
	require.Equal(t, []string{"email"}, rep.Summary.Kept)
	audit, err := env.engine.Audit(ctx, "kept")
	require.NoError(t, err)
	require.Equal(t, engine.TriggerUndo, audit[2].Trigger, "%v", audit[2])
	require.Equal(t, engine.RollbackReverted, audit[len(audit)-1].Outcome)

	none := engine.MustDefine("audit-none", plain("n1"), plain("n2", "n1"),
		engine.Step("fail", engine.StepConfig[engine.Args, int]{After: []string{"n2"},
			Run: func(context.Context, engine.Args) (int, error) { return 0, engine.Permanent(errors.New("no")) }}))
	res, err = env.engine.Run(ctx, none, nil, engine.WithRunID("none"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Empty(t, res.Failure.RollbackFailures, "kept effects do not fail the rollback")
	rep, err = env.engine.RollbackReport(ctx, "none")
	require.NoError(t, err)
	require.Equal(t, engine.RollbackNothingToDo, rep.Summary.Outcome)
	require.Equal(t, []string{"fail", "n2", "n1"}, rep.Summary.Kept)
}

// TestAuditExpiresWithTheRun: the terminal write gives the stream the run's
// retention; an Undo makes it live again, and its terminal write expires it
// again.
func TestAuditExpiresWithTheRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t, func(c *engine.Config) { c.Retention = time.Hour })
	ctx := ctxTimeout(t)
	key := keys.New(env.prefix).RunAudit("ttl")
	def := engine.MustDefine("audit-ttl", simple(env.trail, "a", nil), simple(env.trail, "b", nil, "a"))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("ttl"))
	require.NoError(t, err)
	requireTTL := func() {
		t.Helper()
		ttl, err := env.rdb.PTTL(ctx, key).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, 50*time.Minute)
		require.LessOrEqual(t, ttl, time.Hour)
	}
	requireTTL()
	_, err = env.engine.Undo(ctx, "ttl")
	require.NoError(t, err)
	requireTTL()
	n, err := env.rdb.XLen(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, int64(2+1+4+1), n, "eligible a, b; rollback_started; two undos; rollback_completed")
}

// TestSummarizeRollbackEveryCombination checks the summary against an
// independent statement of its rule over every sequence of up to three
// statuses (an unknown one among them).
func TestSummarizeRollbackEveryCombination(t *testing.T) {
	t.Parallel()
	all := append(engine.RollbackStatuses(), "bogus")
	require.Len(t, all, 12, "a new status needs its expectation below")
	var seqs [][]engine.RollbackStatus
	var gen func(prefix []engine.RollbackStatus)
	gen = func(prefix []engine.RollbackStatus) {
		seqs = append(seqs, prefix)
		if len(prefix) == 3 {
			return
		}
		for _, s := range all {
			gen(append(append([]engine.RollbackStatus(nil), prefix...), s))
		}
	}
	gen(nil)
	require.Len(t, seqs, 1+12+144+1728)
	for _, seq := range seqs {
		entries := make([]engine.RollbackEntry, len(seq))
		has := map[engine.RollbackStatus]int{}
		var kept, human, outOfWindow, leftApplied []string
		for i, s := range seq {
			entries[i] = engine.RollbackEntry{Step: fmt.Sprintf("s%d", i), Status: s}
			has[s]++
			switch s {
			case engine.RollbackNoCompensation:
				kept = append(kept, entries[i].Step)
			case engine.RollbackLeftApplied:
				leftApplied = append(leftApplied, entries[i].Step)
			case engine.RollbackOutOfWindow:
				outOfWindow = append(outOfWindow, entries[i].Step)
			case engine.RollbackFailed, engine.RollbackConflict, engine.RollbackNeedsPerson, engine.RollbackBlocked, "bogus":
				human = append(human, entries[i].Step)
			}
		}
		reverted := has[engine.RollbackCompensated] + has[engine.RollbackManuallyReverted]
		want := engine.RollbackNothingToDo
		if reverted > 0 {
			want = engine.RollbackReverted
		}
		if len(leftApplied)+len(outOfWindow) > 0 {
			want = engine.RollbackKeptInPlace // never reverted while an undoable effect is in place
		}
		if len(human) > 0 {
			want = engine.RollbackNeedsHuman
		}
		if has[engine.RollbackPending]+has[engine.RollbackCompensating] > 0 {
			want = engine.RollbackInProgress
		}
		got := engine.SummarizeRollback(entries)
		name := fmt.Sprint(seq)
		require.Equal(t, want, got.Outcome, name)
		require.Equal(t, has[engine.RollbackPending]+has[engine.RollbackCompensating] == 0, got.Settled, name)
		require.Equal(t, len(seq), got.Total, name)
		require.Equal(t, reverted, got.Compensated, name)
		require.Equal(t, has[engine.RollbackPending]+has[engine.RollbackCompensating], got.Outstanding, name)
		require.Equal(t, len(human), got.Failed, name)
		require.Equal(t, kept, got.Kept, name)
		require.Equal(t, outOfWindow, got.OutOfWindow, name)
		require.Equal(t, leftApplied, got.LeftApplied, name)
		require.Equal(t, human, got.NeedsHuman, name)
		require.NotEqual(t, engine.RollbackOutcome("partial"), got.Outcome)
	}
}

// TestRollbackStatusesAreAClosedSet: Valid knows exactly the listed
// statuses, and a run holding any other is never stored.
func TestRollbackStatusesAreAClosedSet(t *testing.T) {
	t.Parallel()
	for _, s := range engine.RollbackStatuses() {
		require.True(t, s.Valid(), s)
	}
	for _, s := range []engine.RollbackStatus{"", "partial", "Compensated", "resolved"} {
		require.False(t, s.Valid(), s)
	}
	env := newEnv(t)
	ctx := ctxTimeout(t)
	def := engine.MustDefine("audit-closed", simple(env.trail, "a", nil))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("closed"))
	require.NoError(t, err)
	before, err := env.engine.Get(ctx, "closed")
	require.NoError(t, err)

	err = engine.SaveWithLedgerStatus(ctx, env.engine, "closed", "partial")
	var se *engine.RollbackStatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, engine.RollbackStatus("partial"), se.Status)
	require.Equal(t, "a", se.Step)
	require.ErrorContains(t, err, "not one of pending, compensating, compensated, no_compensation_registered, compensation_failed, out_of_window, conflict, needs_human, blocked, manually_reverted, left_applied")
	after, err := env.engine.Get(ctx, "closed")
	require.NoError(t, err)
	require.Equal(t, before.Version, after.Version, "nothing was written")

	// Control: a known status is stored by the same path.
	require.NoError(t, engine.SaveWithLedgerStatus(ctx, env.engine, "closed", engine.RollbackCompensating))
	after, err = env.engine.Get(ctx, "closed")
	require.NoError(t, err)
	require.Equal(t, before.Version+1, after.Version)
	require.Equal(t, engine.RollbackCompensating, after.Ledger[0].Status)
}

// TestRollbackStatusWhileRollingBack: during a rollback the report lists the
// entries still on the stack, newest first, unsettled.
func TestRollbackStatusWhileRollingBack(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	entered, release := make(chan struct{}), make(chan struct{})
	def := engine.MustDefine("audit-live",
		simple(env.trail, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, int]{After: []string{"a"},
			Run: func(context.Context, engine.Args) (int, error) { return 1, nil },
			Undo: func(context.Context, engine.Args, int) error {
				close(entered)
				<-release
				return nil
			}}),
		simple(env.trail, "c", engine.Permanent(errors.New("boom")), "b"),
	)
	ctx := ctxTimeout(t)
	done := make(chan error, 1)
	go func() {
		_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("live"))
		done <- err
	}()
	<-entered
	rep, err := env.engine.RollbackReport(ctx, "live")
	require.NoError(t, err)
	require.Equal(t, engine.StatusRollingBack, rep.Status)
	require.Equal(t, engine.TriggerFailure, rep.Trigger)
	var got []string
	for _, e := range rep.Entries {
		got = append(got, fmt.Sprintf("%d:%s:%s", e.Order, e.Step, e.Status))
	}
	require.Equal(t, []string{"1:b:pending", "2:a:pending"}, got, "the stored stack, newest first")
	require.False(t, rep.Summary.Settled)
	require.Equal(t, 2, rep.Summary.Outstanding)
	close(release)
	require.NoError(t, <-done)
	rep, err = env.engine.RollbackReport(ctx, "live")
	require.NoError(t, err)
	require.True(t, rep.Summary.Settled)
	require.Equal(t, engine.RollbackReverted, rep.Summary.Outcome)
	require.Empty(t, rep.Trigger)
}

// TestAuditDiscardsAnIntentNeverRun: a cancel seen at a step's checkpoint
// rolls back before the next step's Run is called; that step's recorded
// intent is dropped, and the audit says so.
func TestAuditDiscardsAnIntentNeverRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := engine.MustDefine("audit-discard",
		engine.Step("a", engine.StepConfig[engine.Args, int]{
			Run: func(ctx context.Context, _ engine.Args) (int, error) {
				info, _ := engine.RunInfoFrom(ctx)
				// The run's lock is held here: the request waits for its
				// next checkpoint.
				return 1, env.engine.Cancel(ctx, info.RunID)
			},
			Undo: func(context.Context, engine.Args, int) error { return nil },
		}),
		simple(env.trail, "b", nil, "a"),
	)
	ctx := ctxTimeout(t)
	res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("discard"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status)
	require.Empty(t, env.trail.all(), "b never ran")
	audit, err := env.engine.Audit(ctx, "discard")
	require.NoError(t, err)
	var lines []string
	for _, a := range audit {
		lines = append(lines, auditLine(a))
	}
	require.Equal(t, []string{
		"eligible:a:pending",
		"discarded:b:",
		"rollback_started::",
		"compensating:a:compensating",
		"compensated:a:compensated",
		"rollback_completed::",
	}, lines)
}
