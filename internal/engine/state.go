package engine

import (
	"fmt"
	"sort"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
)

// runState is what a run persists (msgpack, short keys). A composed child in
// progress is embedded in its parent's state, so one fenced write saves a
// whole run tree.
type runState struct {
	ID      string `msgpack:"id"`
	Reactor string `msgpack:"r"`
	// Def and DefVersion are the fingerprint and version of the definition
	// the run started with: only that definition executes or rolls it back
	// (version.go). Empty in runs stored before runs recorded it.
	Def        string              `msgpack:"df,omitempty"`
	DefVersion int                 `msgpack:"dv,omitempty"`
	Status     Status              `msgpack:"s"`
	Inputs     map[string]Raw      `msgpack:"in"`
	Steps      map[string]*stepRec `msgpack:"st"`
	// Ledger is the undo stack, oldest first.
	Ledger []*LedgerEntry `msgpack:"l,omitempty"`
	// Seq numbers ledger entries.
	Seq int `msgpack:"q,omitempty"`
	// Constructs holds the state of construct steps in progress, by step.
	Constructs map[string]Raw `msgpack:"cs,omitempty"`
	// Children holds composed child runs in progress, by compose step.
	Children map[string]*runState `msgpack:"ch,omitempty"`
	// Rollback is set while rolling back.
	Rollback *RollbackRecord `msgpack:"rb,omitempty"`
	// Undone records what each rollback did to each step, in order.
	Undone []StepRollback `msgpack:"u,omitempty"`
	// Retry is the rollback generation and the entries the latest
	// rollback could not undo, for RetryRollback (retrigger.go).
	Retry *rollbackRetry `msgpack:"rt,omitempty"`
	// RbGen is the generation of the run's latest rollback (0: it never
	// rolled back); it outlives the rollback record, for the report.
	RbGen int `msgpack:"rg,omitempty"`
	// AuditSeq is the highest ledger ordinal whose eligible entry is on the
	// audit stream (or pending on the next write): save audits the entries
	// above it (audit.go).
	AuditSeq int `msgpack:"aq,omitempty"`
	// Clock is the latest Redis server time (Unix ms) the run recorded: a
	// reading earlier than it is a clock that went backwards (window.go).
	Clock int64 `msgpack:"clk,omitempty"`
	// RbWindowAt is the server time at which the latest rollback judged
	// the undo windows (0: none did); a re-triggered rollback keeps it.
	RbWindowAt int64 `msgpack:"rwa,omitempty"`
	// Book holds one record per ledger entry a rollback reached, in the
	// order they were first reached: what every generation reads and
	// writes (book.go).
	Book []*entryRec `msgpack:"bk,omitempty"`
	// Held is what the elements of the run's maps still hold after their
	// rollbacks, by map step path (as the maps counted it).
	Held map[string]Held `msgpack:"hd,omitempty"`

	// Starts holds when each step that started and has no record yet
	// (running, or the step that failed) started, in Unix ms: the step's
	// record takes it over when it completes (stepRec.StartedAt).
	Starts map[string]int64 `msgpack:"sa,omitempty"`
	// Tries holds the attempt log of each step that has one and no record
	// yet (running, or the step that failed or halted): the step's record
	// takes it over when it completes (attempts.go).
	Tries map[string]*attemptLog `msgpack:"al,omitempty"`

	// Intent is the plain step this frame runs next, saved by the checkpoint
	// before its Run is called (the previous step's checkpoint carries it),
	// with the attempt it is on. A state read back with an intent may have
	// had that step's Run called by a process that died before recording
	// its result: a forward resume runs it again, and a rollback compensates
	// it (or reports it) instead of forgetting it.
	Intent *intentRec `msgpack:"it,omitempty"`

	// Stop is the step the run stopped at without completing it: the one
	// that failed or halted, or the one cut short that its rollback found
	// (nil otherwise), with its attempt.
	Stop *StepStop `msgpack:"sp,omitempty"`

	// Pause is the interrupt the run waits at (nil when it waits at none),
	// and Pauses numbers the run's pauses (interrupt.go).
	Pause  *pauseRec `msgpack:"pz,omitempty"`
	Pauses int       `msgpack:"pzn,omitempty"`
	// Inflight are the intents of a wave of steps called at once
	// (MaxConcurrency, concurrent.go) whose outcomes are not recorded yet.
	Inflight []*intentRec `msgpack:"ifl,omitempty"`
	// RunAdmitted: the run's own rate limits admitted it (RunLimits),
	// once; later executions take only their slots.
	RunAdmitted bool `msgpack:"rla,omitempty"`

	// Wake is the id of the last wake-up task enqueued for the run, saved
	// before the enqueue, so the sweeper can tell whether it is still queued.
	Wake string `msgpack:"w,omitempty"`

	// Queue is the asynq queue of the run's wake-ups ("" for the
	// Enqueuer's own), chosen with WithQueue when the run was created.
	Queue string `msgpack:"qu,omitempty"`
	// Deadline is the run's deadline in Unix milliseconds (0: none).
	Deadline int64 `msgpack:"dl,omitempty"`
	// Trace is the run's trace id (RunInfo.TraceID).
	Trace string `msgpack:"tr,omitempty"`
	// Elem is where an element run belongs (nil for any other run).
	Elem *elementRec `msgpack:"el,omitempty"`
	// RetryOf is the run this one retries (Engine.Retry); RetriedBy lists
	// the retries of this run, oldest first, each recorded before it is
	// created (retry_run.go).
	RetryOf   string   `msgpack:"rof,omitempty"`
	RetriedBy []string `msgpack:"rby,omitempty"`
	// SpawnedBy is the run and step that spawned this run (Spawn);
	// Spawned lists the runs this run's spawn steps started, in order.
	SpawnedBy *SpawnLink  `msgpack:"spb,omitempty"`
	Spawned   []SpawnLink `msgpack:"sps,omitempty"`
	// Sensitive marks a sensitive run (Run.Sensitive), from its creation.
	Sensitive bool `msgpack:"sen,omitempty"`

	Value     Raw      `msgpack:"v,omitempty"`
	Failure   *Failure `msgpack:"f,omitempty"`
	Reason    string   `msgpack:"why,omitempty"`
	CreatedAt int64    `msgpack:"c"`
	UpdatedAt int64    `msgpack:"t"`
}

