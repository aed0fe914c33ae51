package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// The checks, all from what Redis holds once the workers are stopped:
//
//   - Every run ended (none stuck at the bound), with the status its plan
//     implies (a cancelled run: cancelled, or what it would have ended with
//     had the cancel come too late), failing at the step its plan fails,
//     and with no rollback failure.
//   - Every owner finished once (terminal events recorded by a hook; more
//     than one is a violation).
//   - Every completed step (the owner's prep, each element's a and b) of a
//     run that rolled back was undone, and only those: nothing of a run
//     that completed was undone, except what a failed element rolled back
//     itself. A step runs, or is undone, again only after a kill, a Redis
//     outage or a lost lock cut the earlier call short: each interruption
//     allows one more call, so an entry is undone at most twice unless two
//     interruptions hit it in a row (noted with the evidence). No element
//     failed unless its plan says so.
//   - A step cut short mid-Run (its effect on record, its result not) in a
//     run that rolled back was compensated: its Compensate found the effect
//     and reversed it. One the engine holds as interrupted whose Run never
//     got to its effect has nothing to reverse, and is only counted. Only
//     an effect is compensated, never a completed step (its Undo reverses
//     it), and nothing of a run that completed. No rollback, of a run or an
//     element, reports an interrupted step it could not compensate
//     (reactor.step_interrupted): every undoable step of the soak has a
//     Compensate.
//   - Each map: no element beyond its claimed offset ever ran (back
//     pressure), one outcome per claimed position, settled when its run
//     ended; a run that rolled back has its map's rollback settled over
//     exactly the claimed positions, with every outcome undone or
//     not_needed; and no batch (forward or rollback) nor owner signal was
//     claimed twice, every claim exactly the next batch.
//   - The sweepers' own findings (soak-check:violations): no pass enqueued
//     more than a map's batch size for it, no wake-up or redelivery for a
//     run or element whose lock was held, and no redelivery of a task
//     active on a worker that was not killed. A run sweeper wake-up of an
//     owner whose map resume is queued or just picked up (the run sweeper
//     does not look for that task) is noted, not a violation: the extra
//     wake-up finds the run locked or already moved on. So is the map
//     sweeper's resume of an owner whose run sweeper wake-up is queued or
//     just picked up (the map sweeper does not look for that one): both
//     recover the same lost resume, the run sweeper first in a pass.

// findings is what the checks found.
type findings struct {
	runs       int
	statuses   map[reactor.Status]int
	elements   int
	undone     int // entries undone or compensated
	undoTwice  int
	undoMore   int // entries undone more than twice, each earlier undo cut short
	fwdTwice   int
	inFlight   int // executions never checkpointed: cut short, and their element stopped
	unobserved int // owners whose terminal event no hook recorded (a kill in between)
	recovered  int
	violations []string
	notes      []string

	// interrupted counts the entries the engine held as interrupted (a
	// step's Run called, its result never recorded) when it rolled their
	// run back; compensated, the entries whose Compensate found an effect
	// and reversed it; noEffect, the interrupted entries whose Run never
	// got to its effect.
	interrupted int
	compensated int
	noEffect    int
}

func (f *findings) violate(format string, args ...any) {
	f.violations = append(f.violations, fmt.Sprintf(format, args...))
}

func (f *findings) note(format string, args ...any) {
	f.notes = append(f.notes, fmt.Sprintf(format, args...))
}

// call is one recorded execution or undo of a step.
type call struct {
	pid string
	at  time.Time
}

// parseCalls groups a soak-check:fwd, :undo or :comp hash by "<index>/<step>",
// oldest call first.
func parseCalls(h map[string]string) map[string][]call {
	out := map[string][]call{}
	for field, val := range h {
		i := strings.LastIndexByte(field, '/')
		pid, ms, ok := strings.Cut(val, "/")
		if i < 0 || !ok {
			continue
		}
		n, _ := strconv.ParseInt(ms, 10, 64)
		out[field[:i]] = append(out[field[:i]], call{pid: pid, at: time.UnixMilli(n)})
	}
	for _, cs := range out {
		slices.SortFunc(cs, func(a, b call) int { return a.at.Compare(b.at) })
	}
	return out
}

// undoRule says whether a completed step must, must not, or may be undone.
type undoRule int

const (
	undoForbidden undoRule = iota
	undoRequired
	undoUnknown // the run did not end: already a violation
)

