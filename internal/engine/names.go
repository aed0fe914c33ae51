package engine

import "context"

// Old names kept so that code written against them still compiles. Each
// says what replaced it; none will grow new features. The package overview's
// "Reading a rollback" section says which name means what.

// RollbackStatus returns run id's rollback report.
//
// Deprecated: use RollbackReport. RollbackStatus is also the type of one
// entry's status, which made the two easy to confuse.
func (e *Engine) RollbackStatus(ctx context.Context, id string) (*RollbackReport, error) {
	return e.RollbackReport(ctx, id)
}

// RollbackFailureKind was the type of RollbackFailure.Kind and
// StepRollback.Kind.
//
// Deprecated: use CompensatingAction, which names the same two functions
// (ActionUndo, ActionCompensate) everywhere a rollback names them.
type RollbackFailureKind = CompensatingAction

// Kinds of rollback failure, under their old names.
const (
	// Deprecated: use ActionUndo.
	KindUndo = ActionUndo
	// Deprecated: use ActionCompensate.
	KindCompensate = ActionCompensate
)

// Outcomes lists every rollback outcome.
//
// Deprecated: use RollbackOutcomes. Outcome is the type of a run's result,
// not of a rollback's.
func Outcomes() []RollbackOutcome { return RollbackOutcomes() }
