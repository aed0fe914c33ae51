package dashboard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

type itemIn struct {
	Item int `json:"item"`
}

// element is a map element reactor whose undo of an odd item blocks (it
// sends on blocked, then waits for release).
func element(name string, blocked chan<- int, release <-chan struct{}) *reactor.Definition {
	return reactor.MustDefine(name, reactor.Input[int]("item"), reactor.Step("reserve", reactor.StepConfig[itemIn, int]{
		Args: reactor.Bindings{"item": reactor.FromInput("item")},
		Run:  func(_ context.Context, in itemIn) (int, error) { return in.Item, nil },
		Undo: func(ctx context.Context, _ itemIn, out int) error {
			if out%2 == 1 {
				blocked <- out
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		},
	}))
}

// The detail of a run rolling back a fan-out map: its rollback progress is
// there, adds up, and agrees with the map's element summary; once the run
// failed, the progress is gone and every element is undone.
func TestDetailRollingBackFanOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 60*time.Second)
	const n, slots = 40, 4
	blocked, release := make(chan int, n), make(chan struct{})
	elem := element("rb-elem", blocked, release)
	owner := reactor.MustDefine("rb-owner", reactor.Input[[]int]("items"),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: true, BatchSize: 10}),
		reactor.Step("decline", reactor.StepConfig[reactor.Args, string]{
			After: []string{"each"},
			Run: func(context.Context, reactor.Args) (string, error) {
				return "", reactor.Permanent(errors.New("declined"))
			},
		}))
	e.startWorker(owner, elem)
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	_, err := e.engine.Enqueue(ctx, owner, map[string]any{"items": items}, reactor.WithRunID("rb-1"))
	require.NoError(t, err)
	// Every worker slot holds a blocked undo: the rollback cannot move.
	for range slots {
		select {
		case <-blocked:
		case <-ctx.Done():
			t.Fatal("the rollback never reached the blocking undos")
		}
	}

	var d runDetail
	e.get("/api/runs/rb-1", http.StatusOK, &d)
	require.Equal(t, "rolling_back", d.Status)
	require.NotNil(t, d.Rollback, "rollback progress while rolling_back")
	require.Equal(t, n, d.Rollback.Total)
	require.Equal(t, d.Rollback.Total, d.Rollback.Settled+d.Rollback.Outstanding)
	require.GreaterOrEqual(t, d.Rollback.Outstanding, slots)
	require.Zero(t, d.Rollback.Failed)
	require.Len(t, d.Maps, 1)
	m := d.Maps[0]
	require.Equal(t, "each", m.Step)
	require.Equal(t, mapstep.MapID("rb-1", "each"), m.MapID)
	require.Equal(t, "fanout", m.Mode)
	require.Equal(t, n, m.Total)
	require.Equal(t, n, m.Dispatched)
	require.Equal(t, n, m.Settled)
	require.NotNil(t, m.Rollback)
	require.Equal(t, 1, m.Rollback.Generation)
	require.Equal(t, d.Rollback.Settled, m.Rollback.Settled)
	var stepNames []string
	for _, s := range d.Steps {
		stepNames = append(stepNames, s.Name)
	}
	require.Contains(t, stepNames, "each", "the map step is listed")

	var p elementsPage
	e.get("/api/runs/rb-1/maps/each/elements?limit=40", http.StatusOK, &p)
	require.Equal(t, n, p.Total)
	require.Equal(t, -1, p.NextFrom)
	require.Len(t, p.Elements, n)
	var undone, completed int
	for _, c := range p.Summary.Cells {
		undone += c.Undone
		completed += c.Completed
		require.Equal(t, c.To-c.From+1, c.sum())
	}
	require.Equal(t, m.Rollback.Settled, undone, "the summary agrees with the rollback counters")
	require.Equal(t, n-undone, completed)
	for _, el := range p.Elements {
		if el.State == "undone" {
			require.Equal(t, "undone", el.RollbackOutcome)
			require.Zero(t, el.Index%2, "only even items are undone while the odd ones block")
		}
	}

	// An element's own run, found by its id.
	var ed struct {
		runDetail
		Element struct {
			Owner string `json:"owner"`
			Step  string `json:"step"`
			Index int    `json:"index"`
		} `json:"element"`
	}
	e.get("/api/runs/"+mapstep.ElementID(m.MapID, 3), http.StatusOK, &ed)
	require.Equal(t, "rb-elem", ed.Reactor)
	require.Equal(t, "rb-1", ed.Element.Owner)
	require.Equal(t, "each", ed.Element.Step)
	require.Equal(t, 3, ed.Element.Index)

	close(release)
	res, err := e.engine.Wait(ctx, "rb-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	e.get("/api/runs/rb-1", http.StatusOK, &d)
	require.Equal(t, "failed", d.Status)
	require.Nil(t, d.Rollback, "no rollback progress once the run is final")
	require.Equal(t, "decline", d.Failure.Step)
	require.Equal(t, n, d.Maps[0].Rollback.Settled)
	e.get("/api/runs/rb-1/maps/each/elements?from=30&limit=5", http.StatusOK, &p)
	require.Equal(t, 35, p.NextFrom)
	require.Len(t, p.Elements, 5)
	require.Equal(t, 30, p.Elements[0].Index)
	for _, c := range p.Summary.Cells {
		require.Equal(t, c.To-c.From+1, c.Undone)
	}
}