type checker struct {
	s        *soak
	f        *findings
	keys     keys.Keys
	killed   map[string]time.Time   // pid -> when the soak killed it
	lockLost map[string][]time.Time // "<run>|<pid>" -> when that process lost the run's lock
	outages  []outage
}

// check runs every check and gathers the sweepers' counters.
func (s *soak) check(ctx context.Context, plans []runPlan) *findings {
	f := &findings{runs: len(plans), statuses: map[reactor.Status]int{}}
	c := &checker{s: s, f: f, keys: keys.New(prefix), killed: map[string]time.Time{},
		lockLost: map[string][]time.Time{}}
	s.mu.Lock()
	for _, k := range s.kills {
		c.killed[strconv.Itoa(k.pid)] = k.at
	}
	c.outages = slices.Clone(s.outages)
	fatal := s.fatal
	s.mu.Unlock()
	if fatal != nil {
		f.violate("redis could not be restarted: %v", fatal)
	}
	lost, err := s.rdb.HGetAll(ctx, lockLostKey).Result()
	if err != nil {
		f.violate("cannot read the lost locks: %v", err)
	}
	for k, ms := range lost {
		if i := strings.LastIndexByte(k, '|'); i > 0 {
			n, _ := strconv.ParseInt(ms, 10, 64)
			c.lockLost[k[:i]] = append(c.lockLost[k[:i]], time.UnixMilli(n))
		}
	}
	for _, p := range plans {
		if err := c.run(ctx, p); err != nil {
			f.violate("%s: cannot check: %v", p.ID, err)
		}
	}
	found, err := s.rdb.LRange(ctx, violationsKey, 0, -1).Result()
	if err != nil {
		f.violate("cannot read the sweepers' findings: %v", err)
	}
	for _, v := range found {
		f.violate("%s", v)
	}
	seen, err := s.rdb.LRange(ctx, notesKey, 0, -1).Result()
	if err != nil {
		f.violate("cannot read the sweepers' notes: %v", err)
	}
	for _, n := range seen {
		f.note("%s", n)
	}
	stats, err := s.rdb.HGetAll(ctx, statsKey).Result()
	if err != nil {
		f.violate("cannot read the sweepers' counters: %v", err)
		stats = map[string]string{}
	}
	for _, k := range []string{"passes", "runs_woken", "elements", "rollbacks", "resumes", "claims", "fresh_ids",
		"pass_errors", "checked_locks", "spent_dead", "spent_inactive", "spent_live", "wakes_with_queued_resume",
		"resumes_with_queued_wake"} {
		if stats[k] == "" {
			stats[k] = "0"
		}
	}
	f.recovered, _ = strconv.Atoi(stats["recovered"])
	f.note("seed=%d fwd_twice=%d undo_more=%d in_flight_lost=%d finish_unobserved=%d lock_losses=%d "+
		"interrupted=%d interrupted_no_effect=%d compensated=%d",
		s.cfg.seed, f.fwdTwice, f.undoMore, f.inFlight, f.unobserved, len(lost), f.interrupted, f.noEffect, f.compensated)
	f.note("sweeper: passes=%s runs_woken=%s elements=%s rollbacks=%s resumes=%s claims=%s fresh_ids=%s pass_errors=%s",
		stats["passes"], stats["runs_woken"], stats["elements"], stats["rollbacks"], stats["resumes"], stats["claims"],
		stats["fresh_ids"], stats["pass_errors"])
	f.note("sweeper checks: locks checked=%s; redeliveries under a fresh id of a task still active on no live worker=%s, "+
		"no longer active=%s, active on a live worker=%s; wake-ups with the owner's resume queued=%s; "+
		"resumes with the owner's wake-up queued=%s",
		stats["checked_locks"], stats["spent_dead"], stats["spent_inactive"], stats["spent_live"], stats["wakes_with_queued_resume"],
		stats["resumes_with_queued_wake"])
	c.queue()
	return f
}

// queue notes what is left in the queue; an archived task (retries spent,
// or refused) is worth a look.
func (c *checker) queue() {
	insp := asynq.NewInspectorFromRedisClient(c.s.rdb)
	qi, err := insp.GetQueueInfo(queue)
	if err != nil {
		c.f.note("queue: %v", err)
		return
	}
	c.f.note("queue: pending=%d active=%d scheduled=%d retry=%d archived=%d", qi.Pending, qi.Active, qi.Scheduled, qi.Retry, qi.Archived)
	if qi.Archived == 0 {
		return
	}
	archived, _ := insp.ListArchivedTasks(queue, asynq.PageSize(5))
	for _, t := range archived {
		c.f.note("archived task %s: %s", t.ID, t.LastErr)
	}
}

