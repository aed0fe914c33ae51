// Package maptask is the plumbing between package mapstep and the packages
// that carry its work (worker, sweeper): the element and rollback tasks, what
// the map sweeper needs to know of a task id, and the entry points mapstep
// registers when it is imported. None of it is for users: it keeps mapstep's
// public API to what a reactor author calls.
package maptask

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
)

// ElementTask is one element to execute on a worker.
type ElementTask struct {
	MapID string
	Index int
	// Input is the element's item, encoded (carried in the task so the job
	// needs no read of the source). Empty: the job fetches its item from
	// the map's source (the map sweeper's re-enqueues carry none).
	Input codec.Raw
	// Redelivery, when set, is appended to the task id: the map sweeper
	// re-enqueues a position whose task id is spent (its worker died with
	// the task active) under a fresh id (r1, r2, r3).
	Redelivery string
	// Meta is the map's immutable metadata, encoded by package mapstep, so
	// that the job reads no map metadata before it starts. Empty: the job
	// reads it from the map (tasks enqueued before it was carried, the map
	// sweeper's re-enqueues).
	Meta codec.Raw
}

// TaskID is the asynq task id of an element: one cause, one id.
func (t ElementTask) TaskID() string {
	if t.Redelivery != "" {
		return fmt.Sprintf("el:%s:%d:%s", t.MapID, t.Index, t.Redelivery)
	}
	return fmt.Sprintf("el:%s:%d", t.MapID, t.Index)
}

// Enqueuer puts element tasks on the workers' queue; worker.Client
// implements it (through Adapt). An id already queued must return nil.
type Enqueuer interface {
	EnqueueElement(ctx context.Context, t ElementTask) error
}

// ErrBadTask is returned for a task that names something its map does not
// have (an element out of range, a rollback position for another element):
// retrying cannot help, so workers archive it.
var ErrBadTask = errors.New("mapstep: malformed task")

// ErrMapGone is returned for an element task whose map no longer exists.
var ErrMapGone = errors.New("mapstep: map not found (finished and expired, or never started)")

// RollbackTask is one element rollback job.
type RollbackTask struct {
	MapID string
	Gen   int
	Pos   int
	// Index is the element at position Pos (total-1-Pos, with the total
	// fixed when the rollback started), carried so the job reads its map
	// in one round trip.
	Index int
	// Redelivery, when set, is appended to the task id (see ElementTask).
	Redelivery string
	// Meta, Fwd, Total and WindowAt, when Meta is set, are what the job would read
	// first: the map's immutable metadata (encoded by package mapstep), the
	// element's forward outcome (encoded; empty for none) and the
	// rollback's total, put in the task by whoever claimed its position.
	// Without Meta the job reads them (tasks enqueued before they were
	// carried, the map sweeper's, a re-triggered generation's).
	Meta, Fwd codec.Raw
	Total     int
	// WindowAt is the rollback's undo-window time (server ms; 0: none),
	// carried with Meta.
	WindowAt int64
}

// TaskID is the asynq task id of a rollback job.
func (t RollbackTask) TaskID() string {
	if t.Redelivery != "" {
		return fmt.Sprintf("rb:%s:%d:%d:%s", t.MapID, t.Gen, t.Pos, t.Redelivery)
	}
	return fmt.Sprintf("rb:%s:%d:%d", t.MapID, t.Gen, t.Pos)
}

// RollbackEnqueuer puts rollback jobs on the queue; worker.Client implements it.
type RollbackEnqueuer interface {
	EnqueueRollback(ctx context.Context, t RollbackTask) error
}

// TaskFate is what the queue knows of a task id.
type TaskFate int

const (
	// TaskMissing: no task has this id (never enqueued, or completed and
	// forgotten). Enqueueing the id again is safe.
	TaskMissing TaskFate = iota
	// TaskLive: pending, scheduled, retrying, or active on a worker that is
	// alive. It will run; leave it.
	TaskLive
	// TaskDead: active on a worker that stopped extending its lease (it
	// died). The id is spent until the queue reclaims it; a redelivery
	// needs a fresh id.
	TaskDead
	// TaskArchived: archived; it will not run again. Delete it before
	// enqueueing its id again.
	TaskArchived
	// TaskCompleted: completed and retained.
	TaskCompleted
)

func (f TaskFate) String() string {
	switch f {
	case TaskMissing:
		return "missing"
	case TaskLive:
		return "live"
	case TaskDead:
		return "dead"
	case TaskArchived:
		return "archived"
	case TaskCompleted:
		return "completed"
	}
	return "TaskFate(" + strconv.Itoa(int(f)) + ")"
}

