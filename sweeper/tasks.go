package sweeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/mapstep"
)

// leaseDuration is how far asynq (v0.26) pushes an active task's lease each
// time its worker's heartbeat (every 5 s) extends it.
const leaseDuration = 30 * time.Second

// deadAfter is how long a lease must have gone unextended before the
// sweeper calls the task's worker dead: three missed heartbeats, which also
// absorbs a few seconds of clock skew between the worker and the sweeper.
const deadAfter = 15 * time.Second

// queueTasks answers mapstep.TaskInspector for one asynq queue.
type queueTasks struct {
	rdb   redis.UniversalClient
	insp  *asynq.Inspector
	queue string
}

func newQueueTasks(rdb redis.UniversalClient, queue string) *queueTasks {
	return &queueTasks{rdb: rdb, insp: asynq.NewInspectorFromRedisClient(rdb), queue: queue}
}

// TaskFate implements mapstep.TaskInspector. An active task is live while
// its worker keeps extending its lease; asynq itself reclaims a task only
// when the lease has run out and its recoverer next runs (a minute or
// more), so the sweeper calls it dead earlier, as soon as the heartbeats
// stop. The redelivery gets a fresh id, and the element lock (or the run
// lock) keeps the two deliveries from overlapping.
func (q *queueTasks) TaskFate(ctx context.Context, id string) (mapstep.TaskFate, error) {
	info, err := q.insp.GetTaskInfo(q.queue, id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return mapstep.TaskMissing, nil
	case err != nil:
		return 0, fmt.Errorf("sweeper: inspect task %s: %w", id, err)
	}
	switch info.State {
	case asynq.TaskStateArchived:
		return mapstep.TaskArchived, nil
	case asynq.TaskStateCompleted:
		return mapstep.TaskCompleted, nil
	case asynq.TaskStateActive:
		// The lease set is asynq's: asynq:{<queue>}:lease, scored by the
		// lease's expiry in Unix seconds.
		exp, err := q.rdb.ZScore(ctx, "asynq:{"+q.queue+"}:lease", id).Result()
		if errors.Is(err, redis.Nil) {
			return mapstep.TaskDead, nil
		}
		if err != nil {
			return 0, fmt.Errorf("sweeper: read the lease of task %s: %w", id, err)
		}
		extended := time.Unix(int64(exp), 0).Add(-leaseDuration)
		if time.Since(extended) > deadAfter {
			return mapstep.TaskDead, nil
		}
		return mapstep.TaskLive, nil
	}
	return mapstep.TaskLive, nil // pending, scheduled, retry, aggregating
}

// DeleteTask implements mapstep.TaskInspector.
func (q *queueTasks) DeleteTask(_ context.Context, id string) error {
	err := q.insp.DeleteTask(q.queue, id)
	if err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
		return fmt.Errorf("sweeper: delete task %s: %w", id, err)
	}
	return nil
}
