package engine

import (
	"errors"
	"fmt"
	"time"
)

// ErrDeadlineExceeded is what the Failure of a run that ran past its
// deadline (WithDeadline, WithTimeout) unwraps to, also when read back from
// Redis (code "reactor.run_deadline_exceeded"). The run was rolled back like
// any failed run. It is not context.DeadlineExceeded, which a step's own
// Timeout produces.
var ErrDeadlineExceeded = errors.New("reactor: run deadline exceeded")

const codeRunDeadline = "reactor.run_deadline_exceeded"

func init() { builtinSentinel(codeRunDeadline, ErrDeadlineExceeded) }

// deadline is the run's deadline, zero when it has none.
func (x *execution) deadline() time.Time {
	if x.st.Deadline == 0 {
		return time.Time{}
	}
	return time.UnixMilli(x.st.Deadline)
}

// pastDeadline reports whether the run's deadline will have passed after
// wait from now.
func (x *execution) pastDeadline(wait time.Duration) bool {
	dl := x.deadline()
	return !dl.IsZero() && !x.e.now().Add(wait).Before(dl)
}

// deadlineFailure is the Failure of a run whose deadline passed before its
// next step.
func (x *execution) deadlineFailure() *Failure {
	err := Permanent(fmt.Errorf("%w: the run's deadline %s has passed",
		ErrDeadlineExceeded, x.deadline().UTC().Format(time.RFC3339Nano)))
	return newFailure("", err)
}

// deadlineError is the error of step path that stopped at the run's
// deadline (or would retry past it) with cause.
func (x *execution) deadlineError(path string, cause error) error {
	return Permanent(fmt.Errorf("%w: the run's deadline %s passed while step %q ran (its last error: %v)",
		ErrDeadlineExceeded, x.deadline().UTC().Format(time.RFC3339Nano), path, cause))
}
