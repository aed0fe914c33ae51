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

	"github.com/goreactor/goreactor/internal/liveness"
	"github.com/goreactor/goreactor/internal/maptask"
)

// deadAfter is how long of the Redis server's time an active task's lease
// must have gone unextended before the sweeper calls its worker dead: three
// missed heartbeats (asynq v0.26 extends a lease every 5 s).
const deadAfter = 15 * time.Second

// unlistedAfter is how long an active task must have gone unlisted in every
// worker's liveness record, its asynq lease unextended, before the sweeper
// calls it dead, when every asynq server serving its queue is a worker that
// records its deliveries. A live worker lists a task it took within a round
// trip of taking it; one killed between the two never does.
const unlistedAfter = 500 * time.Millisecond

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

// queueTasks answers maptask.TaskInspector for one asynq queue.
type queueTasks struct {
	rdb    redis.UniversalClient
	insp   *asynq.Inspector
	queue  string
	prefix string

	// workers is the workers' liveness records, read at most once per pass
	// (newPass forgets them), when the pass first meets an active task;
	// leased, read with it, is whether every asynq server serving the
	// queue is a worker that keeps such a record.
	workers *liveness.View
	leased  bool
	// undecided is set when a look at an unlisted task was not yet enough
	// for a verdict: its map is looked at again the next pass after
	// unlistedAfter, not StaleAfter later. The map sweeper clears it per
	// map.
	undecided bool
	// unleased, set by tests, makes every pass act as if a server without
	// a record served the queue.
	unleased bool
	// verdicts counts the active tasks the records judged, this pass.
	live, dead int
}

func newQueueTasks(rdb redis.UniversalClient, queue, prefix string) *queueTasks {
	return &queueTasks{rdb: rdb, insp: asynq.NewInspectorFromRedisClient(rdb), queue: queue, prefix: prefix}
}

// newPass forgets what the previous pass read of the workers.
func (q *queueTasks) newPass() {
	q.workers, q.live, q.dead = nil, 0, 0
}

// workerVerdict is what the workers' liveness records say of active task
// id, read once per pass.
func (q *queueTasks) workerVerdict(ctx context.Context, id string) (liveness.Verdict, error) {
	if q.workers == nil {
		v, err := liveness.Read(ctx, q.rdb, q.prefix)
		if err != nil {
			return liveness.Unknown, fmt.Errorf("sweeper: %w", err)
		}
		q.workers = &v
		servers, err := q.insp.Servers()
		if err != nil {
			return liveness.Unknown, fmt.Errorf("sweeper: read asynq's servers: %w", err)
		}
		q.leased = !q.unleased
		for _, s := range servers {
			if s.Queues[q.queue] > 0 && !v.Leased(liveness.Name(s.Host, s.PID)) {
				q.leased = false
				break
			}
		}
	}
	return q.workers.Of(q.queue, id), nil
}

// unlistedKey is the sweeper's observation of an active task that no
// worker's record lists (see unlistedAfter).
func unlistedKey(prefix, queue, id string) string {
	return prefix + ":{sweeper}:unlisted:" + queue + ":" + id
}

// leaseSeenKey is the sweeper's observation of task id's lease. It carries
// the sweeper's hash tag: only the (single, leader-locked) sweeper reads and
// writes these keys, and they expire.
func leaseSeenKey(prefix, queue, id string) string {
	return prefix + ":{sweeper}:lease:" + queue + ":" + id
}

// TaskFate implements maptask.TaskInspector. An active task is live while
// its worker is; asynq itself reclaims a task only when its 30 s lease has
// run out and its recoverer next runs (a minute or more), so the sweeper
// calls it dead earlier. The redelivery gets a fresh id, and the element
// lock (or the run lock) keeps the two deliveries from overlapping; the
// callers never ask about a task whose run or element is locked.
//
// A goreactor worker records every task it takes in its liveness lease
// (package internal/liveness): an active task that a worker whose lease
// lapsed took, and no live worker holds, is dead at once, the first pass
// after the lease expired (a few seconds after the kill). A task no
// worker's record lists was taken by a worker killed before it recorded
// it, or by a server that keeps no record (goreactor's Handler on a server
// of your own): while every asynq server of the queue is a recording
// worker, it is dead once two looks unlistedAfter apart found it unlisted
// with the same asynq lease; otherwise it is judged by asynq's lease, over
// 15 s.
//
// That verdict reads no clock but the Redis server's: the lease score is
// written with the extending worker's clock, so the sweeper never compares
// it with a time, only with itself, over server time (lease_seen.lua). A
// verdict therefore needs two looks at least deadAfter apart. An active task
// with no lease entry is not called dead: an absent reading is no evidence
// (the entry is written with the task's move to active, and asynq's
// recoverer, which owns the lease set, deals with the odd case).
func (q *queueTasks) TaskFate(ctx context.Context, id string) (maptask.TaskFate, error) {
	info, err := q.insp.GetTaskInfo(q.queue, id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return maptask.TaskMissing, nil
	case err != nil:
		return 0, fmt.Errorf("sweeper: inspect task %s: %w", id, err)
	}
	switch info.State {
	case asynq.TaskStateArchived:
		return maptask.TaskArchived, nil
	case asynq.TaskStateCompleted:
		return maptask.TaskCompleted, nil
	case asynq.TaskStateActive:
		switch v, err := q.workerVerdict(ctx, id); {
		case err != nil:
			return 0, err
		case v == liveness.Live:
			q.live++
			return maptask.TaskLive, nil
		case v == liveness.Dead:
			q.dead++
			return maptask.TaskDead, nil
		}
		// The lease set is asynq's: asynq:{<queue>}:lease, scored by the
		// lease's expiry in Unix seconds of the worker's clock.
		exp, err := q.rdb.ZScore(ctx, "asynq:{"+q.queue+"}:lease", id).Result()
		if errors.Is(err, redis.Nil) {
			return maptask.TaskLive, nil // unknown, which is not dead
		}
		if err != nil {
			return 0, fmt.Errorf("sweeper: read the lease of task %s: %w", id, err)
		}
		key, after := leaseSeenKey(q.prefix, q.queue, id), deadAfter
		if q.leased {
			// Every server of the queue records what it takes, and none
			// lists this task: taken by a worker killed before it could
			// record it, or a moment ago by a live one, which will have
			// recorded it by the next look.
			key, after = unlistedKey(q.prefix, q.queue, id), unlistedAfter
		}
		dead, err := leaseSeenScript.Run(ctx, q.rdb, []string{key},
			strconv.FormatFloat(exp, 'f', -1, 64), after.Milliseconds(), leaseSeenTTL.Milliseconds()).Int()
		if err != nil {
			return 0, fmt.Errorf("sweeper: observe the lease of task %s: %w", id, err)
		}
		if dead == 1 {
			if q.leased {
				q.dead++
			}
			return maptask.TaskDead, nil
		}
		if q.leased {
			q.undecided = true
		}
		return maptask.TaskLive, nil
	}
	return maptask.TaskLive, nil // pending, scheduled, retry, aggregating
}

// DeleteTask implements maptask.TaskInspector.
func (q *queueTasks) DeleteTask(_ context.Context, id string) error {
	err := q.insp.DeleteTask(q.queue, id)
	if err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
		return fmt.Errorf("sweeper: delete task %s: %w", id, err)
	}
	return nil
}