type stepState string

const (
	stepDone    stepState = "done"
	stepSkipped stepState = "skipped"
)

// intentRec is a step about to run or running, and its attempt (1-based).
// Attempts that returned an error are counted durably: a crash never sends a
// step back to attempt 1, so Retry.MaxAttempts bounds its failures.
type intentRec struct {
	Step    string `msgpack:"s"`
	Attempt int    `msgpack:"a,omitempty"`
	// Interrupted counts the executions that found this intent on record
	// and so may have been cut short inside the step (a dead process, an
	// ended delivery): past maxInterruptions the step fails instead of
	// killing its workers for ever.
	Interrupted int `msgpack:"x,omitempty"`
	// Scheduled marks an intent saved with a scheduled retry wake-up: the
	// process left on purpose, nothing was cut short.
	Scheduled bool `msgpack:"sch,omitempty"`
}

// StopKind says how a step stopped without completing.
type StopKind string

// How a step stopped (Run.Stopped).
const (
	// StopFailed: the step failed (its last attempt returned an error).
	StopFailed StopKind = "failed"
	// StopHalted: the step halted the run (reactor.Halt).
	StopHalted StopKind = "halted"
	// StopInterrupted: the step's Run was called but its result never
	// recorded (a dead process, a run cut short mid-step): its rollback
	// compensates it.
	StopInterrupted StopKind = "interrupted"
)

