package worker_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// taskLog records which asynq task each call of a task step ran in.
type taskLog struct {
	mu    sync.Mutex
	calls []string // "<kind> <step> <attempt> <task id prefix>"
}

func (l *taskLog) add(ctx context.Context, kind, step string) {
	id, _ := asynq.GetTaskID(ctx)
	kindOf, _, _ := strings.Cut(id, ":")
	info, _ := reactor.RunInfoFrom(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, kind+" "+step+" "+itoa(info.Attempt)+" "+kindOf)
}

func (l *taskLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.calls...)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

// serveAndRun registers def on an engine of f, starts a worker of conc
// slots for it, enqueues a run with inputs and waits for its end.
func serveAndRun(ctx context.Context, t *testing.T, f *fixture, def *reactor.Definition, conc int, inputs map[string]any) (*reactor.Engine, string, *reactor.Result) {
	t.Helper()
	e := f.engine("w")
	require.NoError(t, e.Register(def))
	f.startWorker(e, func(c *worker.Config) { c.Concurrency = conc })
	res, err := e.Enqueue(ctx, def, inputs)
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	return e, res.RunID, final
}

// A Task step runs as an asynq task of its own: the run parks without its
// worker slot (the worker has one slot, so a run that kept it would wait
// for ever), a failed attempt is retried as a new task, and the step that
// consumes its result runs after it, in the run.
func TestTaskStepRunsAsItsOwnTask(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	log := &taskLog{}
	def := reactor.MustDefine("ship",
		reactor.Input[string]("order"),
		reactor.Step("label", reactor.StepConfig[reactor.Args, string]{
			Args:  reactor.Bindings{"order": reactor.FromInput("order")},
			Task:  true,
			Retry: reactor.Retry{MaxAttempts: 2},
			Run: func(ctx context.Context, a reactor.Args) (string, error) {
				log.add(ctx, "run", "label")
				if info, _ := reactor.RunInfoFrom(ctx); info.Attempt == 1 {
					return "", errors.New("printer jammed")
				}
				order, err := reactor.Arg[string](a, "order")
				return "label-" + order, err
			},
		}),
		reactor.Step("notify", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"label": reactor.FromStep("label")},
			Run: func(ctx context.Context, a reactor.Args) (string, error) {
				log.add(ctx, "run", "notify")
				l, err := reactor.Arg[string](a, "label")
				return "sent " + l, err
			},
		}),
		reactor.Returns(reactor.FromStep("notify")),
	)
	e, id, final := serveAndRun(ctx, t, f, def, 1, map[string]any{"order": "42"})
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "sent label-42", got)
	assert.Equal(t, []string{"run label 1 step", "run label 2 step", "run notify 1 resume"}, log.all(),
		"each attempt of label in a step task of its own, notify in the run's")

	tasks, err := e.StepTasks(ctx, id)
	require.NoError(t, err)
	attempts := tasks["label"]
	require.Len(t, attempts, 2)
	assert.Equal(t, "printer jammed", attempts[0].Error)
	assert.Empty(t, attempts[1].Error)
	for _, a := range attempts {
		assert.NotEmpty(t, a.Worker)
		assert.LessOrEqual(t, a.StartedAt, a.EndedAt)
	}
}

// A Task step whose run fails later is undone by a task of its own; one
// that fails itself is compensated by one. The rollback reports both.
func TestTaskStepUndoAndCompensateRunAsTasks(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	log := &taskLog{}
	task := func(name string, fail bool) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			Task: true,
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				log.add(ctx, "run", name)
				if fail {
					return "", reactor.Permanent(errors.New(name + " declined"))
				}
				return name + "-done", nil
			},
			Undo: func(ctx context.Context, _ reactor.Args, out string) error {
				if out != name+"-done" {
					return errors.New("undo got " + out)
				}
				log.add(ctx, "undo", name)
				return nil
			},
			Compensate: func(ctx context.Context, _ reactor.Args, cause error) error {
				if !strings.Contains(cause.Error(), "declined") {
					return errors.New("compensate got " + cause.Error())
				}
				log.add(ctx, "compensate", name)
				return nil
			},
		})
	}
	def := reactor.MustDefine("pay", task("reserve", false), task("charge", false),
		reactor.Step("settle", reactor.StepConfig[reactor.Args, string]{
			After: []string{"charge", "reserve"}, Task: true,
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				log.add(ctx, "run", "settle")
				return "", reactor.Permanent(errors.New("settle declined"))
			},
			Compensate: func(ctx context.Context, _ reactor.Args, _ error) error {
				log.add(ctx, "compensate", "settle")
				return nil
			},
		}))
	e, id, final := serveAndRun(ctx, t, f, def, 1, nil)
	require.Equal(t, reactor.StatusFailed, final.Status)
	require.Equal(t, "settle", final.Failure.Step)
	assert.Empty(t, final.Failure.RollbackFailures)
	assert.Equal(t, []string{
		"run reserve 1 step", "run charge 1 step", "run settle 1 step",
		"compensate settle 0 stepundo", "undo charge 0 stepundo", "undo reserve 0 stepundo",
	}, log.all())
	run, err := e.Get(ctx, id)
	require.NoError(t, err)
	statuses := map[string]reactor.RollbackStatus{}
	for _, s := range run.Rollbacks {
		statuses[s.Step] = s.Status
	}
	assert.Equal(t, reactor.RollbackCompensated, statuses["charge"])
	assert.Equal(t, reactor.RollbackCompensated, statuses["reserve"])
}