func (c *checker) violate(format string, args ...any) { c.f.violate(format, args...) }

// run checks one owner run, its map and its elements.
func (c *checker) run(ctx context.Context, p runPlan) error {
	c.s.mu.Lock()
	l := *c.s.launches[p.ID]
	c.s.mu.Unlock()
	run, err := c.s.engine.Get(ctx, p.ID)
	if errors.Is(err, reactor.ErrNotFound) {
		c.violate("%s: never stored (enqueued: %v)", p.ID, l.enqueued)
		return nil
	}
	if err != nil {
		return err
	}
	c.f.statuses[run.Status]++
	mapID := mapstep.MapID(p.ID, mapStep)
	m, err := c.readMap(ctx, mapID)
	if err != nil {
		return err
	}
	terminal := run.Status.Terminal()
	if !terminal {
		c.violate("%s: stuck %s at the bound; map %s", p.ID, run.Status, m.describe())
	}
	c.status(p, run, l)
	finishes, err := c.s.rdb.HLen(ctx, finishKey(p.ID)).Result()
	if err != nil {
		return err
	}
	switch {
	case finishes > 1:
		c.violate("%s: the owner finished %d times", p.ID, finishes)
	case finishes == 0 && terminal:
		c.f.unobserved++
	}
	fh, err := c.s.rdb.HGetAll(ctx, fwdKey(p.ID)).Result()
	if err != nil {
		return err
	}
	uh, err := c.s.rdb.HGetAll(ctx, undoKey(p.ID)).Result()
	if err != nil {
		return err
	}
	ch, err := c.s.rdb.HGetAll(ctx, compKey(p.ID)).Result()
	if err != nil {
		return err
	}
	calls := stepCalls{fwd: parseCalls(fh), undo: parseCalls(uh), comp: parseCalls(ch)}
	rule := undoUnknown
	switch run.Status {
	case reactor.StatusFailed, reactor.StatusCancelled:
		rule = undoRequired
	case reactor.StatusCompleted:
		rule = undoForbidden
	}
	interrupted := interruptedSteps(run)
	c.entry(p.ID, calls.of(p.ID+" step prep", "-1/prep", run, interrupted), rule)
	c.entry(p.ID, calls.of(p.ID+" step post", "-1/post", run, interrupted), undoForbidden)
	return c.elements(ctx, p, run, rule, m, calls)
}

// stepCalls are an owner's recorded calls, by "<index>/<step>".
type stepCalls struct {
	fwd, undo, comp map[string][]call
}

// stepEntry is what is known of one step of a run: its calls on record and
// what the run's state says of it.
type stepEntry struct {
	label           string
	fwd, undo, comp []call
	done            bool // the step completed
	interrupted     bool // the run's rollback held it as interrupted
}

// of is the entry of step key ("<index>/<step>") of run; interrupted is the
// steps run's rollback held as interrupted.
func (sc stepCalls) of(label, key string, run *reactor.Run, interrupted map[string]bool) stepEntry {
	_, step, _ := strings.Cut(key, "/")
	return stepEntry{label: label, fwd: sc.fwd[key], undo: sc.undo[key], comp: sc.comp[key],
		done: slices.Contains(run.Completed, step), interrupted: interrupted[step]}
}

// interruptedSteps returns the steps run's rollback held as interrupted: it
// found each one's intent on record (its Run perhaps called, its result
// never recorded) and put it on top of the ledger, to be compensated. Once
// rolled back, what is left of such an entry is its compensate record in
// the rollback report (one with an ordinal: the failing step's own
// compensation has none); while rolling back, the entry itself.
func interruptedSteps(run *reactor.Run) map[string]bool {
	out := map[string]bool{}
	for _, e := range run.Ledger {
		if e.Interrupted {
			out[e.Step] = true
		}
	}
	for _, r := range run.Rollbacks {
		if r.Kind == reactor.ActionCompensate && r.Ordinal > 0 {
			out[r.Step] = true
		}
	}
	return out
}

