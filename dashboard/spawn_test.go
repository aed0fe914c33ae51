package dashboard_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

type spawnDetail struct {
	SpawnedBy *struct {
		Run, Reactor, Step string
	} `json:"spawned_by"`
	Spawned []struct {
		Run, Reactor, Step string
	} `json:"spawned"`
}

// A run's detail links the runs its spawn steps started, and a spawned
// run's links the run (and step) that spawned it.
func TestRunDetailLinksSpawnedRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	child := reactor.MustDefine("dash-spawned",
		reactor.Step("send", reactor.StepConfig[reactor.Args, string]{Run: func(context.Context, reactor.Args) (string, error) { return "sent", nil }}))
	inner := reactor.MustDefine("dash-inner", reactor.Spawn("ping", child, reactor.SpawnConfig{}))
	def := reactor.MustDefine("dash-spawner",
		reactor.Spawn("notify", child, reactor.SpawnConfig{}),
		reactor.Compose("book", inner, reactor.ComposeConfig{}))
	e.startWorker(def)
	res, err := e.engine.Enqueue(ctx, def, nil, reactor.WithRunID("spawner-1"))
	require.NoError(t, err)
	final, err := e.engine.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())

	var d spawnDetail
	getAs(t, e, "/api/runs/spawner-1", "", &d)
	assert.Nil(t, d.SpawnedBy)
	require.Len(t, d.Spawned, 2)
	assert.Equal(t, reactor.SpawnID("spawner-1", "notify"), d.Spawned[0].Run)
	assert.Equal(t, "dash-spawned", d.Spawned[0].Reactor)
	assert.Equal(t, "notify", d.Spawned[0].Step)
	assert.Equal(t, "book/ping", d.Spawned[1].Step, "a composed child's spawn, by its path")
	assert.Equal(t, reactor.SpawnID("spawner-1", "book/ping"), d.Spawned[1].Run)

	var c spawnDetail
	getAs(t, e, "/api/runs/"+d.Spawned[1].Run, "", &c)
	require.NotNil(t, c.SpawnedBy)
	assert.Equal(t, "spawner-1", c.SpawnedBy.Run)
	assert.Equal(t, "book/ping", c.SpawnedBy.Step)
	assert.Empty(t, c.Spawned)
}
