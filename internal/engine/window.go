package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goreactor/goreactor/internal/runctx"
)

// Undo windows. A definition may bound how long after a step completed it
// can still be undone (UndoWindow): a refund accepted for 30 days, a booking
// that can be released only until the day before. The window of each ledger
// entry is judged once, when its rollback starts: an entry whose window had
// closed by then is kept and listed out_of_window (nothing is called), and
// every other entry is undone even if its window closes while the rollback
// is under way, because a rollback stopped halfway leaves a state that is
// neither what the run found nor what it made. The verdict is saved with
// the rollback before its first undo, so a crashed rollback resumes with it;
// a re-triggered rollback (RetryRollback) keeps the verdict of the rollback
// it retries.
//
// Time comes from one clock: the Redis server's, on the node that holds the
// run. A step's completion is stamped with the time of the run's last write
// plus the time elapsed since on this process's monotonic clock (no extra
// round trip; the local wall clock is never read), and the judgement reads
// the server's clock afresh. The run keeps the latest server time it has
// seen: a reading earlier than that (a failover to a node whose clock is
// behind, a clock stepped back) is a *ClockError, never a reopened window.

// UndoWindow bounds how long after a step of this definition completed its
// effect may be undone: once d has passed (by the Redis server's clock), a
// rollback keeps the step's effect and reports it out_of_window instead of
// calling its Undo. A rollback that started inside the window finishes. It
// applies to the definition's own steps and maps; a composed child's steps
// follow the child definition's window, and a map element's steps the
// element reactor's. Without it, steps can be undone for as long as the run
// is stored.
func UndoWindow(d time.Duration) Part {
	return partFunc(func(def *Definition) error {
		if d <= 0 {
			return &DefinitionError{Reactor: def.name, Reason: fmt.Sprintf("UndoWindow must be positive, got %s", d)}
		}
		if def.undoWindow != 0 {
			return &DefinitionError{Reactor: def.name, Reason: "UndoWindow declared twice"}
		}
		def.undoWindow = d
		return nil
	})
}

// UndoWindow returns the definition's undo window (0: none).
func (d *Definition) UndoWindow() time.Duration { return d.undoWindow }

// ErrClockBackwards is what a *ClockError matches with errors.Is.
var ErrClockBackwards = errors.New("reactor: the Redis server's clock went backwards")

// ClockError reports a reading of the Redis server's clock earlier than one
// the run already recorded: an undo window cannot be judged by it (it would
// reopen a window that had closed). Nothing is undone; the rollback is
// judged again when it is resumed or the call is repeated, once the clock
// has caught up.
type ClockError struct {
	RunID string
	// Now is the reading; Last the latest time the run recorded before.
	Now, Last time.Time
}