// reasonInterrupted is the reason of the rollback failure the engine
// reports for an interrupted step that has an Undo and no Compensate.
const reasonInterrupted = "reactor.step_interrupted"

// rollbackFailures checks the rollback failures of run, which are
// reported by who (the run, or an element's label).
func (c *checker) rollbackFailures(who string, f *reactor.Failure) {
	if f == nil || (len(f.RollbackFailures) == 0 && f.RollbackFailuresOmitted == 0) {
		return
	}
	rf := f.RollbackFailures
	first := "(omitted)"
	if len(rf) > 0 {
		first = fmt.Sprintf("%s %s %s: %s", rf[0].Step, rf[0].Kind, rf[0].Reason, rf[0].Message)
	}
	c.violate("%s: its rollback reported %d failures; first: %s", who, len(rf)+f.RollbackFailuresOmitted, first)
	var steps []string
	for _, r := range rf {
		if r.Reason == reasonInterrupted {
			steps = append(steps, r.Step)
		}
	}
	if len(steps) > 0 {
		c.violate("%s: its rollback could not compensate %d interrupted step(s) (%s), though every undoable step has a Compensate: %s",
			who, len(steps), reasonInterrupted, strings.Join(steps, ", "))
	}
}

// status checks how the run ended against its plan.
func (c *checker) status(p runPlan, run *reactor.Run, l launch) {
	if !run.Status.Terminal() {
		return
	}
	want, got := p.uncancelled(), run.Status
	if p.CancelAfter > 0 && l.cancel != "" {
		if got != reactor.StatusCancelled && got != want {
			c.violate("%s: ended %s; expected cancelled or %s (cancel: %s)%s", p.ID, got, want, l.cancel, failureText(run.Failure))
		}
	} else if got != want {
		c.violate("%s: ended %s, expected %s%s", p.ID, got, want, failureText(run.Failure))
	}
	if got == reactor.StatusFailed && run.Failure != nil {
		c.failingStep(p, run.Failure)
	}
	c.rollbackFailures(p.ID, run.Failure)
}

// failingStep checks that a failed run failed where its plan fails it: at
// a failing element of an atomic map, else at post.
func (c *checker) failingStep(p runPlan, f *reactor.Failure) {
	if len(p.Failing) > 0 && !p.Shape.Partial {
		var i int
		if _, err := fmt.Sscanf(f.Step, mapStep+"[%d]/b", &i); err != nil || !p.fails(i) {
			c.violate("%s: failed at %q, expected a failing element's step b (%s)", p.ID, f.Step, f.Message)
		}
		return
	}
	if p.FailAfter && f.Step != "post" {
		c.violate("%s: failed at %q, expected post (%s)", p.ID, f.Step, f.Message)
	}
}

func failureText(f *reactor.Failure) string {
	if f == nil {
		return ""
	}
	return fmt.Sprintf(" (failure at %q: %s)", f.Step, f.Message)
}

