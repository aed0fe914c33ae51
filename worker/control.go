package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
)

// TypeControl carries out an operator's request on a stored run (undo,
// cancel, retry, rollback), enqueued by a Controller.
const TypeControl = "goreactor:control"

// Action is what a control request asks of a stored run. Each action has
// the name of the reactor.Op it carries out (ActionUndo is reactor.OpUndo,
// Engine.Undo of the whole run); reactor.OpResolve has no action, since a
// resolution needs no worker (reactor.Engine.Resolve).
type Action string

// Control actions, each carried out by a worker with the engine call of the
// same name.
const (
	// ActionUndo rolls back a finished run that kept its effects
	// (reactor.Engine.Undo).
	ActionUndo Action = "undo"
	// ActionCancel stops a live run at its next checkpoint and rolls it
	// back (reactor.Engine.Cancel).
	ActionCancel Action = "cancel"
	// ActionRetry runs a failed or cancelled run again under a new id
	// (reactor.Engine.Retry).
	ActionRetry Action = "retry"
	// ActionRollback re-triggers the rollback of a failed or cancelled run
	// that left entries applied, retrying only those
	// (reactor.Engine.RetryRollback). The request names the rollback
	// generation it saw, so it runs once however often it is delivered.
	ActionRollback Action = "rollback"
	// ActionUndoSteps undoes named completed steps of a finished run that
	// kept its effects and keeps the rest (reactor.Engine.UndoSteps). It
	// names its steps: request it with Controller.RequestUndoSteps.
	ActionUndoSteps Action = "undo_steps"
)

// ErrInvalidSteps refuses a RequestUndoSteps whose step names cannot be
// valid (none, an empty name, an empty path segment): nothing is queued.
var ErrInvalidSteps = errors.New("worker: invalid steps for undo_steps")

// ParseAction returns the Action named s ("undo", "cancel", "retry",
// "rollback", "undo_steps").
func ParseAction(s string) (Action, error) {
	switch a := Action(s); a {
	case ActionUndo, ActionCancel, ActionRetry, ActionRollback, ActionUndoSteps:
		return a, nil
	}
	return "", fmt.Errorf("worker: unknown action %q: want %q, %q, %q, %q or %q", s, ActionUndo, ActionCancel, ActionRetry,
		ActionRollback, ActionUndoSteps)
}

func (a Action) op() (reactor.Op, error) {
	switch a {
	case ActionUndo:
		return reactor.OpUndo, nil
	case ActionCancel:
		return reactor.OpCancel, nil
	case ActionRetry:
		return reactor.OpRetry, nil
	case ActionRollback:
		return reactor.OpRollback, nil
	case ActionUndoSteps:
		return reactor.OpUndoSteps, nil
	}
	_, err := ParseAction(string(a))
	return "", err
}

// DefaultControlRetention is how long a carried-out control request stays
// recorded in asynq, unless ControllerConfig.Retention says otherwise.
const DefaultControlRetention = 10 * time.Minute

