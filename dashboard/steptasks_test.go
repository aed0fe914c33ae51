package dashboard_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// taskDetail is what these tests read of a run's task steps.
type taskDetail struct {
	Steps []struct {
		Name       string `json:"name"`
		Task       bool   `json:"task"`
		Worker     string `json:"worker"`
		AttemptLog []struct {
			Attempt int    `json:"attempt"`
			Worker  string `json:"worker"`
			EndedAt string `json:"ended_at"`
			Error   string `json:"error"`
		} `json:"attempt_log"`
	} `json:"steps"`
}

// A step that runs as its own task shows, on the run's page, as a task with
// the worker of each attempt: while its second attempt still runs (its
// start recorded, no end), and once it has ended.
func TestRunDetailShowsTaskStepAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	running, release := make(chan struct{}), make(chan struct{})
	def := reactor.MustDefine("dash-task",
		reactor.Step("label", reactor.StepConfig[reactor.Args, string]{
			Task:  true,
			Retry: reactor.Retry{MaxAttempts: 2},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				if info, _ := reactor.RunInfoFrom(ctx); info.Attempt == 1 {
					return "", errors.New("printer jammed")
				}
				close(running)
				<-release
				return "printed", nil
			},
		}),
		reactor.Step("plain", reactor.StepConfig[reactor.Args, string]{After: []string{"label"},
			Run: func(context.Context, reactor.Args) (string, error) { return "ok", nil }}))
	e.startWorker(def)
	res, err := e.engine.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	select {
	case <-running:
	case <-ctx.Done():
		t.Fatal("the second attempt never ran")
	}
	var d taskDetail
	getAs(t, e, "/api/runs/"+res.RunID, "", &d)
	require.NotEmpty(t, d.Steps)
	label := d.Steps[len(d.Steps)-1]
	require.Equal(t, "label", label.Name, "%+v", d.Steps)
	assert.True(t, label.Task)
	require.Len(t, label.AttemptLog, 2)
	assert.Equal(t, "printer jammed", label.AttemptLog[0].Error)
	assert.NotEmpty(t, label.AttemptLog[0].EndedAt)
	assert.Empty(t, label.AttemptLog[1].EndedAt, "still running")
	assert.NotEmpty(t, label.Worker)
	assert.Equal(t, label.Worker, label.AttemptLog[1].Worker)
	close(release)

	final, err := e.engine.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	getAs(t, e, "/api/runs/"+res.RunID, "", &d)
	require.Len(t, d.Steps, 2)
	assert.True(t, d.Steps[0].Task)
	assert.NotEmpty(t, d.Steps[0].AttemptLog[1].EndedAt)
	assert.False(t, d.Steps[1].Task, "a plain step")
	assert.Empty(t, d.Steps[1].Worker)
}

// A run parked on a step that runs as its own task, while a worker's
// attempt runs it past StallAfter, is not stalled: the attempt's lease
// says the run executes.
func TestRunWaitingForARunningTaskStepIsNotStalled(t *testing.T) {
	t.Parallel()
	e := newStallEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	running, release := make(chan struct{}), make(chan struct{})
	def := reactor.MustDefine("long-task",
		reactor.Step("render", reactor.StepConfig[reactor.Args, string]{
			Task: true,
			Run: func(context.Context, reactor.Args) (string, error) {
				close(running)
				<-release
				return "rendered", nil
			},
		}))
	e.startWorker(def)
	res, err := e.engine.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	<-running
	run, err := e.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return time.Since(run.UpdatedAt) > 2*stallAfter }, 5*time.Second, 10*time.Millisecond)
	var d struct {
		Stall *struct {
			Kind string `json:"kind"`
		} `json:"stall"`
	}
	getAs(t, e, "/api/runs/"+res.RunID, "", &d)
	assert.Nil(t, d.Stall, "parked on a task step whose attempt runs")
	var page stallsPage
	e.get("/api/stalls", http.StatusOK, &page)
	assert.Nil(t, page.find(res.RunID))
	close(release)
	final, err := e.engine.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)
}