// entry checks one undoable step entry: its executions, its undos and its
// compensations.
func (c *checker) entry(runID string, e stepEntry, rule undoRule) {
	label, fwd, undo, comp, done := e.label, e.fwd, e.undo, e.comp, e.done
	if done && len(fwd) == 0 {
		c.violate("%s completed without an execution on record", label)
	}
	if len(undo) > 0 && !done {
		c.violate("%s was undone %d time(s) but never completed", label, len(undo))
	}
	switch {
	case done && rule == undoRequired && len(undo) == 0:
		c.violate("%s completed and was never undone", label)
	case rule == undoForbidden && len(undo) > 0:
		c.violate("%s was undone although its run did not roll back", label)
	}
	// A compensation reverses an effect whose step never completed.
	switch {
	case len(comp) > 0 && done:
		c.violate("%s was compensated %d time(s) although it completed (its Undo reverses it)", label, len(comp))
	case len(comp) > 0 && len(fwd) == 0:
		c.violate("%s was compensated %d time(s) with no execution on record", label, len(comp))
	case len(comp) > 0 && rule == undoForbidden:
		c.violate("%s was compensated although its run did not roll back", label)
	case !done && len(fwd) > 0 && len(comp) == 0 && rule == undoRequired && e.interrupted:
		c.violate("%s was interrupted with its effect on record (%s) and never compensated", label, c.describe(runID, fwd))
	case !done && len(fwd) > 0 && len(comp) == 0 && rule == undoRequired:
		// Its intent was on record before its Run was called: a rollback
		// should have found it, and compensated it as interrupted.
		c.violate("%s ran (%s) but never completed, and its run rolled back without compensating it (its rollback did not hold it as interrupted)",
			label, c.describe(runID, fwd))
	}
	if e.interrupted {
		c.f.interrupted++
		if len(fwd) == 0 {
			c.f.noEffect++
		}
	}
	if !done && len(fwd) > 0 {
		c.f.inFlight++
	}
	if len(comp) > 0 {
		c.f.compensated++
	}
	// An entry is undone or compensated, never both (see above).
	reversals := len(undo) + len(comp)
	if reversals > 0 {
		c.f.undone++
	}
	if reversals == 2 {
		c.f.undoTwice++
	}
	if reversals > 2 {
		// More than twice is allowed only if every earlier call was cut
		// short (repeats says so otherwise): two kills in a row on the
		// same entry.
		c.f.undoMore++
		verb := "was undone"
		switch {
		case len(undo) == 0:
			verb = "was compensated"
		case len(comp) > 0:
			verb = "was undone or compensated"
		}
		all := slices.SortedFunc(slices.Values(slices.Concat(undo, comp)), func(a, b call) int { return a.at.Compare(b.at) })
		c.f.note("%s %s %d times: %s", label, verb, reversals, c.describe(runID, all))
	}
	if len(fwd) > 1 {
		c.f.fwdTwice++
	}
	c.repeats(runID, label, "ran", fwd)
	c.repeats(runID, label, "was undone", undo)
	c.repeats(runID, label, "was compensated", comp)
}

// outageSlack widens an outage: a call made shortly before Redis went down
// may have lost its checkpoint to it, and one made while clients were
// reconnecting may have lost its lock.
const outageSlack = 3 * time.Second

// repeats checks that every call but the last of a step was cut short: its
// process was killed before the next call, it lost the run's lock, or Redis
// went down around it.
func (c *checker) repeats(runID, label, verb string, calls []call) {
	for j := 0; j+1 < len(calls); j++ {
		if c.cutShort(runID, calls[j], calls[j+1]) == "" {
			c.violate("%s %s %d times; call %d was cut short by no kill, outage or lost lock: %s",
				label, verb, len(calls), j+1, c.describe(runID, calls))
		}
	}
}

// cutShort says what interrupted call e before call next, or "".
func (c *checker) cutShort(runID string, e, next call) string {
	const slack = 100 * time.Millisecond
	if k, ok := c.killed[e.pid]; ok && k.After(e.at.Add(-slack)) && k.Before(next.at.Add(slack)) {
		return fmt.Sprintf("killed at %s", c.clock(k))
	}
	for _, l := range c.lockLost[runID+"|"+e.pid] {
		if l.After(e.at.Add(-slack)) && l.Before(next.at.Add(5*time.Second)) {
			return fmt.Sprintf("lost the lock at %s", c.clock(l))
		}
	}
	for _, o := range c.outages {
		if e.at.After(o.down.Add(-outageSlack)) && e.at.Before(o.up.Add(outageSlack)) {
			return fmt.Sprintf("Redis %s at %s", o.signal, c.clock(o.down))
		}
	}
	return ""
}

// describe lists calls with what cut each short.
func (c *checker) describe(runID string, calls []call) string {
	parts := make([]string, len(calls))
	for j, e := range calls {
		parts[j] = fmt.Sprintf("pid %s at %s", e.pid, c.clock(e.at))
		if j+1 < len(calls) {
			if why := c.cutShort(runID, e, calls[j+1]); why != "" {
				parts[j] += " (" + why + ")"
			}
		}
	}
	return strings.Join(parts, ", ")
}

// clock is t as seconds into the soak.
func (c *checker) clock(t time.Time) string { return fmt.Sprintf("%.1fs", t.Sub(c.s.start).Seconds()) }