// StepStop is the step a run stopped at without completing it, with the
// attempt it was on and how it stopped.
type StepStop struct {
	Step    string   `msgpack:"s"`
	Attempt int      `msgpack:"a,omitempty"`
	How     StopKind `msgpack:"h"`
}

// stopped records that step name of st stopped (how), on the attempt its
// intent holds (1 when none does).
func (st *runState) stopped(name string, how StopKind) {
	attempt := 1
	if in := st.Intent; in != nil && in.Step == name {
		attempt = max(in.Attempt, 1)
	}
	st.Stop = &StepStop{Step: name, Attempt: attempt, How: how}
}

type stepRec struct {
	State    stepState `msgpack:"s"`
	Value    Raw       `msgpack:"v,omitempty"`
	Attempts int       `msgpack:"a,omitempty"`
	// StartedAt and FinishedAt are when the step started (its first
	// attempt, in the first execution that reached it) and when it
	// completed or was skipped, in Unix ms; 0 in states written before
	// they were recorded.
	StartedAt  int64 `msgpack:"sa,omitempty"`
	FinishedAt int64 `msgpack:"fa,omitempty"`
	// Log is the step's attempt log and kept arguments (nil for a step
	// that completed on its first attempt with none kept: attempts.go).
	Log *attemptLog `msgpack:"al,omitempty"`
}

// stepStarted records that step name starts at now, unless it started
// before (a retried or resumed step keeps its first start).
func (st *runState) stepStarted(name string, now time.Time) {
	if _, ok := st.Starts[name]; ok {
		return
	}
	if st.Starts == nil {
		st.Starts = map[string]int64{}
	}
	st.Starts[name] = now.UnixMilli()
}

// stepFinished stamps the record of step name, which just completed or was
// skipped, with its start and now.
func (st *runState) stepFinished(name string, now time.Time) {
	rec, ok := st.Steps[name]
	if !ok {
		return
	}
	rec.StartedAt, rec.FinishedAt = st.Starts[name], now.UnixMilli()
	if rec.StartedAt == 0 {
		rec.StartedAt = rec.FinishedAt
	}
	delete(st.Starts, name)
}

// LedgerEntry is one completed, undoable step on a run's undo stack.
type LedgerEntry struct {
	// Ordinal orders entries within a run (1, 2, ...).
	Ordinal int `msgpack:"o"`
	// Step is the step's name.
	Step string `msgpack:"step"`
	// Args is a snapshot of the arguments the step saw.
	Args Raw `msgpack:"args,omitempty"`
	// Result is the step's result.
	Result Raw `msgpack:"res,omitempty"`
	// Status is the entry's rollback status (pending until undone).
	Status RollbackStatus `msgpack:"status"`
	// Children are a composed child's entries, folded into the compose
	// step's entry, oldest first.
	Children []*LedgerEntry `msgpack:"ch,omitempty"`
	// Interrupted marks a step whose Run was called but whose result was
	// never recorded (its process died, or the run was cut short mid-step):
	// its effect may or may not have happened, so the rollback calls its
	// Compensate, which must tolerate both.
	Interrupted bool `msgpack:"int,omitempty"`
	// At is when the step completed, by the Redis server's clock, in Unix
	// ms (0 when unknown): what an undo window is measured from.
	At int64 `msgpack:"at,omitempty"`
	// Resource names what the step changed (StepConfig.Resource), "" when
	// it names nothing: an undo of named steps is refused when it would
	// leave a newer entry on the same resource applied.
	Resource string `msgpack:"rs,omitempty"`
	// Target marks an entry UndoSteps is undoing.
	Target bool `msgpack:"tg,omitempty"`
	// Effect is what a guarded step recorded (RecordEffect): its
	// resource is Resource.
	Effect *effectRec `msgpack:"ef,omitempty"`
	// Kept lists, on a compose step's entry, the child's steps that
	// completed without an Undo, in completion order: a rollback reports
	// them no_compensation_registered in their turn (the child's step
	// records are gone once it folded).
	Kept []string `msgpack:"kp,omitempty"`
}

