package reactor

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
)

// Valid reports whether s is one of the known rollback statuses.
func (s RollbackStatus) Valid() bool {
	switch s {
	case RollbackPending, RollbackCompensating, RollbackCompensated, RollbackNoCompensation, RollbackFailed:
		return true
	}
	return false
}
