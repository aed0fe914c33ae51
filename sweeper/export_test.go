package sweeper

import (
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/maptask"
)

// IdleSeenKey exposes the key of the sweeper's observation of the lease of
// a task whose map position's element nobody holds (IdleTaskFate), so that
// tests can seed an observation made earlier.
var IdleSeenKey = idleSeenKey

// IdleAfter is how long such a task must stay so before it is dead.
const IdleAfter = idleAfter

// SetBeforeRemove makes s call f between its read of an active-index entry
// and the entry's conditional removal: the window a racing writer uses.
func SetBeforeRemove(s *RunSweeper, f func(id string)) { s.beforeRemove = f }

// SetTrimBeforeRemove sets the trimmer's hook between its check of an entry
// and the entry's removal.
func SetTrimBeforeRemove(t *IndexTrimmer, f func(key, id string)) { t.beforeRemove = f }

// NewQueueTasks is the map sweeper's TaskInspector for one unsharded queue.
func NewQueueTasks(rdb redis.UniversalClient, queue, prefix string) maptask.TaskInspector {
	return newQueueTasks(rdb, queue, 1, prefix)
}