// The element summary of a 10,000-element map: at most 1,000 cells whose
// counts add up to 10,000, read from the map's keys.
func TestElementSummaryTenThousand(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 120*time.Second)
	const n = 10_000
	elem := reactor.MustDefine("big-elem", reactor.Input[int]("item"), reactor.Step("check", reactor.StepConfig[itemIn, int]{
		Args: reactor.Bindings{"item": reactor.FromInput("item")},
		Run: func(_ context.Context, in itemIn) (int, error) {
			if in.Item%7 == 0 {
				return 0, reactor.Permanent(fmt.Errorf("item %d is a multiple of 7", in.Item))
			}
			return in.Item, nil
		},
	}))
	owner := reactor.MustDefine("big-owner", reactor.Input[[]int]("items"),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), Partial: true}))
	require.NoError(t, e.engine.Register(owner, elem))
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	res, err := e.engine.Run(ctx, owner, map[string]any{"items": items}, reactor.WithRunID("big"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)

	var p elementsPage
	e.get("/api/runs/big/maps/each/elements?from=9990", http.StatusOK, &p)
	require.Equal(t, n, p.Total)
	require.Len(t, p.Elements, 10)
	require.Equal(t, -1, p.NextFrom)
	require.LessOrEqual(t, len(p.Summary.Cells), 1000)
	require.Equal(t, 10, p.Summary.BucketSize)
	var sum, failed int
	next := 0
	for _, c := range p.Summary.Cells {
		require.Equal(t, next, c.From, "cells tile the map")
		next = c.To + 1
		sum += c.sum()
		failed += c.Failed
	}
	require.Equal(t, n, next)
	require.Equal(t, n, sum)
	require.Equal(t, (n+6)/7, failed)
	for _, el := range p.Elements {
		if el.Index%7 == 0 {
			require.Equal(t, "failed", el.State)
			require.Contains(t, el.Error, "multiple of 7")
		} else {
			require.Equal(t, "completed", el.State)
		}
	}
	var d runDetail
	e.get("/api/runs/big", http.StatusOK, &d)
	require.Len(t, d.Maps, 1)
	require.Equal(t, "inline", d.Maps[0].Mode)
	require.Equal(t, n, d.Maps[0].Settled)
	require.Equal(t, (n+6)/7, d.Maps[0].Failed)

	var eb struct{ Error string }
	e.get("/api/runs/big/maps/each/elements?limit=1001", http.StatusBadRequest, &eb)
	e.get("/api/runs/big/maps/each/elements?from=-1", http.StatusBadRequest, &eb)
}

// A run that failed inside a composed child: its steps show what ran, what
// the rollback undid and where it failed.
func TestDetailFailedInChild(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 20*time.Second)
	undoable := func(name string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			Run:  func(context.Context, reactor.Args) (string, error) { return name + "-done", nil },
			Undo: func(context.Context, reactor.Args, string) error { return nil },
		})
	}
	child := reactor.MustDefine("fc-child", undoable("reserve"), reactor.Step("charge", reactor.StepConfig[reactor.Args, string]{
		After: []string{"reserve"},
		Run: func(context.Context, reactor.Args) (string, error) {
			return "", reactor.Permanent(errors.New("card declined"))
		},
	}))
	parent := reactor.MustDefine("fc-parent", undoable("hold"), reactor.Compose("book", child, reactor.ComposeConfig{After: []string{"hold"}}))
	res, err := e.engine.Run(ctx, parent, nil, reactor.WithRunID("fc-1"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)

	var d runDetail
	e.get("/api/runs/fc-1", http.StatusOK, &d)
	require.Equal(t, "book/charge", d.Failure.Step)
	byName := map[string]string{}
	for _, s := range d.Steps {
		byName[s.Name] = s.Status
	}
	require.Equal(t, map[string]string{"hold": "undone", "book": "failed"}, byName)
	var undone []string
	for _, rb := range d.Rollbacks {
		undone = append(undone, rb.Step+":"+rb.Status)
	}
	require.Contains(t, undone, "hold:compensated")
	require.Contains(t, undone, "book/reserve:compensated")
	require.Nil(t, d.Rollback)
}