// elements checks a run's map and each of its elements.
func (c *checker) elements(ctx context.Context, p runPlan, run *reactor.Run, rule undoRule, m mapView, calls stepCalls) error {
	mapID := mapstep.MapID(p.ID, mapStep)
	if !m.exists {
		for k := range calls.fwd {
			if !strings.HasPrefix(k, "-1/") {
				c.violate("%s: element step %s ran but the map never started", p.ID, k)
			}
		}
		return nil
	}
	c.mapState(p, run, rule, m)
	for i := range m.total {
		ka, kb := fmt.Sprintf("%d/a", i), fmt.Sprintf("%d/b", i)
		recorded := 0
		for _, k := range []string{ka, kb} {
			recorded += len(calls.fwd[k]) + len(calls.undo[k]) + len(calls.comp[k])
		}
		label := fmt.Sprintf("%s element %d", p.ID, i)
		if i >= m.offset {
			if recorded > 0 {
				c.violate("%s ran beyond the claimed offset %d (back pressure broken)", label, m.offset)
			}
			continue
		}
		elemID := mapstep.ElementID(mapID, i)
		el, err := engine.Element(c.s.engine, ctx, elemID)
		if errors.Is(err, reactor.ErrNotFound) {
			if recorded > 0 {
				c.violate("%s ran but has no run state", label)
			}
			continue
		}
		if err != nil {
			return err
		}
		c.f.elements++
		if !el.Status.Terminal() {
			c.violate("%s left %s", label, el.Status)
		}
		switch {
		case el.Status == reactor.StatusFailed && !p.fails(i):
			c.violate("%s failed without a planned failure%s", label, failureText(el.Failure))
		case el.Status == reactor.StatusCompleted && p.fails(i):
			c.violate("%s completed though its plan fails it", label)
		case el.Status == reactor.StatusCancelled && run.Status == reactor.StatusCompleted:
			c.violate("%s was undone although its run completed", label)
		}
		erule := rule
		if el.Status == reactor.StatusFailed {
			erule = undoRequired // a failed element rolls itself back
		}
		c.rollbackFailures(label, el.Failure)
		interrupted := interruptedSteps(el)
		c.entry(elemID, calls.of(label+" step a", ka, el, interrupted), erule)
		c.entry(elemID, calls.of(label+" step b", kb, el, interrupted), erule)
	}
	return nil
}

// mapState checks a map's keys against its run's end.
func (c *checker) mapState(p runPlan, run *reactor.Run, rule undoRule, m mapView) {
	id := mapstep.MapID(p.ID, mapStep)
	if m.total != p.Size || m.batch != p.Shape.Batch {
		c.violate("map %s: size %d batch %d, planned %d and %d", id, m.total, m.batch, p.Size, p.Shape.Batch)
	}
	if m.offset > m.total {
		c.violate("map %s: claimed offset %d beyond its size %d", id, m.offset, m.total)
	}
	if m.settled != len(m.results) {
		c.violate("map %s: settled counter %d, %d outcomes stored", id, m.settled, len(m.results))
	}
	for _, i := range m.results {
		if i >= m.offset {
			c.violate("map %s: outcome stored for position %d, never claimed (offset %d)", id, i, m.offset)
		}
	}
	ended := run.Status.Terminal()
	if ended && !m.settledForward() {
		c.violate("map %s: its run ended %s with the map unsettled (%s)", id, run.Status, m.describe())
	}
	if run.Status == reactor.StatusCompleted && (m.offset != m.total || m.settled != m.total) {
		c.violate("map %s: its run completed with %d of %d positions settled", id, m.settled, m.total)
	}
	switch {
	case rule == undoRequired && !m.rb.exists:
		c.violate("map %s: its run rolled back (%s) but the map has no rollback", id, run.Status)
	case rule == undoRequired:
		rb := m.rb
		if want := min(m.offset, m.total); rb.total != want {
			c.violate("map %s: rollback over %d positions, %d were claimed", id, rb.total, want)
		}
		if rb.settled != rb.total || len(rb.outcomes) != rb.total || rb.offset < rb.total {
			c.violate("map %s: its run ended with the rollback unsettled (%s)", id, m.describe())
		}
		for _, pos := range sortedInts(rb.outcomes) {
			o := rb.outcomes[pos]
			if o.Outcome != "undone" && o.Outcome != "not_needed" {
				c.violate("map %s: element %d (rollback position %d) ended %s %v", id, o.Index, pos, o.Outcome, o.Failures)
			}
		}
	case rule == undoForbidden && m.rb.exists:
		c.violate("map %s: rolled back although its run completed", id)
	}
	c.claims(id, m)
}