// entryID names a ledger entry within its run: "<step path>#<ordinal>".
func entryID(path string, ordinal int) string { return fmt.Sprintf("%s#%d", path, ordinal) }

// RollbackTrigger says what started a rollback.
type RollbackTrigger string

// Rollback triggers.
const (
	// TriggerFailure: a step failed.
	TriggerFailure RollbackTrigger = "failure"
	// TriggerUndo: Undo or Cancel was called.
	TriggerUndo RollbackTrigger = "undo"
	// TriggerStep: a composed child rolls back inside the parent's step.
	TriggerStep RollbackTrigger = "step"
	// TriggerTargeted: UndoSteps undoes named steps of a finished run,
	// which keeps its status and its other steps' effects.
	TriggerTargeted RollbackTrigger = "targeted"
)

// RollbackRecord is saved with status rolling_back before the first
// compensation side effect, so a crash mid-rollback resumes the rollback
// instead of retrying the failed step.
type RollbackRecord struct {
	Trigger RollbackTrigger `msgpack:"trigger"`
	// Step is the failing step ("" for an undo).
	Step string `msgpack:"step,omitempty"`
	// Compensated is true once the failing step's compensate was called.
	Compensated bool `msgpack:"compensated"`
	// Failure is the Failure the run will end with, captured when the
	// rollback started; rollback failures are added as they happen.
	Failure *Failure `msgpack:"failure,omitempty"`
	// CompensationError is the failing step's compensate error, if any.
	CompensationError string `msgpack:"compensation_error,omitempty"`
	// Generation numbers the run's rollbacks (1 for the first; a
	// re-triggered rollback gets the next). 0 in records written before
	// generations were kept, which means 1.
	Generation int `msgpack:"gen,omitempty"`
	// WindowAt is the server time (Unix ms) at which the rollback judged
	// its entries' undo windows (0: not judged, or no window applies).
	WindowAt int64 `msgpack:"wa,omitempty"`
	// Targeted is set on the rollback of UndoSteps.
	Targeted *targetedRec `msgpack:"tg,omitempty"`
}

// generation is rb's generation, 1 for a record that predates them.
func (rb *RollbackRecord) generation() int {
	if rb == nil || rb.Generation < 1 {
		return 1
	}
	return rb.Generation
}

// StepRollback is the stored record of what a rollback did for one step
// (Run.Rollbacks); Engine.RollbackReport derives its entries from these.
type StepRollback struct {
	Step    string             `msgpack:"step"`
	Ordinal int                `msgpack:"o,omitempty"`
	Kind    CompensatingAction `msgpack:"kind"`
	Status  RollbackStatus     `msgpack:"status"`
	Reason  string             `msgpack:"reason,omitempty"`
	Message string             `msgpack:"message,omitempty"`
	// At is when the compensation returned (or the status was decided), in
	// Unix ms.
	At int64 `msgpack:"at"`
	// StartedAt is when its Undo or Compensate was called, in Unix ms (0
	// when none was: no compensation registered, or a record written before
	// it was kept).
	StartedAt int64 `msgpack:"sa,omitempty"`
	// Attempt counts the calls of this step's Undo or Compensate across the
	// run's rollbacks, this one included (0 when none was called).
	Attempt int `msgpack:"a,omitempty"`
	// Generation is the rollback generation that wrote the record (0 in
	// records written before generations were kept, which means 1).
	Generation int `msgpack:"g,omitempty"`
	// Resource is the entry's resource ("" when it names none).
	Resource string `msgpack:"rs,omitempty"`
	// Label is a guarded effect's label.
	Label string `msgpack:"lb,omitempty"`
	// Expected, Observed and RestoreTo are a guarded undo's fingerprints:
	// the effect's after state, what the probe read, the before state.
	Expected  string `msgpack:"ex,omitempty"`
	Observed  string `msgpack:"ob,omitempty"`
	RestoreTo string `msgpack:"to,omitempty"`
	// ExpectedEnc, ObservedEnc and RestoreToEnc are the encodings
	// (fingerprint.Encode) of those states, for a person to read; nil when
	// not known (see effectRec.BeforeEnc).
	ExpectedEnc  []byte `msgpack:"exv,omitempty"`
	ObservedEnc  []byte `msgpack:"obv,omitempty"`
	RestoreToEnc []byte `msgpack:"tov,omitempty"`
	// BlockedBy is the entry (entryID) that blocked this one.
	BlockedBy string `msgpack:"by,omitempty"`
}

