package sweeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/maptask"
)

// unusedTasks is a TaskInspector for passes that must not look at tasks.
type unusedTasks struct{ t *testing.T }

func (u unusedTasks) TaskFate(context.Context, maptask.TaskRef) (maptask.TaskFate, error) {
	u.t.Fatal("the pass looked at a task")
	return 0, nil
}

func (u unusedTasks) IdleTaskFate(context.Context, maptask.TaskRef) (maptask.TaskFate, time.Duration, error) {
	u.t.Fatal("the pass looked at a task")
	return 0, 0, nil
}

func (u unusedTasks) DeleteTask(context.Context, maptask.TaskRef) error {
	u.t.Fatal("the pass deleted a task")
	return nil
}

// On a Redis Cluster, a map's age is judged by the clock of the node that
// holds it, the clock its settles stamp it with, not by the clock the
// sweeper read on some other node: a map that settled a moment ago is live
// even when the pass's cutoff, read on a node a minute ahead, says it is
// a minute stale. On one Redis there is one clock and the cutoff rules.
func TestMapAgedByItsOwnNodesClock(t *testing.T) {
	t.Parallel()
	m := newMapEnv(t, nil)
	if _, cluster := m.rdb.(*redis.ClusterClient); !cluster {
		t.Skip("one Redis has one clock; make test-cluster runs this")
	}
	mapID := m.start("node-clock", false)
	m.deliverAll(elPrefix(mapID), 0) // a settle a moment ago
	srv, err := m.rdb.Time(m.ctx).Result()
	require.NoError(t, err)
	ahead := srv.Add(time.Minute).UnixMilli() // a cutoff read on a clock a minute ahead
	rec, err := mapcore.RecoverMap(m.ctx, m.engine, mapID, maptask.SweepOptions{Tasks: unusedTasks{t},
		StaleBefore: ahead, StaleAfter: time.Minute})
	require.NoError(t, err)
	require.True(t, rec.Live, "judged by the map's own node: it settled within StaleAfter")
}
