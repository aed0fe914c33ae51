package sweeper_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/sweeper"
)

// lookHook is the map sweeper's TaskInspector with a hook that runs before
// each IdleTaskFate look: what a worker does between the pass's read of
// the outcomes and its look at the task.
type lookHook struct {
	maptask.TaskInspector
	before func(id string)
}

func (h lookHook) IdleTaskFate(ctx context.Context, t maptask.TaskRef) (maptask.TaskFate, time.Duration, error) {
	h.before(t.ID)
	return h.TaskInspector.IdleTaskFate(ctx, t)
}

// A delivery that settles its position and leaves the queue between a
// pass's read of the map's outcomes and its look at the task is not lost:
// the pass finds the task gone, but the outcome is there now, and nothing
// is redelivered. (A rollback job releases the element's lock before it
// settles, so the window is a real one; an eager sweeper hit it.)
func TestMapSweepDoesNotRedeliverWhatSettledDuringThePass(t *testing.T) {
	forwardAndRollback(t, func(t *testing.T, rollback bool) {
		m := newMapEnv(t, nil)
		mapID := m.start("settle-race", rollback)
		first, rest, what := elTask(mapID, 0), elTasks(mapID, 1, 2, 3, 4), "ran"
		if rollback {
			m.toRollback("settle-race", mapID)
			first, rest, what = rbTask(mapID, 0), rbTasks(mapID, 1, 2, 3, 4), "undone"
		}
		task := m.take(first) // a worker has it, and is about to finish
		var settled atomic.Bool
		tasks := lookHook{TaskInspector: sweeper.NewQueueTasks(m.rdb, m.queue, m.prefix), before: func(id string) {
			if id == first && settled.CompareAndSwap(false, true) {
				require.NoError(t, m.handler.ProcessTask(m.ctx, task))
			}
		}}
		srv, err := m.rdb.Time(m.ctx).Result()
		require.NoError(t, err)
		rec, err := mapcore.RecoverMap(m.ctx, m.engine, mapID, maptask.SweepOptions{Tasks: tasks,
			StaleBefore: srv.UnixMilli(), IdleAfter: sweeper.IdleAfter})
		require.NoError(t, err)
		require.True(t, settled.Load(), "the pass looked at the task of position 0, which had no outcome when read")
		require.Zero(t, rec.Dispatched(), "nothing is redelivered: %+v", rec)
		require.Equal(t, rest, m.pending())
		elem := 0 // forward position 0 is element 0; rollback position 0 the newest
		if rollback {
			elem = mapItems - 1
		}
		require.Equal(t, map[int]int{elem: 1}, m.counts(what), "position 0's element, once")
	})
}