func (e *ClockError) Error() string {
	return fmt.Sprintf("reactor: run %s: the Redis server's clock reads %s, %s before the time the run already recorded (%s); "+
		"an undo window is never judged by a clock that went backwards (a failover to a node whose clock is behind, or a clock stepped back): "+
		"retry once the clock has caught up",
		e.RunID, e.Now.UTC().Format(time.RFC3339Nano), e.Last.Sub(e.Now), e.Last.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrClockBackwards) true.
func (e *ClockError) Is(target error) bool { return target == ErrClockBackwards }

// observeClock records a server time reading (Unix ms) and when it arrived.
func (x *execution) observeClock(at int64) {
	if at > 0 {
		x.clockAt, x.clockMono = at, time.Now()
	}
}

// stamp is the server time now, as well as the execution knows it without
// a round trip: its last reading plus the monotonic time since. An
// execution that has no reading yet reads the clock only when the frame's
// definition has an undo window (the stamp is only ever compared with one);
// it returns 0 otherwise, and on error, which a window treats as "inside".
func (x *execution) stamp(ctx context.Context, d *Definition) int64 {
	if x.clockAt == 0 && d != nil && d.undoWindow > 0 {
		if now, err := x.readClock(ctx); err == nil {
			return now
		}
	}
	if x.clockAt == 0 {
		return 0
	}
	return x.clockAt + time.Since(x.clockMono).Milliseconds()
}

// readClock reads the server's clock on the run's node.
func (x *execution) readClock(ctx context.Context) (int64, error) {
	now, err := x.e.store.ServerTime(ctx, x.target)
	if err != nil {
		return 0, err
	}
	now += x.e.clockSkew.Load() // tests: a node whose clock is behind
	x.observeClock(now)
	return now, nil
}

// windowClock reads the server's clock for judging undo windows and refuses
// a reading earlier than the latest one the run recorded.
func (x *execution) windowClock(ctx context.Context) (int64, error) {
	now, err := x.readClock(ctx)
	if err != nil {
		return 0, err
	}
	if last := x.st.Clock; now < last {
		return 0, &ClockError{RunID: x.st.ID, Now: time.UnixMilli(now), Last: time.UnixMilli(last)}
	}
	x.st.Clock = now
	return now, nil
}

// windowed reports whether an entry of ledger (of definition d) is subject
// to an undo window: its definition's, or one a construct's parts judge
// (a map whose element reactor has a window).
func windowed(d *Definition, ledger []*LedgerEntry) bool {
	if d == nil {
		return false
	}
	for _, e := range ledger {
		if len(e.Children) > 0 {
			if windowed(d.byName[e.Step].childDef(), e.Children) {
				return true
			}
			continue
		}
		if d.undoWindow > 0 || d.byName[e.Step].partsWindowed() {
			return true
		}
	}
	return false
}

// WindowedConstruct is implemented by a Construct whose parts have undo
// windows of their own (a map whose element reactor declares UndoWindow):
// the run's rollback then judges windows at its start, and hands the time
// to the construct (ConstructContext.UndoWindowAt), so that its parts
// judge theirs by the same instant, however late they run.
type WindowedConstruct interface {
	UndoWindowed() bool
}

// partsWindowed reports whether construct step s's parts judge undo
// windows.
func (s *stepDef) partsWindowed() bool {
	if s == nil || s.kind != kindConstruct {
		return false
	}
	w, ok := s.construct.(WindowedConstruct)
	return ok && w.UndoWindowed()
}

// UndoWindowAt is the Redis server time at which the run's rollback judges
// undo windows (zero when it judges none): a construct hands it to its
// parts, so that a rollback that started inside their windows finishes.
func (c *ConstructContext) UndoWindowAt() time.Time {
	if c.windowAt == 0 {
		return time.Time{}
	}
	return time.UnixMilli(c.windowAt)
}

// judgeWindow decides, once per rollback, which entries of f's undo stack
// are past their window, marking them out_of_window, and saves the verdict
// before the first undo. now is a reading taken by the caller (an Undo that
// checked the clock before changing anything), or 0 to read it here.
func (x *execution) judgeWindow(ctx context.Context, f *frame, now int64) error {
	rb := f.st.Rollback
	failing := rb.Trigger == TriggerFailure && !rb.Compensated && f.def.byName[rb.Step].partsWindowed()
	if rb.WindowAt != 0 || (!windowed(f.def, f.st.Ledger) && !failing) {
		return nil
	}
	if now == 0 {
		var err error
		if now, err = x.windowClock(ctx); err != nil {
			return err
		}
	}
	rb.WindowAt = now
	f.st.RbWindowAt = now
	markOutOfWindow(f.def, f.st.Ledger, now, rb.Trigger == TriggerTargeted)
	return x.checkpoint(ctx)
}

// markOutOfWindow marks the pending entries of ledger (of definition d)
// whose window had closed at now (only the marked targets of an UndoSteps,
// with onlyTargets). An entry with no completion time (recorded before
// times were kept, or cut short mid-step) counts as inside its window.
func markOutOfWindow(d *Definition, ledger []*LedgerEntry, now int64, onlyTargets bool) {
	if d == nil {
		return
	}
	for _, e := range ledger {
		if len(e.Children) > 0 {
			markOutOfWindow(d.byName[e.Step].childDef(), e.Children, now, onlyTargets)
			continue
		}
		if onlyTargets && !e.Target {
			continue
		}
		w := d.undoWindow.Milliseconds()
		if w > 0 && e.At > 0 && !e.Interrupted && e.Status == RollbackPending && now-e.At > w {
			e.Status = RollbackOutOfWindow
		}
	}
}

// resetLedger makes every entry of ledger pending again: entries still on
// the stack when a rollback starts are applied, whatever an earlier
// targeted undo left on them (compensation_failed, out_of_window).
func resetLedger(ledger []*LedgerEntry) {
	for _, e := range ledger {
		e.Status, e.Target = RollbackPending, false
		resetLedger(e.Children)
	}
}

// elementWindowAt is the time the owner's rollback judges undo windows at,
// as the construct undoing an element run passed it (0: none).
func elementWindowAt(ctx context.Context) int64 {
	el, _ := runctx.ElementFrom(ctx)
	return el.WindowAt
}
