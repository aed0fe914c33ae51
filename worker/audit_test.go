package worker_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// TestAuditOfAFanOutMapRollback: a fan-out map whose element fails is rolled
// back by the workers; the owner's audit shows the rollback of the map step
// and of the step before it, each element's own audit (in its own slot)
// shows its undo, and every entry carries the owner's trace id.
func TestAuditOfAFanOutMapRollback(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	type itemIn struct {
		N int `json:"n"`
	}
	element := reactor.MustDefine("audit-el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("reserve", reactor.StepConfig[itemIn, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run:  func(_ context.Context, in itemIn) (int, error) { return in.N, nil },
			Undo: func(context.Context, itemIn, int) error { return nil },
		}),
		reactor.Step("charge", reactor.StepConfig[itemIn, int]{
			Args:  reactor.Bindings{"n": reactor.FromInput("item")},
			After: []string{"reserve"},
			Run: func(_ context.Context, in itemIn) (int, error) {
				if in.N == 2 {
					return 0, reactor.Permanent(fmt.Errorf("item %d declined", in.N))
				}
				return in.N, nil
			},
		}),
	)
	owner := reactor.MustDefine("audit-owner",
		reactor.Input[[]int]("items", reactor.Required()),
		reactor.Step("prep", reactor.StepConfig[reactor.Args, int]{
			Run:  func(context.Context, reactor.Args) (int, error) { return 1, nil },
			Undo: func(context.Context, reactor.Args, int) error { return nil },
		}),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true, After: []string{"prep"}}),
	)
	e := f.engine("worker")
	require.NoError(t, e.Register(owner))
	f.startWorker(e)

	ctx := ctxTimeout(t)
	_, err := e.Enqueue(ctx, owner, map[string]any{"items": []int{0, 1, 2, 3}}, reactor.WithRunID("fan-audit"))
	require.NoError(t, err)
	res, err := e.Wait(ctx, "fan-audit")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	run, err := e.Get(ctx, "fan-audit")
	require.NoError(t, err)

	line := func(a reactor.AuditEntry) string { return fmt.Sprintf("%s:%s:%s", a.Kind, a.Step, a.Status) }
	audit, err := e.Audit(ctx, "fan-audit")
	require.NoError(t, err)
	var lines []string
	for _, a := range audit {
		require.Equal(t, run.TraceID, a.TraceID, line(a))
		lines = append(lines, line(a))
	}
	require.Equal(t, []string{
		"eligible:prep:pending",
		"rollback_started:each:",
		"compensating:each:compensating",
		"compensated:each:compensated",
		"compensating:prep:compensating",
		"compensated:prep:compensated",
		"rollback_completed::",
	}, lines)
	require.Equal(t, reactor.RollbackReverted, audit[len(audit)-1].Outcome)

	rep, err := e.RollbackReport(ctx, "fan-audit")
	require.NoError(t, err)
	require.Equal(t, reactor.RollbackReverted, rep.Summary.Outcome)

	mapID := mapstep.MapID("fan-audit", "each")
	undone := 0
	for i := range 4 {
		el, err := e.Audit(ctx, mapstep.ElementID(mapID, i))
		require.NoError(t, err)
		var got []string
		for _, a := range el {
			require.Equal(t, run.TraceID, a.TraceID, "element %d: %s", i, line(a))
			got = append(got, line(a))
		}
		if len(got) > 0 {
			er, err := e.RollbackReport(ctx, mapstep.ElementID(mapID, i))
			require.NoError(t, err, "element %d", i)
			require.Equal(t, reactor.RollbackReverted, er.Summary.Outcome, "element %d", i)
		}
		switch {
		case i == 2:
			require.Equal(t, []string{
				"eligible:reserve:pending",
				"rollback_started:charge:",
				"no_compensation:charge:no_compensation_registered",
				"compensating:reserve:compensating",
				"compensated:reserve:compensated",
				"rollback_completed::",
			}, got, "the failing element rolled itself back")
		case len(got) > 0: // completed before the map failed, then undone by its rollback job
			require.Equal(t, []string{
				"eligible:reserve:pending",
				"rollback_started::",
				"no_compensation:charge:no_compensation_registered",
				"compensating:reserve:compensating",
				"compensated:reserve:compensated",
				"rollback_completed::",
			}, got, "element %d", i)
			require.Equal(t, reactor.TriggerUndo, el[1].Trigger)
			undone++
		}
	}
	t.Logf("%d completed elements undone by rollback jobs", undone)
}

// TestAuditOfAFanOutMapUndoneAfterIt: a step after a completed fan-out map
// fails; the map's undo hands off to rollback jobs and the owner's audit
// records its compensating entry once, at the hand-off, and its outcome
// when the owner adopts the settled rollback.
func TestAuditOfAFanOutMapUndoneAfterIt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	element := reactor.MustDefine("audit-el2",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("reserve", reactor.StepConfig[reactor.Args, int]{
			Run:  func(context.Context, reactor.Args) (int, error) { return 1, nil },
			Undo: func(context.Context, reactor.Args, int) error { return nil },
		}),
	)
	owner := reactor.MustDefine("audit-owner2",
		reactor.Input[[]int]("items", reactor.Required()),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true, BatchSize: 2}),
		reactor.Step("after", reactor.StepConfig[reactor.Args, int]{
			After: []string{"each"},
			Run:   func(context.Context, reactor.Args) (int, error) { return 0, reactor.Permanent(fmt.Errorf("no")) },
		}),
	)
	e := f.engine("worker")
	require.NoError(t, e.Register(owner))
	f.startWorker(e)
	ctx := ctxTimeout(t)
	_, err := e.Enqueue(ctx, owner, map[string]any{"items": []int{0, 1, 2, 3, 4}}, reactor.WithRunID("fan-after"))
	require.NoError(t, err)
	res, err := e.Wait(ctx, "fan-after")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	audit, err := e.Audit(ctx, "fan-after")
	require.NoError(t, err)
	var lines []string
	for _, a := range audit {
		lines = append(lines, fmt.Sprintf("%s:%s:%s", a.Kind, a.Step, a.Status))
	}
	require.Equal(t, []string{
		"eligible:each:pending",
		"rollback_started:after:",
		"no_compensation:after:no_compensation_registered",
		"compensating:each:compensating",
		"compensated:each:compensated",
		"rollback_completed::",
	}, lines)
	mapID := mapstep.MapID("fan-after", "each")
	for i := range 5 {
		el, err := e.Audit(ctx, mapstep.ElementID(mapID, i))
		require.NoError(t, err)
		require.Len(t, el, 5, "element %d: eligible, rollback_started, compensating, compensated, rollback_completed", i)
		require.Equal(t, reactor.AuditCompensated, el[3].Kind)
	}
}