// Run is a stored run, as Get returns it.
type Run struct {
	ID      string
	Reactor string
	// Definition is the version and fingerprint of the definition the run
	// started with, the only one that executes or rolls it back (zero for
	// a run stored before runs recorded it).
	Definition DefinitionVersion
	Status     Status
	// Version is the number of fenced writes the run has had.
	Version int64
	Inputs  map[string]Raw
	// Completed lists completed steps in completion order of the definition.
	Completed []string
	// Skipped lists skipped steps.
	Skipped []string
	// Ledger is the undo stack, oldest first.
	Ledger []*LedgerEntry
	// Rollback is set while the run is rolling back.
	Rollback *RollbackRecord
	// Rollbacks is the per-step rollback report, in the order it happened.
	Rollbacks []StepRollback
	// RollbackGeneration is the generation of the run's latest rollback: 1
	// for its first, one more for each RetryRollback.
	RollbackGeneration int
	Value              Raw
	Failure            *Failure
	Reason             string
	// Wake is the id of the last wake-up task enqueued for the run.
	Wake string
	// Queue is the asynq queue of the run's wake-ups: WithQueue's, or the
	// Enqueuer's that Enqueue recorded; "" for an in-process run (its
	// hand-offs go to the Enqueuer's own).
	Queue string
	// Deadline is the run's deadline (WithDeadline, WithTimeout); zero when
	// it has none.
	Deadline time.Time
	// TraceID is the run's trace id (see RunInfo.TraceID).
	TraceID string
	// Element is set for a map element run (Engine.Element).
	Element *ElementInfo
	// RetryOf is the id of the run this run retries (Engine.Retry); "" for
	// a run started otherwise.
	RetryOf string
	// RetriedBy lists the ids of the runs that retry this one, oldest
	// first.
	RetriedBy []string
	// SpawnedBy is the run (and its step) that spawned this run with a
	// spawn step (Spawn); nil for a run started otherwise.
	SpawnedBy *SpawnLink
	// Spawned lists the runs this run's spawn steps started, in the order
	// they did (composed children's included, Step being their path).
	Spawned []SpawnLink
	// Held counts what the run's rollbacks left in place that someone must
	// know of (see Result.Held).
	Held Held
	// Sensitive is true for a sensitive run: its definition, or one it
	// composes or maps over, declares a Sensitive input, or it is a
	// composed child, map element or retry of a sensitive run. It is
	// decided when the run is created. Its inputs and the values in its
	// rollback report are returned here as any run's; show them to people
	// only as the dashboard does (to holders of its token).
	Sensitive bool
	// Stopped is the step the run stopped at without completing it (it
	// failed, halted, or was cut short and found by the rollback), with
	// its attempt; nil when there is none. For a composed child's step it
	// names the compose step.
	Stopped *StepStop
	// Steps are the steps with a record (completed or skipped), in
	// definition order when the engine knows the definition, else by start
	// time.
	Steps []StepInfo
	// Started holds when each step that started but has no record yet
	// began: the step running now, or the one that failed.
	Started map[string]time.Time
	// Attempted holds the attempt logs of the steps that started but have
	// no record yet, by step: the ended attempts of the step running now
	// (its failed ones), or of the one that failed or halted, with its
	// arguments. A step with no ended attempt is not listed.
	Attempted map[string]AttemptLog
	// Current is the plain step the run executes next or is executing, with
	// its attempt; nil when there is none (between steps, a construct or
	// composed child in progress, or a finished run).
	Current *StepAttempt
	// Paused is the interrupt the run waits at while it is paused (nil
	// otherwise); Engine.Interrupt reads its payloads.
	Paused *Pause
	// Children are the composed child runs in progress, by compose step;
	// their ids are "<run id>/<step path>". A finished child leaves only its
	// step's record.
	Children  map[string]*Run
	CreatedAt time.Time
	UpdatedAt time.Time
}