// Cancelling a run whose Task step is in flight reaches the step: its
// attempt's context is cancelled, the step is compensated by its undo task,
// and the run ends cancelled.
func TestTaskStepCancelReachesTheAttemptInFlight(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	log := &taskLog{}
	entered := make(chan struct{})
	def := reactor.MustDefine("wait-for-it",
		reactor.Step("hang", reactor.StepConfig[reactor.Args, string]{
			Task: true,
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				log.add(ctx, "run", "hang")
				close(entered)
				<-ctx.Done()
				return "", ctx.Err()
			},
			Compensate: func(ctx context.Context, _ reactor.Args, cause error) error {
				log.add(ctx, "compensate", "hang")
				return nil
			},
		}))
	e := f.engine("w")
	require.NoError(t, e.Register(def))
	f.startWorker(e, func(c *worker.Config) { c.Concurrency = 2 })
	res, err := e.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the step never started")
	}
	require.NoError(t, e.Cancel(ctx, res.RunID))
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, final.Status, "%v", final.Err())
	assert.Equal(t, []string{"run hang 1 step", "compensate hang 0 stepundo"}, log.all())
	tasks, err := e.StepTasks(ctx, res.RunID)
	require.NoError(t, err)
	attempts := tasks["hang"]
	require.Len(t, attempts, 1)
	assert.Contains(t, attempts[0].Error, "context canceled")
}

// A Task step inside a composed child runs as its own task under its path
// ("book/label"); inside a fan-out map's element, which is already a task
// of its own, it runs in place.
func TestTaskStepInAChildAndInAMapElement(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	log := &taskLog{}
	label := reactor.Step("label", reactor.StepConfig[reactor.Args, string]{
		Args: reactor.Bindings{"item": reactor.FromInput("item")},
		Task: true,
		Run: func(ctx context.Context, a reactor.Args) (string, error) {
			info, _ := reactor.RunInfoFrom(ctx)
			log.add(ctx, "run", info.Step)
			return reactor.Arg[string](a, "item")
		},
	})
	child := reactor.MustDefine("book", reactor.Input[string]("item"), label, reactor.Returns(reactor.FromStep("label")))
	element := reactor.MustDefine("book-each", reactor.Input[string]("item"), label)
	def := reactor.MustDefine("books",
		reactor.Compose("book", child, reactor.ComposeConfig{Args: reactor.Bindings{"item": reactor.Const("one")}}),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.Const([]string{"two"}), FanOut: true, After: []string{"book"}}),
		reactor.Returns(reactor.FromStep("book")),
	)
	e, id, final := serveAndRun(ctx, t, f, def, 1, nil)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "one", got)
	assert.Equal(t, []string{"run book/label 1 step", "run label 1 el"}, log.all())
	tasks, err := e.StepTasks(ctx, id)
	require.NoError(t, err)
	attempts := tasks["book/label"]
	assert.Len(t, attempts, 1)
}

// With MaxConcurrency above 1, Task steps are dispatched side by side and
// the steps that do not need them go on meanwhile: the checkout's three
// calls run as three tasks at once (each waits until all three are in), a
// plain step beside them runs while they are in flight (they wait for it),
// and the step that consumes the three runs once all have settled. When a
// later step fails, the three are undone by their tasks after the
// consumer, at once (each undo waits until all three are in).
func TestTaskStepsRunSideBySide(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	log := &taskLog{}
	meet, unmeet := barrier(3), barrier(3)
	noted := make(chan struct{})
	call := func(name string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			Task: true,
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				if err := meet(ctx, name); err != nil {
					return "", err
				}
				select {
				case <-noted:
				case <-ctx.Done():
					return "", ctx.Err()
				}
				log.add(ctx, "run", name)
				return name, nil
			},
			Undo: func(ctx context.Context, _ reactor.Args, _ string) error {
				if err := unmeet(ctx, name); err != nil {
					return err
				}
				log.add(ctx, "undo", name)
				return nil
			},
		})
	}
	def := reactor.MustDefine("side-by-side", reactor.MaxConcurrency(3),
		call("reserve"), call("authorize"), call("score"),
		reactor.Step("note", reactor.StepConfig[reactor.Args, string]{
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				log.add(ctx, "run", "note")
				close(noted)
				return "noted", nil
			},
		}),
		reactor.Step("confirm", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"r": reactor.FromStep("reserve"), "a": reactor.FromStep("authorize"), "s": reactor.FromStep("score")},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				log.add(ctx, "run", "confirm")
				return "confirmed", nil
			},
			Undo: func(ctx context.Context, _ reactor.Args, _ string) error {
				log.add(ctx, "undo", "confirm")
				return nil
			},
		}),
		reactor.Step("notify", reactor.StepConfig[reactor.Args, string]{
			After: []string{"confirm"},
			Run: func(context.Context, reactor.Args) (string, error) {
				return "", reactor.Permanent(errors.New("mail server down"))
			},
		}),
	)
	_, _, final := serveAndRun(ctx, t, f, def, 4, nil)
	require.Equal(t, reactor.StatusFailed, final.Status, "%v", final.Err())
	require.Equal(t, "notify", final.Failure.Step)
	all := log.all()
	require.Len(t, all, 9, "%v", all)
	assert.Equal(t, "run note 1 resume", all[0], "the plain step ran while the three were in flight")
	assert.ElementsMatch(t, []string{"run reserve 1 step", "run authorize 1 step", "run score 1 step"}, all[1:4])
	assert.Equal(t, "run confirm 1 resume", all[4])
	assert.Equal(t, "undo confirm 0 resume", all[5], "the consumer is undone first")
	assert.ElementsMatch(t, []string{"undo reserve 0 stepundo", "undo authorize 0 stepundo", "undo score 0 stepundo"}, all[6:])
}

