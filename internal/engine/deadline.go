package engine

import (
	"context"
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

// bindDeadline makes the run's deadline a durable timer when the run leaves
// without any process executing it (parked on a fan-out map, paused at an
// interrupt): a wake-up scheduled at the deadline, on the run's queue. It
// resumes the run, which finds its deadline passed before its next step and
// rolls back (a map still running is stopped and undone, as a cancel
// does). One per run and deadline: parking again finds it queued. Without
// it such a run would fail only at its first checkpoint after it is woken
// by something else. A failed enqueue is logged; the run then fails at its
// next resume, as it did before timers.
func (x *execution) bindDeadline(ctx context.Context) {
	if x.st.Deadline == 0 || x.element || x.e.cfg.Enqueuer == nil || x.st.Status.Terminal() {
		return
	}
	w := Wake{ID: wakeID(x.st.ID, fmt.Sprintf("deadline:%d", x.st.Deadline)), RunID: x.st.ID, Reactor: x.st.Reactor,
		Queue: x.st.Queue, Delay: max(0, time.Until(x.deadline()))}
	if err := x.e.cfg.Enqueuer.Enqueue(context.WithoutCancel(ctx), w); err != nil {
		x.e.log.Warn("the run's deadline timer was not enqueued; the run fails at its next resume instead",
			"event", "reactor.deadline.timer", "run", x.st.ID, "error", err)
	}
}
