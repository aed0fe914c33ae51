package dashboard

import (
	"time"

	"github.com/goreactor/goreactor/reactor"
)

// Steps that run as tasks of their own, and runs that steps spawned: what
// the run page shows of a run's work beyond its own execution.

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

// spawnLinkView is a link between a run and a run one of its steps spawned
// (reactor.SpawnLink).
type spawnLinkView struct {
	Run     string `json:"run"`
	Reactor string `json:"reactor"`
	Step    string `json:"step"`
}

// spawnLinks are run's links to the run that spawned it and to the runs it
// spawned.
func spawnLinks(run *reactor.Run) (by *spawnLinkView, spawned []spawnLinkView) {
	if l := run.SpawnedBy; l != nil {
		by = &spawnLinkView{Run: l.Run, Reactor: l.Reactor, Step: l.Step}
	}
	spawned = make([]spawnLinkView, 0, len(run.Spawned))
	for _, l := range run.Spawned {
		spawned = append(spawned, spawnLinkView{Run: l.Run, Reactor: l.Reactor, Step: l.Step})
	}
	return by, spawned
}