// A Task step that returns Skip completes with no value (its reader sees
// the zero value, and it is never undone); one that returns Halt halts the
// run, which keeps what it did.
func TestTaskStepSkipAndHalt(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	undone := make(chan string, 4)
	task := func(name string, err error) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			Task: true,
			Run:  func(context.Context, reactor.Args) (string, error) { return name, err },
			Undo: func(context.Context, reactor.Args, string) error { undone <- name; return nil },
		})
	}
	read := reactor.Step("read", reactor.StepConfig[reactor.Args, string]{
		Args: reactor.Bindings{"v": reactor.FromStep("maybe")},
		Run: func(_ context.Context, a reactor.Args) (string, error) {
			v, err := reactor.Arg[string](a, "v")
			return "saw [" + v + "]", err
		},
	})
	skip := reactor.MustDefine("task-skip", task("maybe", reactor.Skip("nothing to print")), read,
		reactor.Step("fail", reactor.StepConfig[reactor.Args, string]{After: []string{"read"},
			Run: func(context.Context, reactor.Args) (string, error) { return "", reactor.Permanent(errors.New("no")) }}))
	halt := reactor.MustDefine("task-halt", task("first", nil), task("stop", reactor.Halt("out of stock")),
		reactor.Step("never", reactor.StepConfig[reactor.Args, string]{After: []string{"stop"},
			Run: func(context.Context, reactor.Args) (string, error) { return "", errors.New("ran after a halt") }}))
	e := f.engine("w")
	require.NoError(t, e.Register(skip, halt))
	f.startWorker(e)

	res, err := e.Enqueue(ctx, skip, nil)
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status, "%v", final.Err())
	run, err := e.Get(ctx, res.RunID)
	require.NoError(t, err)
	for _, s := range run.Steps {
		if s.Name == "read" {
			v, err := reactor.ValueOf[string](&reactor.Result{Value: s.Value})
			require.NoError(t, err)
			assert.Equal(t, "saw []", v)
		}
	}

	res, err = e.Enqueue(ctx, halt, nil)
	require.NoError(t, err)
	final, err = e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusHalted, final.Status, "%v", final.Err())
	assert.Equal(t, "out of stock", final.Reason)
	assert.Empty(t, undone, "a skipped step is never undone, a halted run undoes nothing")
}

// A worker that shuts down while a Task step's attempt runs gives the step
// back: the attempt's context ends, its lease is released, asynq delivers
// the task again, and a worker that is up runs the same attempt at once
// (no wait for a lease to lapse, no retry spent).
func TestTaskStepGivenBackByAWorkerThatStops(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	entered := make(chan int, 2)
	var n atomic.Int32
	def := reactor.MustDefine("given-back",
		reactor.Step("label", reactor.StepConfig[reactor.Args, string]{
			Task: true,
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				k := int(n.Add(1))
				entered <- k
				if k == 1 {
					<-ctx.Done() // the first delivery waits for its worker's shutdown
					return "", ctx.Err()
				}
				info, _ := reactor.RunInfoFrom(ctx)
				return "label-" + itoa(info.Attempt), nil
			},
		}),
		reactor.Returns(reactor.FromStep("label")))
	e := f.engine("w")
	require.NoError(t, e.Register(def))
	first := f.newWorker(e, func(c *worker.Config) { c.ShutdownTimeout = 100 * time.Millisecond })
	require.NoError(t, first.Start(ctx))
	res, err := e.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, 1, <-entered)
	require.NoError(t, first.Stop(ctx))
	f.startWorker(e)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "label-1", got, "the same attempt, run again")
	tasks, err := e.StepTasks(ctx, res.RunID)
	require.NoError(t, err)
	attempts := tasks["label"]
	require.Len(t, attempts, 2)
	assert.Contains(t, attempts[0].Error, "the delivery ended")
	assert.Empty(t, attempts[1].Error)
}
