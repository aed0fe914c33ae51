package engine

// Status is the lifecycle state of a run.
type Status string

// Run statuses. Terminal: completed, failed, halted, cancelled, aborted.
const (
	// StatusPending: the run is stored and waits for a worker.
	StatusPending Status = "pending"
	// StatusRunning: steps are executing.
	StatusRunning Status = "running"
	// StatusPaused is reserved for runs waiting on an outside signal.
	StatusPaused Status = "paused"
	// StatusCompleted: every step ran; the run returned a value.
	StatusCompleted Status = "completed"
	// StatusFailed: a step failed and the completed steps were rolled back.
	StatusFailed Status = "failed"
	// StatusHalted: a step asked the run to stop; nothing was rolled back.
	StatusHalted Status = "halted"
	// StatusCancelled: the run was undone on request (Cancel or Undo).
	StatusCancelled Status = "cancelled"
	// StatusAborted: an in-process run was cut short because its caller's
	// context ended. Its completed steps are kept; Undo rolls them back.
	StatusAborted Status = "aborted"
	// StatusRollingBack: a rollback is under way. Not terminal: a crashed
	// rollback is resumed, never restarted from the failing step.
	StatusRollingBack Status = "rolling_back"
)

// Terminal reports whether s is a final status.
func (s Status) Terminal() bool {
	switch s {
	case StatusCompleted, StatusFailed, StatusHalted, StatusCancelled, StatusAborted:
		return true
	}
	return false
}

// Statuses lists every status, in lifecycle order.
func Statuses() []Status {
	return []Status{StatusPending, StatusRunning, StatusPaused, StatusRollingBack,
		StatusCompleted, StatusFailed, StatusHalted, StatusCancelled, StatusAborted}
}

// RollbackStatus is the rollback state of one ledger entry, from a closed set.
type RollbackStatus string

// Rollback statuses of a ledger entry or of the failing step's compensation.
const (
	// RollbackPending: completed and still applied; not yet undone.
	RollbackPending RollbackStatus = "pending"
	// RollbackCompensating: the undo was called and has not returned.
	RollbackCompensating RollbackStatus = "compensating"
	// RollbackCompensated: the undo (or compensate) returned successfully.
	RollbackCompensated RollbackStatus = "compensated"
	// RollbackNoCompensation: the step has no undo or compensate; recorded,
	// not a failure.
	RollbackNoCompensation RollbackStatus = "no_compensation_registered"
	// RollbackFailed: the undo or compensate returned an error or timed out.
	RollbackFailed RollbackStatus = "compensation_failed"
	// RollbackOutOfWindow: the step's undo window (UndoWindow) had closed
	// when the rollback started, so its effect was kept and nothing was
	// called. Listed, not a failure.
	RollbackOutOfWindow RollbackStatus = "out_of_window"
	// RollbackConflict: a guarded undo found the resource neither at the
	// effect's after state nor at its before state: somebody else changed
	// it. The verdict of an attempt (the audit records it); the entry then
	// needs a person.
	RollbackConflict RollbackStatus = "conflict"
	// RollbackNeedsPerson: the entry conflicted and waits for a person to
	// resolve it (Engine.Resolve). It is never attempted again, and it
	// blocks every older entry on its resource.
	RollbackNeedsPerson RollbackStatus = "needs_human"
	// RollbackBlocked: not attempted (zero attempts) because a newer entry
	// on the same resource is still applied (it conflicted, failed or was
	// kept): undoing the older change would write over the newer one.
	RollbackBlocked RollbackStatus = "blocked"
	// RollbackManuallyReverted: a person resolved a conflicted entry and
	// says the resource is back at the entry's before state.
	RollbackManuallyReverted RollbackStatus = "manually_reverted"
	// RollbackLeftApplied: a person resolved a conflicted entry by leaving
	// the resource as it is; the entries it blocked stay applied for good.
	RollbackLeftApplied RollbackStatus = "left_applied"
)

// statusClass is what a rollback status means for the rollback's summary.
type statusClass uint8

const (
	// classOutstanding: not settled yet (the rollback is under way).
	classOutstanding statusClass = iota + 1
	// classReverted: its effect was reversed.
	classReverted
	// classKept: nothing can reverse it (no compensation registered): an
	// irreversible effect kept, listed, not a failure.
	classKept
	// classHuman: a person must look at it.
	classHuman
	// classOutOfWindow: kept because its undo window had closed: listed,
	// not a failure, but an effect still in place.
	classOutOfWindow
	// classLeftApplied: kept in place by a person's decision (a resolved
	// conflict, or an entry under one): nobody waits for it, and it is an
	// effect still in place.
	classLeftApplied
)

// rollbackStatuses is the closed set of rollback statuses, in lifecycle
// order, each with its summary class. It is the one place a status is
// declared known: Valid, the save path's check and SummarizeRollback all
// read it, so adding a status (the guarded-undo conflict, needs_human,
// blocked) is one line here plus its constant.
var rollbackStatuses = []struct {
	status RollbackStatus
	class  statusClass
}{
	{RollbackPending, classOutstanding},
	{RollbackCompensating, classOutstanding},
	{RollbackCompensated, classReverted},
	{RollbackNoCompensation, classKept},
	{RollbackFailed, classHuman},
	{RollbackOutOfWindow, classOutOfWindow},
	{RollbackConflict, classHuman},
	{RollbackNeedsPerson, classHuman},
	{RollbackBlocked, classHuman},
	{RollbackManuallyReverted, classReverted},
	{RollbackLeftApplied, classLeftApplied},
}

// RollbackStatuses lists every rollback status, in lifecycle order.
func RollbackStatuses() []RollbackStatus {
	out := make([]RollbackStatus, len(rollbackStatuses))
	for i, r := range rollbackStatuses {
		out[i] = r.status
	}
	return out
}

func (s RollbackStatus) class() statusClass {
	for _, r := range rollbackStatuses {
		if r.status == s {
			return r.class
		}
	}
	return 0
}

// Valid reports whether s is one of the known rollback statuses
// (RollbackStatuses). A run is never stored with any other.
func (s RollbackStatus) Valid() bool { return s.class() != 0 }
