package dashboard

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/inspect"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
)

// Step statuses of the run detail.
const (
	stepPending    = "pending"
	stepRunning    = "running"
	stepCompleted  = "completed"
	stepSkipped    = "skipped"
	stepFailed     = "failed"
	stepHalted     = "halted"
	stepCut        = "interrupted"
	stepPaused     = "paused"
	stepUndone     = "undone"
	stepUndoFailed = "undo_failed"
)

type runDetail struct {
	runSummary
	Inputs    map[string]any `json:"inputs"`
	Value     any            `json:"value"`
	Reason    string         `json:"reason"`
	TraceID   string         `json:"trace_id"`
	Queue     string         `json:"queue"`
	Failure   *failureDetail `json:"failure"`
	Steps     []stepView     `json:"steps"`
	Children  []childView    `json:"children"`
	Maps      []mapView      `json:"maps"`
	Rollback  *progress      `json:"rollback"`
	Rollbacks []rollbackView `json:"rollbacks"`
	Ledger    []ledgerView   `json:"ledger"`
	RetryOf   string         `json:"retry_of"`
	RetriedBy []string       `json:"retried_by"`
	// SpawnedBy is the run whose spawn step started this run (with the
	// step); Spawned the runs this run's spawn steps started.
	SpawnedBy *spawnLinkView  `json:"spawned_by,omitempty"`
	Spawned   []spawnLinkView `json:"spawned"`
	Deadline  string          `json:"deadline,omitempty"`
	Element   *elementOf      `json:"element,omitempty"`
	// Actions says, for each action, whether the engine would accept it
	// now (Engine.Allowed), and why not.
	Actions map[string]actionView `json:"actions"`
	// Sensitive marks a sensitive run (reactor.Run.Sensitive);
	// InputsRedacted says its inputs' values were replaced with
	// reactor.RedactedValue (the request did not carry the token).
	Sensitive      bool `json:"sensitive"`
	InputsRedacted bool `json:"inputs_redacted"`
	// StepsRedacted says the steps' args and results were replaced with
	// reactor.RedactedValue, as the inputs (they are made of them).
	StepsRedacted bool `json:"steps_redacted"`
	// Definition is the version and fingerprint the run started with;
	// Waiting says, for a run the workers refuse for want of that
	// definition (a rolling deploy), what it waits for, and WaitingFor
	// the details (reactor.DefinitionWait).
	Definition reactor.DefinitionVersion `json:"definition"`
	Waiting    string                    `json:"waiting,omitempty"`
	WaitingFor *reactor.DefinitionWait   `json:"waiting_for,omitempty"`
	// QueueDefault says the run recorded no queue: Queue is then the
	// dashboard's ControlQueue, where its control tasks go.
	QueueDefault bool `json:"queue_default"`
	// Stall, for a live run without progress for StallAfter, says why
	// (stalls.go); null otherwise.
	Stall *stallView `json:"stall"`
	// Interrupt, for a run paused at an interrupt step, is what it waits
	// for (interrupt.go); null otherwise.
	Interrupt *interruptView `json:"interrupt"`
}

// elementOf says which map element a run is (element runs only).
type elementOf struct {
	Owner string `json:"owner"`
	Step  string `json:"step"`
	Index int    `json:"index"`
}

type failureDetail struct {
	Step    string `json:"step"`
	Message string `json:"message"`
	// Stack is the goroutine's stack when the step panicked (the stored
	// failure's reactor.PanicError), else "".
	Stack            string            `json:"stack,omitempty"`
	RollbackFailures []rollbackFailure `json:"rollback_failures"`
}