// StepInfo is the record of one completed or skipped step.
type StepInfo struct {
	Name string
	// Skipped is true for a step that skipped itself (reactor.Skip).
	Skipped bool
	// Attempts is the attempt that completed it (1 for constructs and
	// composed children).
	Attempts int
	// Value is the step's result.
	Value Raw
	// StartedAt and FinishedAt are when the step started and when it was
	// recorded; zero for runs stored before they were kept.
	StartedAt, FinishedAt time.Time
	// AttemptLog is the step's attempts, each with its times and error,
	// and the arguments it ran with, as far as the run kept them.
	AttemptLog AttemptLog
}

// StepAttempt names a step and its attempt (from 1).
type StepAttempt struct {
	Step    string
	Attempt int
}

// Result returns the run's result as a Result.
func (r *Run) Result() *Result {
	res := &Result{RunID: r.ID, Reactor: r.Reactor, Status: r.Status, Value: r.Value, Failure: r.Failure, Reason: r.Reason, Held: r.Held}
	for _, u := range r.Rollbacks {
		if u.Status == RollbackOutOfWindow && max(u.Generation, 1) == r.RollbackGeneration {
			res.OutOfWindow = append(res.OutOfWindow, u.Step)
		}
	}
	return res
}

func (st *runState) result() *Result {
	r := &Result{RunID: st.ID, Reactor: st.Reactor, Status: st.Status, Value: st.Value, Failure: st.Failure, Reason: st.Reason,
		Held: st.held()}
	if st.RbGen > 0 {
		for _, u := range st.Undone {
			if u.Status == RollbackOutOfWindow && max(u.Generation, 1) == st.RbGen {
				r.OutOfWindow = append(r.OutOfWindow, u.Step)
			}
		}
	}
	return r
}