// claims checks the claim audit of a map: no batch and no owner signal
// claimed twice, and every batch exactly [k*B, min((k+1)*B, total)).
func (c *checker) claims(id string, m mapView) {
	for _, key := range sortedStrings(m.claims) {
		vals := m.claims[key]
		if len(vals) > 1 {
			c.violate("map %s: %s claimed %d times (to/pid/ms: %s)", id, key, len(vals), strings.Join(vals, ", "))
		}
		kind, from, _ := strings.Cut(key, ":")
		if strings.Contains(kind, "sig") {
			continue
		}
		f, _ := strconv.Atoi(from)
		to, _, _ := strings.Cut(vals[0], "/")
		t, _ := strconv.Atoi(to)
		size := m.total
		if kind != "fwd" {
			size = m.rb.total
		}
		if f%m.batch != 0 || t != min(f+m.batch, size)-1 {
			c.violate("map %s: %s claimed [%d, %d], not a whole batch of %d", id, kind, f, t, m.batch)
		}
	}
}

// ---- reading a map ----

// mapView is what Redis holds of a map, forward and rolling back, and of
// its claims.
type mapView struct {
	exists                bool
	total, batch, settled int
	offset                int
	failed                bool
	results               []int
	rb                    rbView
	claims                map[string][]string // "<kind>:<from>" -> "<to>/<pid>/<ms>" values
}

type rbView struct {
	exists                 bool
	total, settled, offset int
	outcomes               map[int]rbOutcome // by rollback position
}

// rbOutcome mirrors a rollback outcome as mapstep stores it.
type rbOutcome struct {
	Index    int                       `msgpack:"i"`
	Outcome  string                    `msgpack:"o"`
	Failures []reactor.RollbackFailure `msgpack:"f,omitempty"`
}

func (m mapView) settledForward() bool {
	return m.settled >= m.offset && (m.offset >= m.total || m.failed)
}

func (m mapView) describe() string {
	if !m.exists {
		return "not started"
	}
	s := fmt.Sprintf("forward settled %d/%d (claimed %d, failed %v)", m.settled, m.total, m.offset, m.failed)
	if m.rb.exists {
		s += fmt.Sprintf(", rollback settled %d/%d (claimed %d)", m.rb.settled, m.rb.total, m.rb.offset)
	}
	return s
}

func (c *checker) readMap(ctx context.Context, id string) (mapView, error) {
	k := c.keys
	var meta, rbMeta, rbRes, claims *redis.MapStringStringCmd
	var off, rbOff *redis.StringCmd
	var failed *redis.IntCmd
	var res *redis.StringSliceCmd
	_, err := c.s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		meta = p.HGetAll(ctx, k.MapMeta(id))
		off = p.Get(ctx, k.MapOffset(id))
		failed = p.Exists(ctx, k.MapFailed(id))
		res = p.HKeys(ctx, k.MapResults(id))
		rbMeta = p.HGetAll(ctx, k.MapRbMeta(id, 1))
		rbOff = p.Get(ctx, k.MapRbOffset(id, 1))
		rbRes = p.HGetAll(ctx, k.MapRbResults(id, 1))
		claims = p.HGetAll(ctx, claimsKey(id))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return mapView{}, err
	}
	var m mapView
	if len(meta.Val()) == 0 {
		return m, nil
	}
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	mv := meta.Val()
	m = mapView{exists: true, total: atoi(mv["total"]), batch: atoi(mv["batch_size"]), settled: atoi(mv["settled"]),
		offset: atoi(off.Val()), failed: failed.Val() == 1, claims: map[string][]string{}}
	for _, f := range res.Val() {
		m.results = append(m.results, atoi(f))
	}
	if rv := rbMeta.Val(); len(rv) > 0 {
		m.rb = rbView{exists: true, total: atoi(rv["total"]), settled: atoi(rv["settled"]), offset: atoi(rbOff.Val()),
			outcomes: map[int]rbOutcome{}}
		for pos, raw := range rbRes.Val() {
			var o rbOutcome
			if err := codec.Unmarshal([]byte(raw), &o); err != nil {
				return m, fmt.Errorf("decode rollback outcome %s[%s]: %w", id, pos, err)
			}
			m.rb.outcomes[atoi(pos)] = o
		}
	}
	for field, val := range claims.Val() {
		if i := strings.LastIndexByte(field, ':'); i > 0 {
			m.claims[field[:i]] = append(m.claims[field[:i]], val)
		}
	}
	return m, nil
}

func sortedInts[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sortedStrings[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