// TaskInspector tells the map sweeper what became of a task; package
// sweeper implements it with asynq's Inspector. A task is named by a
// TaskRef, which says which queue (shard) it is on.
type TaskInspector interface {
	TaskFate(ctx context.Context, t TaskRef) (TaskFate, error)
	// IdleTaskFate is TaskFate for the task of a map position that has no
	// outcome and whose element lock nobody holds (the caller checked): an
	// active task is dead once two looks a second apart of Redis server
	// time find it so, its lease unchanged, instead of after three missed
	// lease extensions. A delivery that is running holds the lock from its
	// first round trip to its settle, which releases it in the same script,
	// so an active delivery that holds no lock for that long has stopped:
	// its worker died and the lock lapsed. (A rollback job releases the
	// element's lock when its undo ends, a moment before it settles; the
	// sweeper reads the outcome again before it redelivers, so a job that
	// settled in that moment is not taken for lost.) Should a live delivery be slower
	// than that to take the lock, the redelivery is a duplicate, which the
	// element lock serializes and the settle's first-writer-wins absorbs.
	// When a look at an active task was not yet enough for a verdict, again
	// says how soon the next one can be.
	IdleTaskFate(ctx context.Context, t TaskRef) (fate TaskFate, again time.Duration, err error)
	// DeleteTask deletes an archived or completed task so its id can be
	// enqueued again.
	DeleteTask(ctx context.Context, t TaskRef) error
}

// SweepOptions configure one RecoverMap call.
type SweepOptions struct {
	// Tasks inspects task ids. Required.
	Tasks TaskInspector
	// StaleBefore is a Redis server time (ms): a map (or rollback) that
	// settled a position after it is making progress and is left alone.
	// Zero leaves alone every map that ever settled a position; to examine
	// every map whatever its age, pass the server's time now (as
	// sweeper.Sweeper.RecoverRun does).
	StaleBefore int64
	// StaleAfter, when set on a Redis Cluster, makes RecoverMap judge a
	// map's staleness by the clock of the node that holds it, which
	// stamped its settles, as now less StaleAfter, instead of by
	// StaleBefore (read on another node, whose clock may differ).
	StaleAfter time.Duration
	// IdleAfter is the window of Tasks.IdleTaskFate: a map whose element
	// lock is about to lapse, within it, is looked at again then.
	IdleAfter time.Duration
}

// Recovery is what RecoverMap did to one map.
type Recovery struct {
	// Elements and Rollbacks count element tasks and rollback jobs
	// enqueued again (fresh ids included).
	Elements, Rollbacks int
	// Claims counts batches claimed in place of a lost trigger.
	Claims int
	// Resumes counts owner resumes enqueued again.
	Resumes int
	// Fresh counts redeliveries under a fresh id (their task died active).
	Fresh int
	// Deleted counts archived tasks deleted before their id was reused.
	Deleted int
	// Live is set when the map made progress recently and was not examined.
	Live bool
	// Touched is the Redis server time (ms) of the map's last settle (of
	// its current rollback, when it has one).
	Touched int64
	// LookAgain, when positive, is how soon the map should be examined
	// again, sooner than the sweeper's StaleAfter: a verdict needs a second
	// look (IdleTaskFate), or an element lock the pass found held lapses
	// then, with no settle since the map went stale.
	LookAgain time.Duration
	// Missing is set when the map has no keys: its owner indexed it and has
	// not created it yet (or died first: the run sweeper revives the owner,
	// which creates it), or the map expired. The sweeper drops the entry
	// only once the owner is gone or finished too.
	Missing bool
	// Done is set when the map needs no sweeping any more: its owner has
	// adopted it (or is gone). The sweeper removes it from the index (and
	// from Owner's set of maps).
	Done bool
	// Owner is the map's owner run, when the map exists.
	Owner string
}

// Dispatched is the number of tasks RecoverMap enqueued.
func (r Recovery) Dispatched() int { return r.Elements + r.Rollbacks + r.Resumes }

// Enqueuers is what carries both kinds of map task: worker.Client (through
// the adapter package worker registers in Adapt) or a wrapper of one.
type Enqueuers interface {
	Enqueuer
	RollbackEnqueuer
}

// Adapt returns the map-task side of a run Enqueuer: q itself when it
// implements Enqueuers (a test or benchmark wrapper), else the Sender a
// worker.Client embeds.
func Adapt(q engine.Enqueuer) (Enqueuers, bool) {
	if t, ok := q.(Enqueuers); ok {
		return t, true
	}
	if s, ok := q.(interface{ mapTasks() Enqueuers }); ok {
		if t := s.mapTasks(); t != nil {
			return t, true
		}
	}
	return nil, false
}

// Sender is how a worker.Client carries its map-task side without an
// exported method: the Client embeds a *Sender under an unexported alias,
// which promotes the unexported method mapTasks into the Client's method
// set, and only this package can name that method (Adapt).
type Sender struct{ tasks Enqueuers }

// NewSender returns a Sender for t.
func NewSender(t Enqueuers) *Sender { return &Sender{tasks: t} }

func (s *Sender) mapTasks() Enqueuers {
	if s == nil {
		return nil
	}
	return s.tasks
}

// MustAdapt is Adapt for callers that know q is a worker.Client (tests,
// benchmarks, the soak loop): it panics otherwise.
func MustAdapt(q engine.Enqueuer) Enqueuers {
	t, ok := Adapt(q)
	if !ok {
		panic(fmt.Sprintf("maptask: %T enqueues no map tasks (use a *worker.Client)", q))
	}
	return t
}