func (st *runState) view(d *Definition, version int64) *Run {
	r := &Run{ID: st.ID, Reactor: st.Reactor, Definition: DefinitionVersion{Version: st.DefVersion, Fingerprint: st.Def},
		Status: st.Status, Version: version, Inputs: st.Inputs,
		Ledger: st.Ledger, Rollback: st.Rollback, Rollbacks: st.Undone, Value: st.Value,
		Failure: st.Failure, Reason: st.Reason, Wake: st.Wake, Queue: st.Queue, TraceID: st.Trace,
		RetryOf: st.RetryOf, RetriedBy: st.RetriedBy, SpawnedBy: st.SpawnedBy, Spawned: st.Spawned, RollbackGeneration: st.rollbackGen(), Held: st.held(), Sensitive: st.Sensitive,
		CreatedAt: time.UnixMilli(st.CreatedAt), UpdatedAt: time.UnixMilli(st.UpdatedAt)}
	if st.Deadline != 0 {
		r.Deadline = time.UnixMilli(st.Deadline)
	}
	if p := st.Pause; p != nil {
		r.Paused = &Pause{Step: p.Path, Correlation: p.Corr, Since: msTime(p.Since), Deadline: msTime(p.Deadline), Accepts: p.Accepts}
	}
	if el := st.Elem; el != nil {
		r.Element = &ElementInfo{Owner: el.Owner, Step: el.Step, Index: el.Index}
	}
	names := make([]string, 0, len(st.Steps))
	if d != nil {
		for _, s := range d.order {
			names = append(names, s.name)
		}
	} else {
		for n := range st.Steps {
			names = append(names, n)
		}
		// No definition: by start, then name, so a reader gets a stable
		// order close to the run's.
		sort.Slice(names, func(i, j int) bool {
			a, b := st.Steps[names[i]], st.Steps[names[j]]
			if a.StartedAt != b.StartedAt {
				return a.StartedAt < b.StartedAt
			}
			return names[i] < names[j]
		})
	}
	msTime := func(ms int64) time.Time {
		if ms == 0 {
			return time.Time{}
		}
		return time.UnixMilli(ms)
	}
	for _, n := range names {
		rec, ok := st.Steps[n]
		if !ok {
			continue
		}
		if rec.State == stepSkipped {
			r.Skipped = append(r.Skipped, n)
		} else {
			r.Completed = append(r.Completed, n)
		}
		si := StepInfo{Name: n, Skipped: rec.State == stepSkipped, Attempts: rec.Attempts,
			Value: rec.Value, StartedAt: msTime(rec.StartedAt), FinishedAt: msTime(rec.FinishedAt), AttemptLog: rec.Log.view()}
		if len(si.AttemptLog.Attempts) == 0 && rec.Attempts <= 1 && rec.StartedAt != 0 && rec.FinishedAt != 0 {
			// Completed on its first attempt: that attempt is the step's
			// own start and finish.
			si.AttemptLog.Attempts = []AttemptRecord{{Attempt: 1, StartedAt: si.StartedAt, EndedAt: si.FinishedAt}}
		}
		if si.AttemptLog.Args == nil {
			si.AttemptLog.Args = ledgerArgs(st.Ledger, n)
		}
		r.Steps = append(r.Steps, si)
	}
	for n, l := range st.Tries {
		if r.Attempted == nil {
			r.Attempted = map[string]AttemptLog{}
		}
		r.Attempted[n] = l.view()
	}
	for n, ms := range st.Starts {
		if r.Started == nil {
			r.Started = map[string]time.Time{}
		}
		r.Started[n] = msTime(ms)
	}
	if in := st.Intent; in != nil && !st.Status.Terminal() {
		r.Current = &StepAttempt{Step: in.Step, Attempt: max(in.Attempt, 1)}
	}
	if sp := st.Stop; sp != nil {
		c := *sp
		r.Stopped = &c
	}
	if r.Failure == nil && st.Rollback != nil {
		// Under way: the failure the run will end with, as it stands.
		r.Failure = st.Rollback.Failure
	}
	for n, c := range st.Children {
		if r.Children == nil {
			r.Children = map[string]*Run{}
		}
		r.Children[n] = c.view(nil, 0)
	}
	return r
}

// ledgerArgs is the argument snapshot of step name's latest entry on the
// ledger, nil when it has none.
func ledgerArgs(ledger []*LedgerEntry, name string) Raw {
	for i := len(ledger) - 1; i >= 0; i-- {
		if e := ledger[i]; e.Step == name && len(e.Children) == 0 {
			return e.Args
		}
	}
	return nil
}

func newState(id string, d *Definition, inputs map[string]Raw, now time.Time) *runState {
	return &runState{ID: id, Reactor: d.name, Def: d.fp, DefVersion: d.Version(), Status: StatusRunning, Inputs: inputs, Sensitive: d.sensitive,
		Steps: map[string]*stepRec{}, CreatedAt: now.UnixMilli(), UpdatedAt: now.UnixMilli()}
}

// The stored state's own types get codec's allocation-free omitempty
// encoder (the same bytes as msgpack's; reactor/codec_fast_test.go checks
// that field by field). Exported types keep msgpack's, so a user's own
// encoder options still apply to them.
func init() {
	codec.RegisterFast(runState{}, stepRec{}, intentRec{}, entryRec{}, elementRec{}, rollbackRetry{},
		retryEntry{}, humanRec{}, targetedRec{}, effectRec{}, auditRec{}, attemptRec{}, attemptLog{})
}
