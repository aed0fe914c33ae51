package sweeper

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/maptask"
)

// deadAfter is how long of the Redis server's time an active task's lease
// must have gone unextended before the sweeper calls its worker dead: three
// missed heartbeats (asynq v0.26 extends a lease every 5 s).
const deadAfter = 15 * time.Second

// idleAfter is how long of the Redis server's time an active task of a map
// position whose element nobody holds must stay so, its lease unchanged,
// before the sweeper calls it dead (maptask.TaskInspector.IdleTaskFate).
const idleAfter = time.Second

// leaseSeenTTL is how long the sweeper keeps its observation of a lease
// after it last looked. A map examined less often than this (StaleAfter
// above it) never gets a dead verdict from the sweeper; asynq's own
// recoverer reclaims such tasks once their lease runs out.
const leaseSeenTTL = 10 * time.Minute

var (
	//go:embed lua/lease_seen.lua
	leaseSeenSrc    string
	leaseSeenScript = redis.NewScript(leaseSeenSrc)
)

// queueTasks answers maptask.TaskInspector for one asynq queue and its
// shards: an element task or a rollback job is looked up on the shard
// queue its map id and index choose (maptask.TaskRef.Queue), the one its
// enqueuer (a worker.Client with as many shards) put it on; an owner task
// on the queue itself.
type queueTasks struct {
	rdb    redis.UniversalClient
	insp   *asynq.Inspector
	queue  string
	shards int
	prefix string
}

func newQueueTasks(rdb redis.UniversalClient, queue string, shards int, prefix string) *queueTasks {
	return &queueTasks{rdb: rdb, insp: asynq.NewInspectorFromRedisClient(rdb), queue: queue, shards: shards, prefix: prefix}
}

// queueOf is the queue task t is on.
func (q *queueTasks) queueOf(t maptask.TaskRef) string { return t.Queue(q.queue, q.shards) }

// leaseSeenKey is the sweeper's observation of task id's lease. It carries
// the sweeper's hash tag: only the (single, leader-locked) sweeper reads and
// writes these keys, and they expire.
func leaseSeenKey(prefix, queue, id string) string {
	return prefix + ":{sweeper}:lease:" + queue + ":" + id
}

// TaskFate implements maptask.TaskInspector. An active task is live while
// its worker keeps extending its lease; asynq itself reclaims a task only
// when the lease has run out and its recoverer next runs (a minute or
// more), so the sweeper calls it dead earlier, as soon as the heartbeats
// stop. The redelivery gets a fresh id, and the element lock (or the run
// lock) keeps the two deliveries from overlapping.
//
// The verdict reads no clock but the Redis server's: the lease score is
// written with the extending worker's clock, so the sweeper never compares
// it with a time, only with itself, over server time (lease_seen.lua). A
// verdict therefore needs two looks at least deadAfter apart. An active task
// with no lease entry is not called dead: an absent reading is no evidence
// (the entry is written with the task's move to active, and asynq's
// recoverer, which owns the lease set, deals with the odd case).
func (q *queueTasks) TaskFate(ctx context.Context, t maptask.TaskRef) (maptask.TaskFate, error) {
	fate, _, err := q.fate(ctx, t, leaseSeenKey(q.prefix, q.queueOf(t), t.ID), deadAfter)
	return fate, err
}

// IdleTaskFate implements maptask.TaskInspector: TaskFate with idleAfter
// for deadAfter, for the task of an open map position whose element lock
// nobody holds. Its observations are kept apart from TaskFate's, so that
// an earlier look at the task while its element was held does not count.
// When a look at an active task was not yet enough for a verdict, it
// returns how soon the next one can be.
func (q *queueTasks) IdleTaskFate(ctx context.Context, t maptask.TaskRef) (maptask.TaskFate, time.Duration, error) {
	return q.fate(ctx, t, idleSeenKey(q.prefix, q.queueOf(t), t.ID), idleAfter)
}

// idleSeenKey is the sweeper's observation of task id while its element
// was idle (IdleTaskFate).
func idleSeenKey(prefix, queue, id string) string {
	return prefix + ":{sweeper}:idle:" + queue + ":" + id
}

// fate is TaskFate over the observation at seen: an active task is dead
// once its lease has gone unchanged for after.
func (q *queueTasks) fate(ctx context.Context, t maptask.TaskRef, seen string, after time.Duration) (maptask.TaskFate, time.Duration, error) {
	id, queue := t.ID, q.queueOf(t)
	info, err := q.insp.GetTaskInfo(queue, id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return maptask.TaskMissing, 0, nil
	case err != nil:
		return 0, 0, fmt.Errorf("sweeper: inspect task %s: %w", id, err)
	}
	switch info.State {
	case asynq.TaskStateArchived:
		return maptask.TaskArchived, 0, nil
	case asynq.TaskStateCompleted:
		return maptask.TaskCompleted, 0, nil
	case asynq.TaskStateActive:
		// The lease set is asynq's: asynq:{<queue>}:lease, scored by the
		// lease's expiry in Unix seconds of the worker's clock.
		exp, err := q.rdb.ZScore(ctx, "asynq:{"+queue+"}:lease", id).Result()
		if errors.Is(err, redis.Nil) {
			return maptask.TaskLive, 0, nil // unknown, which is not dead
		}
		if err != nil {
			return 0, 0, fmt.Errorf("sweeper: read the lease of task %s: %w", id, err)
		}
		wait, err := leaseSeenScript.Run(ctx, q.rdb, []string{seen},
			strconv.FormatFloat(exp, 'f', -1, 64), after.Milliseconds(), leaseSeenTTL.Milliseconds()).Int64()
		if err != nil {
			return 0, 0, fmt.Errorf("sweeper: observe the lease of task %s: %w", id, err)
		}
		if wait == 0 {
			return maptask.TaskDead, 0, nil
		}
		return maptask.TaskLive, time.Duration(wait) * time.Millisecond, nil
	}
	return maptask.TaskLive, 0, nil // pending, scheduled, retry, aggregating
}

// DeleteTask implements maptask.TaskInspector.
func (q *queueTasks) DeleteTask(_ context.Context, t maptask.TaskRef) error {
	err := q.insp.DeleteTask(q.queueOf(t), t.ID)
	if err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
		return fmt.Errorf("sweeper: delete task %s: %w", t.ID, err)
	}
	return nil
}
