package dashboard

import (
	"time"

	"github.com/goreactor/goreactor/reactor"
)

// withStepTasks puts on the steps that ran as tasks of their own
// (StepConfig.Task) their attempts as the step tasks recorded them: the
// worker (host:pid) of each, and the latest one's on the step. An attempt
// whose worker died has no end.
func withStepTasks(steps []stepView, tasks map[string][]reactor.StepTaskAttempt) {
	for i := range steps {
		as, ok := tasks[steps[i].Name]
		if !ok {
			continue
		}
		v := &steps[i]
		v.Task = true
		log := make([]attemptView, 0, len(as))
		for _, a := range as {
			av := attemptView{Attempt: a.Attempt, Worker: a.Worker, StartedAt: stamp(time.UnixMilli(a.StartedAt)), Error: a.Error, Retryable: true}
			if a.EndedAt > 0 {
				av.EndedAt, av.DurationMS = stamp(time.UnixMilli(a.EndedAt)), a.EndedAt-a.StartedAt
			}
			log = append(log, av)
		}
		if len(log) > 0 {
			v.Worker = log[len(log)-1].Worker
			v.AttemptLog, v.AttemptsDropped = log, 0
		}
	}
}