// ControllerConfig configures a Controller.
type ControllerConfig struct {
	// Client is the Redis client holding the runs and the workers' asynq
	// queues. Required.
	Client redis.UniversalClient
	// Prefix is the runs' key prefix, as the workers' engines have it.
	// Default GOREACTOR_PREFIX, else "goreactor".
	Prefix string
	// Queue is the asynq queue the control tasks go to, one the workers
	// serve, for runs that recorded no queue (runs made before goreactor
	// recorded every run's queue, and in-process runs; a run enqueued
	// records its queue and gets its control tasks there). Default: the
	// first queue GOREACTOR_QUEUE names, else DefaultQueue, the workers'
	// default.
	Queue string
	// Retention keeps a carried-out request recorded this long, so that the
	// same request made again (a double click) is still recognised as a
	// duplicate after a worker finished it. Default
	// DefaultControlRetention (10 minutes).
	Retention time.Duration
	// Logger receives the controller's logs. Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with every unset field at its default.
func (c ControllerConfig) WithDefaults() ControllerConfig {
	if c.Prefix == "" {
		c.Prefix = envconfig.Prefix()
	}
	if c.Queue == "" {
		c.Queue = envconfig.Queue()
	}
	if c.Retention <= 0 {
		c.Retention = DefaultControlRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c ControllerConfig) validate() error {
	if c.Client == nil {
		return errors.New("worker: ControllerConfig.Client is required")
	}
	return nil
}

// Controller turns an operator's request on a stored run (undo, cancel,
// retry, rollback) into a control task that a worker carries out. It holds no reactor
// definitions, so a process without them (a dashboard) can use it: it
// validates the request against the stored run by the engine's own rules,
// then enqueues. It is safe for concurrent use.
type Controller struct {
	cfg    ControllerConfig
	engine *reactor.Engine // reads runs only: no definitions, no Enqueuer
	client *asynq.Client
	insp   *asynq.Inspector
}

// NewController returns a Controller. It loads the engine's Lua scripts, so
// an unreachable Redis fails here. It does not own cfg.Client.
func NewController(ctx context.Context, cfg ControllerConfig) (*Controller, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e, err := reactor.NewEngine(ctx, reactor.Config{Client: cfg.Client, Prefix: cfg.Prefix, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, engine: e, client: asynq.NewClientFromRedisClient(cfg.Client),
		insp: asynq.NewInspectorFromRedisClient(cfg.Client)}, nil
}

// Request is a control request as it was queued.
type Request struct {
	RunID  string
	Action Action
	// Steps are the steps an ActionUndoSteps request names, as given
	// (without repeats); nil for the other actions.
	Steps []string
	// TaskID is the control task's id, "ctl:<run>:<action>:<n>", with n
	// the run's version when the request was made; an ActionUndoSteps
	// request adds ":<h>", a digest of its set of steps.
	TaskID string
	// Queue is the asynq queue the control task went to: the run's own
	// queue, or ControllerConfig.Queue for a run that recorded none. A
	// worker serving it carries the request out.
	Queue string
	// Duplicate is true when the same request was already queued (or was
	// carried out within the retention): nothing new was queued. A request
	// whose earlier task was archived (it failed for good) is queued again
	// and is not a duplicate.
	Duplicate bool
}

// Request validates action on run runID and queues it for a worker. An
// unknown run is an error wrapping reactor.ErrNotFound; a status that
// refuses the action is a *reactor.StatusError whose message is the
// engine's reason (what Engine.Undo, Cancel or Retry would say now). The
// task id names the request: the action and the run's version, so the same
// request made twice before the run changes (a double click) queues one
// task and reports Duplicate. The worker checks again when it carries the
// request out; a request that no longer applies by then (the run finished,
// was undone) is archived with the reason, not retried.
//
// ActionUndoSteps names steps: request it with RequestUndoSteps (here it is
// refused with ErrInvalidSteps).
func (c *Controller) Request(ctx context.Context, runID string, action Action) (Request, error) {
	if action == ActionUndoSteps {
		return Request{}, fmt.Errorf("%w: %w (use Controller.RequestUndoSteps)", ErrInvalidSteps, reactor.ErrNoStepsNamed)
	}
	return c.request(ctx, runID, action, nil)
}

// RequestUndoSteps validates an undo of the named steps of run runID
// (reactor.Engine.UndoSteps: "charge", or "book/reserve" for a step of
// composed child book) and queues it for a worker, as Request does. Steps
// must name at least one step, none of them empty (ErrInvalidSteps,
// wrapping reactor.ErrNoStepsNamed when there is none); a status that
// refuses it is a *reactor.StatusError (Op "undo_steps"). The task id names
// the run's version and the set of steps, so the same steps requested twice
// (in any order) queue one task, while other steps at the same version are
// another request. The resource-order rule and a run stopped mid-step are
// judged before anything is queued (reactor.Engine.CheckUndoSteps); whether
// each name is a step of the run's definition is judged by the worker (the
// Controller holds no definitions), which archives a request it refuses
// with the engine's reason.
func (c *Controller) RequestUndoSteps(ctx context.Context, runID string, steps []string) (Request, error) {
	steps, err := validSteps(steps)
	if err != nil {
		return Request{}, err
	}
	return c.request(ctx, runID, ActionUndoSteps, steps)
}

// validSteps returns steps without repeats, or ErrInvalidSteps.
func validSteps(steps []string) ([]string, error) {
	if len(steps) == 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSteps, reactor.ErrNoStepsNamed)
	}
	out := make([]string, 0, len(steps))
	for i, s := range steps {
		if s == "" {
			return nil, fmt.Errorf("%w: step %d is empty", ErrInvalidSteps, i+1)
		}
		if slices.Contains(strings.Split(s, "/"), "") {
			return nil, fmt.Errorf("%w: step %q has an empty path segment (want \"step\" or \"compose/step\")", ErrInvalidSteps, s)
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

func (c *Controller) request(ctx context.Context, runID string, action Action, steps []string) (Request, error) {
	op, err := action.op()
	if err != nil {
		return Request{}, err
	}
	var run *reactor.Run
	if action == ActionUndoSteps {
		// The steps are judged too, as far as the stored run tells.
		run, err = c.engine.CheckUndoSteps(ctx, runID, steps)
	} else {
		run, err = c.engine.Check(ctx, runID, op)
	}
	if err != nil {
		return Request{}, err
	}
	p := controlPayload{RunID: runID, Action: action, Version: run.Version, Steps: steps}
	if action == ActionRollback {
		p.Gen = run.RollbackGeneration
	}
	req := Request{RunID: runID, Action: action, Steps: steps, TaskID: p.taskID()}
	body, err := codec.Marshal(p)
	if err != nil {
		return Request{}, err
	}
	// A run enqueued on a queue of its own (reactor.WithQueue) is served
	// by the workers that hold its definition: its control task goes there.
	queue := c.cfg.Queue
	if run.Queue != "" {
		queue = run.Queue
	}
	req.Queue = queue
	task := asynq.NewTask(TypeControl, body)
	topts := []asynq.Option{asynq.TaskID(req.TaskID), asynq.Queue(queue), asynq.MaxRetry(DefaultMaxRetry),
		asynq.Timeout(DefaultTaskTimeout), asynq.Retention(c.cfg.Retention)}
	_, err = c.client.EnqueueContext(ctx, task, topts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		// The same request is queued, running, or carried out: a
		// duplicate. One that was archived (it failed for good, say on
		// workers without the run's definition) is not: the request is
		// made again, or it could never be.
		info, ierr := c.insp.GetTaskInfo(queue, req.TaskID)
		if ierr == nil && info.State == asynq.TaskStateArchived {
			if derr := c.insp.DeleteTask(queue, req.TaskID); derr != nil && !errors.Is(derr, asynq.ErrTaskNotFound) {
				return Request{}, fmt.Errorf("worker: replace archived %s: %w", req.TaskID, derr)
			}
			_, err = c.client.EnqueueContext(ctx, task, topts...)
		}
	}
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		req.Duplicate = true
	case err != nil:
		return Request{}, fmt.Errorf("worker: enqueue %s: %w", req.TaskID, err)
	}
	attrs := []any{"event", "worker.control.requested", "run", runID, "action", string(action), "task", req.TaskID,
		"queue", queue, "duplicate", req.Duplicate}
	if steps != nil {
		attrs = append(attrs, "steps", steps)
	}
	c.cfg.Logger.InfoContext(ctx, "control request queued", attrs...)
	return req, nil
}

// controlPayload is the payload of a control task (msgpack).
type controlPayload struct {
	RunID  string `msgpack:"run"`
	Action Action `msgpack:"action"`
	// Version is the run's version when the request was made: it names the
	// request in the task id.
	Version int64 `msgpack:"v"`
	// Gen is the rollback generation a rollback request retries
	// (reactor.FromGeneration); 0 for the other actions.
	Gen int `msgpack:"g,omitempty"`
	// Steps are the steps an undo_steps request names.
	Steps []string `msgpack:"s,omitempty"`
}

func (p controlPayload) taskID() string {
	id := "ctl:" + p.RunID + ":" + string(p.Action) + ":" + strconv.FormatInt(p.Version, 10)
	if p.Action == ActionUndoSteps {
		id += ":" + stepsDigest(p.Steps)
	}
	return id
}

// stepsDigest names a set of steps: 12 hex digits of the SHA-256 of the
// sorted names, each length-prefixed, so the order they were given in does
// not matter and no two sets share a digest by concatenation.
func stepsDigest(steps []string) string {
	sorted := slices.Clone(steps)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	h := sha256.New()
	for _, s := range sorted {
		_, _ = h.Write([]byte(strconv.Itoa(len(s)) + ":" + s))
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// errMalformedControl marks a control payload no retry can fix.
var errMalformedControl = errors.New("worker: malformed control payload")

func decodeControl(b []byte) (controlPayload, error) {
	var p controlPayload
	if err := codec.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%w: %v", errMalformedControl, err)
	}
	if err := keys.ValidateID(p.RunID); err != nil {
		return p, fmt.Errorf("%w: run id: %v", errMalformedControl, err)
	}
	if _, err := p.Action.op(); err != nil {
		return p, fmt.Errorf("%w: %v", errMalformedControl, err)
	}
	if p.Action == ActionUndoSteps {
		if _, err := validSteps(p.Steps); err != nil {
			return p, fmt.Errorf("%w: %v", errMalformedControl, err)
		}
	}
	return p, nil
}

// handleControl carries out a control request with the engine's own call.
// A request that no longer applies (the run finished or was undone since,
// or is gone), or an undo_steps request the engine refuses (a name that is
// no step of the definition, a newer entry on the same resource left out),
// is archived with the engine's reason: retrying cannot make it apply. A run locked by another process snoozes the request.
func (w *Worker) handleControl(ctx context.Context, t *asynq.Task) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("worker: panic handling %s: %v\n%s", t.Type(), r, debug.Stack())
		}
	}()
	p, err := decodeControl(t.Payload())
	if err != nil {
		w.log.Error("archiving undecodable task", "event", "worker.task.malformed", "type", t.Type(), "error", err)
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	attrs := []any{"run", p.RunID, "action", string(p.Action), "requested_at_version", p.Version}
	var res *reactor.Result
	switch p.Action {
	case ActionUndo:
		res, err = w.engine.Undo(ctx, p.RunID)
	case ActionCancel:
		err = w.engine.Cancel(ctx, p.RunID)
	case ActionRetry:
		res, err = w.engine.Retry(ctx, p.RunID)
		if res != nil {
			attrs = append(attrs, "retry", res.RunID)
		}
	case ActionRollback:
		var opts []reactor.RollbackOption
		if p.Gen > 0 {
			opts = append(opts, reactor.FromGeneration(p.Gen))
		}
		res, err = w.engine.RetryRollback(ctx, p.RunID, opts...)
		attrs = append(attrs, "generation", p.Gen+1)
	case ActionUndoSteps:
		attrs = append(attrs, "steps", p.Steps)
		var out *reactor.StepsUndone
		if out, err = w.engine.UndoSteps(ctx, p.RunID, p.Steps); out != nil {
			res = out.Result
			if len(out.Unresolved) > 0 {
				attrs = append(attrs, "unresolved", out.Unresolved)
			}
		}
	}
	var se *reactor.StatusError
	var roe *reactor.ResourceOrderError
	switch {
	case err == nil:
		if res != nil {
			attrs = append(attrs, "status", res.Status)
		}
		w.log.InfoContext(ctx, "control request carried out", append([]any{"event", "worker.control.done"}, attrs...)...)
		return nil
	case errors.Is(err, reactor.ErrRunLocked), errors.Is(err, reactor.ErrLockLost):
		return &SnoozeError{RunID: p.RunID, Base: w.cfg.Snooze}
	case errors.Is(err, reactor.ErrDefinitionMismatch):
		return w.refuse(ctx, "control request", p.RunID, err)
	case errors.As(err, &se), errors.Is(err, reactor.ErrNotFound), errors.As(err, &roe),
		errors.Is(err, reactor.ErrUnknownStep), errors.Is(err, reactor.ErrNoStepsNamed):
		// The request is refused as it stands: retrying cannot change it.
		w.log.InfoContext(ctx, "control request no longer applies; archived", append([]any{"event", "worker.control.refused", "reason", err.Error()}, attrs...)...)
		return fmt.Errorf("worker: %s of run %s no longer applies: %w: %w", p.Action, p.RunID, err, asynq.SkipRetry)
	case errors.Is(err, reactor.ErrUnknownReactor):
		w.unknownReactor(ctx, "", "control request", p.RunID)
	}
	return err
}
