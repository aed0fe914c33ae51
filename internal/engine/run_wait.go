package engine

import "context"

// NoWait makes Run return where the run leaves this process (a hand-off
// point, a fan-out map, a retry backoff scheduled as a wake-up) with a
// dispatched Result, instead of waiting for workers to finish it: the
// fire-and-forget form of Run. Wait for the RunID later, or use Enqueue to
// run the whole run on workers.
func NoWait() RunOption { return func(o *runOptions) { o.noWait = true } }

// runsToEnd reports whether Run should wait for a dispatched run.
func runsToEnd(opts []RunOption) bool {
	var o runOptions
	for _, opt := range opts {
		opt(&o)
	}
	return !o.noWait
}

// finish is Run's last part: a run that left this process is waited for
// (with Wait) unless the caller asked for NoWait. If ctx ends meanwhile, the
// dispatched Result comes back with Wait's error: the run goes on in the
// workers, and its RunID names it.
func (e *Engine) finish(ctx context.Context, res *Result, err error, opts []RunOption) (*Result, error) {
	if err != nil || res == nil || !runsToEnd(opts) {
		return res, err
	}
	if o := res.Outcome(); o != OutcomeDispatched && o != OutcomePaused {
		return res, err
	}
	final, err := e.Wait(ctx, res.RunID)
	if err != nil {
		return res, err
	}
	return final, nil
}