// A step that panicked: the run's failure carries the panic's stack; a
// plain failure has none.
func TestDetailPanicStack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 20*time.Second)
	def := reactor.MustDefine("ps-panic", reactor.Step("pay", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { panicWhilePaying(); return "", nil },
	}))
	res, err := e.engine.Run(ctx, def, nil, reactor.WithRunID("ps-1"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	var d runDetail
	e.get("/api/runs/ps-1", http.StatusOK, &d)
	require.Equal(t, "pay", d.Failure.Step)
	require.Contains(t, d.Failure.Message, "step panicked: the card reader caught fire")
	require.Contains(t, d.Failure.Stack, "panicWhilePaying")

	plain := reactor.MustDefine("ps-plain", reactor.Step("pay", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) {
			return "", reactor.Permanent(errors.New("card declined"))
		},
	}))
	_, err = e.engine.Run(ctx, plain, nil, reactor.WithRunID("ps-2"))
	require.NoError(t, err)
	var p runDetail
	e.get("/api/runs/ps-2", http.StatusOK, &p)
	require.Equal(t, "card declined", p.Failure.Message)
	require.Empty(t, p.Failure.Stack)
}

func panicWhilePaying() { panic("the card reader caught fire") }

// The step a run stopped at shows as it happened: failed on its third
// attempt, or halted with its reason; never pending.
func TestDetailStoppedSteps(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 20*time.Second)
	flaky := reactor.MustDefine("stop-flaky", reactor.Step("call", reactor.StepConfig[reactor.Args, string]{
		Retry: reactor.Retry{MaxAttempts: 3, Backoff: reactor.Fixed(time.Millisecond)},
		Run:   func(context.Context, reactor.Args) (string, error) { return "", errors.New("still down") },
	}))
	halting := reactor.MustDefine("stop-halt", reactor.Step("check", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "", reactor.Halt("out of stock") },
	}))
	_, err := e.engine.Run(ctx, flaky, nil, reactor.WithRunID("stop-1"))
	require.NoError(t, err)
	_, err = e.engine.Run(ctx, halting, nil, reactor.WithRunID("stop-2"))
	require.NoError(t, err)
	var d runDetail
	e.get("/api/runs/stop-1", http.StatusOK, &d)
	require.Len(t, d.Steps, 1)
	require.Equal(t, "failed", d.Steps[0].Status)
	require.Equal(t, 3, d.Steps[0].Attempts)
	e.get("/api/runs/stop-2", http.StatusOK, &d)
	require.Len(t, d.Steps, 1)
	require.Equal(t, "halted", d.Steps[0].Status)
	require.Equal(t, 1, d.Steps[0].Attempts)
}

// A run that the workers refuse for want of the definition it started with
// (a rolling deploy) says so on its page: which version it waits for, and
// what the worker that refused it has.
func TestDetailRunWaitingForItsDefinition(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 20*time.Second)
	step := reactor.Step("ship", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "shipped", nil },
	})
	v1 := reactor.MustDefine("deploy-order", step)
	v2 := reactor.MustDefine("deploy-order", reactor.Version(2), reactor.Step("dispatch", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "dispatched", nil },
	}))
	_, err := e.engine.Enqueue(ctx, v1, nil, reactor.WithRunID("deploy-1"))
	require.NoError(t, err)

	// The new deploy's worker has v2 only.
	next, err := reactor.NewEngine(ctx, reactor.Config{Client: e.rdb, Prefix: e.prefix, Logger: discard})
	require.NoError(t, err)
	require.NoError(t, next.Register(v2))
	w := worker.New(next, e.rdb, worker.Config{Queues: map[string]int{e.queue: 1}, Logger: discard, DefinitionSnooze: 20 * time.Millisecond})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })

	var d runDetail
	require.Eventually(t, func() bool {
		e.get("/api/runs/deploy-1", http.StatusOK, &d)
		return d.Waiting != ""
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, "pending", d.Status)
	require.Equal(t, reactor.DefinitionVersion{Version: 1, Fingerprint: v1.Fingerprint()}, d.Definition)
	require.Equal(t, `waiting for definition v1 (`+v1.Fingerprint()+`) of reactor "deploy-order"`, d.Waiting)
	require.Equal(t, []reactor.DefinitionVersion{{Version: 2, Fingerprint: v2.Fingerprint()}}, d.WaitingFor.Have)

	// Once a worker that has v1 took the run, it completes under v1.
	e.startWorker(v1)
	res, err := e.engine.Wait(ctx, "deploy-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	var done runDetail
	e.get("/api/runs/deploy-1", http.StatusOK, &done)
	require.Equal(t, "completed", done.Status)
	require.Empty(t, done.Waiting, "a finished run waits for nothing")
}