type rollbackFailure struct {
	Step    string `json:"step"`
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

type stepView struct {
	Name       string `json:"name"`
	Status     string `json:"status"`
	Attempts   int    `json:"attempts"`
	StartedAt  string `json:"started_at"`
	FinishedAt string `json:"finished_at"`
	DurationMS int64  `json:"duration_ms"`
	Result     any    `json:"result"`
	Error      string `json:"error"`
	// NeedsHuman marks a step one of whose undo entries (a composed
	// step's: one of its child's) waits for a person: the step completed,
	// but its rollback is not done.
	NeedsHuman bool `json:"needs_human,omitempty"`
	// Args are the arguments the step ran with, decoded (null when the run
	// did not keep them: reactor.AttemptLog.Args).
	Args any `json:"args"`
	// AttemptLog is the step's ended attempts, oldest first (the latest
	// 20); AttemptsDropped counts the older ones not kept.
	AttemptLog      []attemptView `json:"attempt_log"`
	AttemptsDropped int           `json:"attempts_dropped"`
	// Task is set for a step that runs as its own task (StepConfig.Task):
	// its attempt log is its tasks', each with the Worker that ran it, and
	// Worker is the latest attempt's.
	Task   bool   `json:"task,omitempty"`
	Worker string `json:"worker,omitempty"`
}

// latestRollbacks is the run's rollback log reduced to each entry's
// latest record, in the order the entries first appear.
func latestRollbacks(run *reactor.Run) []rollbackView {
	at := map[string]int{}
	var out []rollbackView
	for _, rb := range run.Rollbacks {
		v := rollbackView{Step: rb.Step, Status: string(rb.Status)}
		if i, ok := at[rb.Step]; ok {
			out[i] = v
			continue
		}
		at[rb.Step] = len(out)
		out = append(out, v)
	}
	return out
}

// waitsForPerson reports whether a ledger entry of step (a compose step's
// child entries included) needs a person.
func waitsForPerson(ledger []*reactor.LedgerEntry, step string) bool {
	var waits func(es []*reactor.LedgerEntry) bool
	waits = func(es []*reactor.LedgerEntry) bool {
		for _, e := range es {
			if e.Status == reactor.RollbackNeedsPerson || waits(e.Children) {
				return true
			}
		}
		return false
	}
	for _, e := range ledger {
		if e.Step == step && (e.Status == reactor.RollbackNeedsPerson || waits(e.Children)) {
			return true
		}
	}
	return false
}

// attemptView is one ended attempt of a step (reactor.AttemptRecord).
type attemptView struct {
	Attempt    int    `json:"attempt"`
	StartedAt  string `json:"started_at"`
	EndedAt    string `json:"ended_at"`
	DurationMS int64  `json:"duration_ms"`
	Error      string `json:"error"`
	Retryable  bool   `json:"retryable"`
	// Worker names the process that ran the attempt of a task step.
	Worker string `json:"worker,omitempty"`
}

// withLog puts what the run kept of the step's attempts on v.
func (v *stepView) withLog(l reactor.AttemptLog) {
	v.Args, v.AttemptsDropped = decode(l.Args), l.Dropped
	v.AttemptLog = make([]attemptView, 0, len(l.Attempts))
	for _, a := range l.Attempts {
		v.AttemptLog = append(v.AttemptLog, attemptView{Attempt: a.Attempt, StartedAt: stamp(a.StartedAt), EndedAt: stamp(a.EndedAt),
			DurationMS: a.EndedAt.Sub(a.StartedAt).Milliseconds(), Error: a.Error, Retryable: a.Retryable})
	}
}

// redactSteps replaces the steps' args and results, where there are any,
// with reactor.RedactedValue: a sensitive run's step values are made of its
// inputs.
func redactSteps(steps []stepView) {
	for i := range steps {
		if steps[i].Args != nil {
			steps[i].Args = reactor.RedactedValue
		}
		if steps[i].Result != nil {
			steps[i].Result = reactor.RedactedValue
		}
	}
}

type childView struct {
	Step string `json:"step"`
	// RunID is "" for a finished child, folded into this run's ledger.
	RunID   string         `json:"run_id"`
	Reactor string         `json:"reactor"`
	Status  reactor.Status `json:"status"`
	// Entries are a finished child's undo entries, with their rollback
	// statuses (its steps, prefixed with the compose step's name).
	Entries []ledgerView `json:"entries,omitempty"`
}

type mapView struct {
	Step       string       `json:"step"`
	MapID      string       `json:"map_id"`
	Mode       string       `json:"mode"`
	Total      int          `json:"total"`
	Dispatched int          `json:"dispatched"`
	Settled    int          `json:"settled"`
	Failed     int          `json:"failed"`
	Rollback   *mapRollback `json:"rollback"`
}

type mapRollback struct {
	Generation int `json:"generation"`
	progress
}

type progress struct {
	Total       int `json:"total"`
	Settled     int `json:"settled"`
	Outstanding int `json:"outstanding"`
	Failed      int `json:"failed"`
}

// ledgerView is an entry on the run's undo stack: a step whose effect is
// still applied. Step is its path as Engine.UndoSteps takes it ("charge",
// or "book/reserve" for a step of composed child book).
type ledgerView struct {
	Step        string `json:"step"`
	Ordinal     int    `json:"ordinal"`
	Resource    string `json:"resource"`
	Status      string `json:"status"`
	Interrupted bool   `json:"interrupted"`
}

// ledgerOf flattens the undo stack (a composed child's entries in its
// compose step's place), oldest first.
func ledgerOf(entries []*reactor.LedgerEntry, prefix string, out []ledgerView) []ledgerView {
	for _, e := range entries {
		if len(e.Children) > 0 {
			out = ledgerOf(e.Children, prefix+e.Step+"/", out)
			continue
		}
		out = append(out, ledgerView{Step: prefix + e.Step, Ordinal: e.Ordinal, Resource: e.Resource,
			Status: string(e.Status), Interrupted: e.Interrupted})
	}
	return out
}

type rollbackView struct {
	Step    string `json:"step"`
	Status  string `json:"status"`
	Kind    string `json:"kind"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	At      string `json:"at"`
}

// decode turns a stored msgpack value into what encoding/json writes.
func decode(raw codec.Raw) any {
	if len(raw) == 0 {
		return nil
	}
	var v any
	if err := codec.Unmarshal(raw, &v); err != nil {
		return map[string]string{"undecodable": err.Error()}
	}
	return jsonable(v)
}

// jsonable converts what msgpack decodes into values encoding/json accepts
// (maps with non-string keys become string-keyed).
func jsonable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = jsonable(e)
		}
		return x
	case map[any]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[toString(k)] = jsonable(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = jsonable(e)
		}
		return x
	}
	return v
}

// actionView is whether an action is offered on a run, and if not why.
type actionView struct {
	Allowed bool   `json:"allowed"`
	Reason  string `json:"reason,omitempty"`
}

// elementActions are the actions of a map element's run page: none, an
// element being undone, retried or cancelled with its map.
func elementActions(owner string) map[string]actionView {
	why := "a map element is undone, retried and cancelled with its map: act on its owner run " + owner
	out := map[string]actionView{}
	for _, a := range append(actions, undoStepsAction, redispatchAction, continueAction) {
		out[a] = actionView{Reason: why}
	}
	return out
}

// actionsOf maps Engine.Allowed's answer to the actions' names.
func actionsOf(allowed map[reactor.Op]error) map[string]actionView {
	out := map[string]actionView{}
	for op, err := range allowed {
		v := actionView{Allowed: err == nil}
		if err != nil {
			v.Reason = err.Error()
		}
		out[string(op)] = v
	}
	return out
}

func toString(k any) string {
	if s, ok := k.(string); ok {
		return s
	}
	return fmt.Sprint(k)
}

// runDetail serves GET /api/runs/{id}.
func (h *Handler) runDetail(w http.ResponseWriter, r *http.Request, id string) {
	if err := keys.ValidateID(id); err != nil {
		writeError(w, http.StatusBadRequest, "run id: "+err.Error())
		return
	}
	ctx := r.Context()
	// The run and what the engine would accept on it, from one read.
	run, allowed, err := h.engine.Allowed(ctx, id)
	acts := actionsOf(allowed)
	if errors.Is(err, reactor.ErrNotFound) && strings.Contains(id, ".") {
		// A map element's run ("<mapID>.<i>"), in its own slot.
		if run, err = engine.Element(h.engine, ctx, id); err == nil && run.Element != nil {
			acts = elementActions(run.Element.Owner)
		}
	}
	if errors.Is(err, reactor.ErrNotFound) {
		writeError(w, http.StatusNotFound, "no run "+id+" is stored (unknown id, or its retention expired)")
		return
	}
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	maps, err := h.maps.RunMaps(ctx, id)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	d := detailOf(run, maps, time.Now())
	d.Actions = acts
	if run.Element == nil {
		tasks, err := h.engine.StepTasks(ctx, id)
		if err != nil {
			h.serverError(w, r, err)
			return
		}
		withStepTasks(d.Steps, tasks)
	}
	if d.Queue == "" && run.Element == nil {
		d.Queue, d.QueueDefault = h.cfg.ControlQueue, true
	}
	if run.Element == nil {
		// A run written within StallAfter (by its writer's clock) is not
		// stalled: only the others are examined.
		if !run.Status.Terminal() && time.Since(run.UpdatedAt) >= h.cfg.StallAfter {
			p, err := h.newProbe(ctx)
			if err == nil {
				d.Stall, err = h.examineRun(ctx, p, id, maps)
			}
			if err != nil {
				h.serverError(w, r, err)
				return
			}
		}
		d.Actions[redispatchAction] = redispatchView(run.Status, d.Stall, h.cfg.StallAfter)
		if d.Interrupt, err = h.interruptDetail(ctx, r, run); err != nil {
			h.serverError(w, r, err)
			return
		}
		d.Actions[continueAction] = continueView(run, d.Interrupt)
	}
	if !run.Status.Terminal() && run.Element == nil {
		dw, err := h.engine.DefinitionWait(ctx, id)
		if err != nil {
			h.serverError(w, r, err)
			return
		}
		if dw != nil {
			d.Waiting, d.WaitingFor = dw.String(), dw
		}
	}
	if !h.mayReadValues(r, run) {
		for k := range d.Inputs {
			d.Inputs[k] = reactor.RedactedValue
		}
		d.InputsRedacted = true
		redactSteps(d.Steps)
		d.StepsRedacted = true
		if d.Value != nil {
			// The run's value is made of its steps' results.
			d.Value = reactor.RedactedValue
		}
	}
	writeJSON(w, http.StatusOK, d)
}

func detailOf(run *reactor.Run, maps []inspect.Map, now time.Time) runDetail {
	d := runDetail{runSummary: summarize(run, now), Inputs: map[string]any{}, Value: decode(run.Value),
		Reason: run.Reason, TraceID: run.TraceID, Queue: run.Queue, Steps: steps(run), Children: []childView{},
		Maps: []mapView{}, Rollbacks: []rollbackView{}, Ledger: ledgerOf(run.Ledger, "", []ledgerView{}), RetryOf: run.RetryOf, RetriedBy: []string{},
		Sensitive: run.Sensitive, Definition: run.Definition}
	d.RetriedBy = append(d.RetriedBy, run.RetriedBy...)
	d.SpawnedBy, d.Spawned = spawnLinks(run)
	for k, v := range run.Inputs {
		d.Inputs[k] = decode(v)
	}
	if !run.Deadline.IsZero() {
		d.Deadline = stamp(run.Deadline)
	}
	if el := run.Element; el != nil {
		d.Element = &elementOf{Owner: el.Owner, Step: el.Step, Index: el.Index}
	}
	if f := run.Failure; f != nil {
		d.Failure = &failureDetail{Step: f.Step, Message: f.Message, RollbackFailures: []rollbackFailure{}}
		if p := (*reactor.PanicError)(nil); errors.As(f, &p) {
			d.Failure.Stack = p.Stack
		}
		for _, rf := range f.RollbackFailures {
			d.Failure.RollbackFailures = append(d.Failure.RollbackFailures, rollbackFailure{Step: rf.Step, Kind: string(rf.Kind), Message: rf.Message})
		}
	}
	for _, step := range sortedKeys(run.Children) {
		c := run.Children[step]
		d.Children = append(d.Children, childView{Step: step, RunID: c.ID, Reactor: c.Reactor, Status: c.Status})
	}
	// A finished child lives on as its compose step's ledger entry, its
	// own entries folded in, and once rolled back in the run's rollback
	// log: listed too, with its entries' latest statuses.
	latest := latestRollbacks(run)
	folded := map[string][]ledgerView{}
	var order []string
	for _, e := range run.Ledger {
		if len(e.Children) > 0 && run.Children[e.Step] == nil {
			folded[e.Step], order = ledgerOf(e.Children, e.Step+"/", []ledgerView{}), append(order, e.Step)
		}
	}
	for _, rb := range latest {
		parent, _, nested := strings.Cut(rb.Step, "/")
		if !nested || run.Children[parent] != nil {
			continue
		}
		if _, seen := folded[parent]; !seen {
			order = append(order, parent)
		}
		folded[parent] = append(folded[parent], ledgerView{Step: rb.Step, Status: rb.Status})
	}
	for _, step := range order {
		d.Children = append(d.Children, childView{Step: step, Status: reactor.StatusCompleted, Entries: folded[step]})
	}
	for i := range d.Steps {
		name := d.Steps[i].Name
		d.Steps[i].NeedsHuman = waitsForPerson(run.Ledger, name)
		for _, rb := range latest {
			if rb.Status == string(reactor.RollbackNeedsPerson) && (rb.Step == name || strings.HasPrefix(rb.Step, name+"/")) {
				d.Steps[i].NeedsHuman = true
			}
		}
	}
	byStep := map[string]inspect.Map{}
	for _, m := range maps {
		mv := mapView{Step: m.Step, MapID: m.ID, Mode: "inline", Total: m.Total, Dispatched: m.Offset, Settled: m.Settled, Failed: m.Failed}
		if m.FanOut {
			mv.Mode = "fanout"
		}
		if rb := m.Rollback; rb != nil {
			mv.Rollback = &mapRollback{Generation: rb.Generation, progress: progress{Total: rb.Total, Settled: rb.Settled,
				Outstanding: max(0, rb.Total-rb.Settled), Failed: rb.Bad}}
		}
		d.Maps = append(d.Maps, mv)
		byStep[m.Step] = m
	}
	for _, rb := range run.Rollbacks {
		d.Rollbacks = append(d.Rollbacks, rollbackView{Step: rb.Step, Status: string(rb.Status), Kind: string(rb.Kind),
			Reason: rb.Reason, Message: rb.Message, At: stamp(time.UnixMilli(rb.At))})
	}
	if run.Status == reactor.StatusRollingBack {
		d.Rollback = rollbackProgress(run, byStep)
	}
	return d
}

// rollbackProgress is where a rolling-back run's rollback stands: each
// ledger entry (a step to undo) counts one, except a map step's entry, which
// counts its elements from the map's rollback counters.
func rollbackProgress(run *reactor.Run, maps map[string]inspect.Map) *progress {
	var p progress
	for _, e := range run.Ledger {
		if m, ok := maps[e.Step]; ok && m.Rollback != nil {
			p.Total += m.Rollback.Total
			p.Settled += min(m.Rollback.Settled, m.Rollback.Total)
			p.Failed += m.Rollback.Bad
			continue
		}
		if m, ok := maps[e.Step]; ok {
			// A map whose rollback has not started: its elements are all
			// outstanding.
			p.Total += m.Offset
			continue
		}
		p.Total++
		switch e.Status {
		case reactor.RollbackPending, reactor.RollbackCompensating:
		case reactor.RollbackFailed:
			p.Settled++
			p.Failed++
		default:
			p.Settled++
		}
	}
	p.Outstanding = p.Total - p.Settled
	return &p
}

// steps is the run's step list: the recorded steps, the one running or
// failed, with what the rollback did to each.
func steps(run *reactor.Run) []stepView {
	out := []stepView{}
	idx := map[string]int{}
	for _, s := range run.Steps {
		v := stepView{Name: s.Name, Status: stepCompleted, Attempts: s.Attempts, StartedAt: stamp(s.StartedAt),
			FinishedAt: stamp(s.FinishedAt), Result: decode(s.Value)}
		v.withLog(s.AttemptLog)
		if s.Skipped {
			v.Status = stepSkipped
		}
		if !s.StartedAt.IsZero() && !s.FinishedAt.IsZero() {
			v.DurationMS = s.FinishedAt.Sub(s.StartedAt).Milliseconds()
		}
		idx[s.Name] = len(out)
		out = append(out, v)
	}
	var open []string
	for n := range run.Started {
		if _, ok := idx[n]; !ok {
			open = append(open, n)
		}
	}
	sort.Slice(open, func(i, j int) bool { return run.Started[open[i]].Before(run.Started[open[j]]) })
	for _, n := range open {
		v := stepView{Name: n, Status: stepPending, StartedAt: stamp(run.Started[n])}
		switch {
		case run.Failure != nil && (run.Failure.Step == n || strings.HasPrefix(run.Failure.Step, n+"/")):
			// The step itself, or a step of the child it composes.
			v.Status, v.Error = stepFailed, run.Failure.Message
		case run.Status == reactor.StatusRunning:
			v.Status = stepRunning
		case run.Status == reactor.StatusPaused && run.Paused != nil && (run.Paused.Step == n || strings.HasPrefix(run.Paused.Step, n+"/")):
			// The interrupt the run waits at (or the compose step whose
			// child waits at one).
			v.Status = stepPaused
		}
		if c := run.Current; c != nil && c.Step == n {
			v.Attempts = c.Attempt
		}
		idx[n] = len(out)
		out = append(out, v)
	}
	if f := run.Failure; f != nil && f.Step != "" {
		if _, ok := idx[f.Step]; !ok && !strings.Contains(f.Step, "/") {
			idx[f.Step] = len(out)
			out = append(out, stepView{Name: f.Step, Status: stepFailed, Error: f.Message})
		}
	}
	if sp := run.Stopped; sp != nil {
		// How the step the run stopped at ended, as it happened: failed
		// (on its last attempt), halted, or cut short mid-step.
		i, ok := idx[sp.Step]
		if !ok {
			idx[sp.Step] = len(out)
			i = len(out)
			out = append(out, stepView{Name: sp.Step})
		}
		if out[i].Status == stepPending || out[i].Status == stepRunning || out[i].Status == "" {
			out[i].Status = map[reactor.StopKind]string{reactor.StopFailed: stepFailed, reactor.StopHalted: stepHalted,
				reactor.StopInterrupted: stepCut}[sp.How]
		}
		if out[i].Status == stepHalted && out[i].Error == "" {
			out[i].Error = run.Reason
		}
		out[i].Attempts = max(out[i].Attempts, sp.Attempt)
	}
	for i := range out {
		if out[i].AttemptLog == nil {
			// No record: the attempts of the step running, or of the one
			// the run stopped at.
			out[i].withLog(run.Attempted[out[i].Name])
		}
	}
	for _, rb := range run.Rollbacks {
		i, ok := idx[rb.Step]
		if !ok {
			continue
		}
		switch rb.Status {
		case reactor.RollbackCompensated:
			if out[i].Status != stepFailed {
				out[i].Status = stepUndone
			}
		case reactor.RollbackFailed:
			out[i].Status = stepUndoFailed
			if out[i].Error == "" {
				out[i].Error = rb.Message
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
