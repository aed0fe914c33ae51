package mapcore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/payload"
	"github.com/goreactor/goreactor/worker"
)

// drainer executes the tasks of one test's asynq queue ONE AT A TIME, in
// the test's goroutine, so that every action's burst is observable (DESIGN
// 9, step-wise draining).
//
// No asynq server runs. The drainer lists the queue's pending tasks with an
// Inspector, deletes the task it picked (which frees its id, as a finished
// task with no retention does) and hands a task built from its type and
// payload to the worker's handler. The tasks that appear in the queue while
// the handler runs are that action's burst. Because nothing else consumes the
// queue, the queue only grows while a handler runs, and the difference of
// two listings is exactly what the handler enqueued.
//
// A test can also drop a task (delete without running), hold one (never
// picked until released), deliver a payload again (a duplicate), and observe
// the queue after an in-process action (the owner's engine.Run enqueues the
// first batch: that is a burst too).
type drainer struct {
	t       testing.TB
	queue   string
	insp    *asynq.Inspector
	handler asynq.Handler
	rdb     redis.UniversalClient

	// pendingKey is asynq's list of the queue's pending tasks. Its length
	// tells diff that nothing appeared (only the drainer removes tasks), so
	// a step that enqueued nothing costs one LLEN instead of a listing of
	// the whole queue. It is trusted only once a listing of a non-empty
	// queue agreed with it (pendingKeyOK): were asynq's key layout to
	// change, the drainer would just list every time.
	pendingKey   string
	pendingKeyOK bool

	// known is the queue's content at the last listing, by task id.
	known map[string]*asynq.TaskInfo
	// order is when a task id (last) appeared, for FIFO picking.
	order map[string]int
	seq   int
	held  map[string]bool

	// Log is every action in order: observations and deliveries.
	Log []drainRecord
	// appeared counts the tasks that ever appeared in the queue, by type.
	appeared map[string]int
}

// drainRecord is one action of the drainer.
type drainRecord struct {
	// Task is the id of the task delivered; "" for an observation (an
	// in-process action such as engine.Run).
	Task string
	// Info is the delivered task (nil for an observation).
	Info *asynq.TaskInfo
	// Type is the delivered task's type ("" for an observation).
	Type string
	// MapID and Index name the element of an element task, or the map and
	// rollback position of a rollback task (Index -1 otherwise); RunID the
	// run of a run task.
	MapID string
	Index int
	RunID string
	// Again is set for a delivery of a payload that was delivered before
	// (a duplicate).
	Again bool
	// Err is what the handler returned.
	Err error
	// New are the tasks that appeared in the queue during the action, in
	// FIFO order.
	New []*asynq.TaskInfo
}

// IDs are the ids of the tasks the action enqueued.
func (r drainRecord) IDs() []string {
	out := make([]string, len(r.New))
	for i, ti := range r.New {
		out[i] = ti.ID
	}
	return out
}

// Burst is the number of element tasks the action enqueued.
func (r drainRecord) Burst() int { return r.count(worker.TypeElement) }

// Resumes is the number of run (owner resume) tasks the action enqueued.
func (r drainRecord) Resumes() int { return r.count(worker.TypeRun) }

// Rollbacks is the number of map rollback jobs the action enqueued.
func (r drainRecord) Rollbacks() int { return r.count(worker.TypeRollback) }

func (r drainRecord) count(typ string) int {
	n := 0
	for _, ti := range r.New {
		if ti.Type == typ {
			n++
		}
	}
	return n
}

func (r drainRecord) String() string {
	what := "observe"
	if r.Task != "" {
		what = r.Task
		if r.Again {
			what += " (again)"
		}
	}
	return fmt.Sprintf("%s: +%d elements +%d rollbacks +%d resumes err=%v", what, r.Burst(), r.Rollbacks(), r.Resumes(), r.Err)
}

// newDrainer returns a drainer of queue whose tasks are executed by a worker
// of engine (created, never started: only its handler is used).
func newDrainer(t testing.TB, eng *engine.Engine, rdb redis.UniversalClient, queue string) *drainer {
	t.Helper()
	w := worker.New(eng, rdb, worker.Config{
		Queues: map[string]int{queue: 1},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	return &drainer{
		t:       t,
		queue:   queue,
		insp:    asynq.NewInspectorFromRedisClient(rdb), // shares rdb: nothing to close
		handler: w.Handler(),
		rdb:     rdb,
		// asynq's base.PendingKey (internal): "asynq:{<queue>}:pending".
		pendingKey: "asynq:{" + queue + "}:pending",
		known:      map[string]*asynq.TaskInfo{},
		order:      map[string]int{},
		held:       map[string]bool{},
		appeared:   map[string]int{},
	}
}

// list returns the queue's pending tasks by id. The queue is only checked
// for being empty in every other state: without a server, nothing may be
// scheduled, retried or archived.
func (d *drainer) list() map[string]*asynq.TaskInfo {
	d.t.Helper()
	out := map[string]*asynq.TaskInfo{}
	const size = 500
	for page := 1; ; page++ {
		tasks, err := d.insp.ListPendingTasks(d.queue, asynq.PageSize(size), asynq.Page(page))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return out // nothing was ever enqueued
		}
		require.NoError(d.t, err)
		for _, ti := range tasks {
			out[ti.ID] = ti
		}
		if len(tasks) < size {
			return out
		}
	}
}

// diff lists the queue and returns the tasks that were not in it at the last
// listing, in FIFO order, and records them as known.
func (d *drainer) diff() []*asynq.TaskInfo {
	d.t.Helper()
	if d.pendingKeyOK && d.pendingLen() == len(d.known) {
		return nil
	}
	now := d.list()
	if !d.pendingKeyOK && len(now) > 0 {
		d.pendingKeyOK = d.pendingLen() == len(now)
	}
	var fresh []*asynq.TaskInfo
	for id, ti := range now {
		if _, ok := d.known[id]; !ok {
			fresh = append(fresh, ti)
		}
	}
	for id := range d.known {
		_, ok := now[id]
		require.True(d.t, ok, "task %s left the queue without the drainer", id)
	}
	// Within one action: tasks grouped by type, element tasks in index
	// order and rollback jobs in position order (the order the map
	// enqueues them, so FIFO picking follows it), then by id.
	slices.SortFunc(fresh, func(a, b *asynq.TaskInfo) int {
		ka, kb := drainTaskKey(a), drainTaskKey(b)
		if ka.typ != kb.typ {
			return strings.Compare(kb.typ, ka.typ) // reverse by name: run, rollback, element
		}
		if ka.index != kb.index {
			return ka.index - kb.index
		}
		return strings.Compare(a.ID, b.ID)
	})
	for _, ti := range fresh {
		d.seq++
		d.order[ti.ID] = d.seq
		d.appeared[ti.Type]++
	}
	d.known = now
	return fresh
}

// pendingLen is the length of asynq's pending list of the queue.
func (d *drainer) pendingLen() int {
	d.t.Helper()
	n, err := d.rdb.LLen(context.Background(), d.pendingKey).Result()
	require.NoError(d.t, err)
	return int(n)
}

type drainKey struct {
	typ   string
	index int
}

func drainTaskKey(ti *asynq.TaskInfo) drainKey {
	k := drainKey{typ: ti.Type, index: -1}
	switch ti.Type {
	case worker.TypeElement:
		if p, err := payload.DecodeElement(ti.Payload); err == nil {
			k.index = p.Index
		}
	case worker.TypeRollback:
		if p, err := payload.DecodeRollback(ti.Payload); err == nil {
			k.index = p.Pos
		}
	}
	return k
}

// Observe records what appeared in the queue since the last action: call it
// after an in-process action (engine.Run, engine.Process) to see its burst.
func (d *drainer) Observe() drainRecord {
	d.t.Helper()
	r := drainRecord{Index: -1, New: d.diff()}
	d.Log = append(d.Log, r)
	return r
}

// catchUp records, as an observation, tasks that were enqueued since the
// last action by something other than a handler (an in-process Run, the
// test), so that no burst goes unrecorded.
func (d *drainer) catchUp() {
	d.t.Helper()
	if fresh := d.diff(); len(fresh) > 0 {
		d.Log = append(d.Log, drainRecord{Index: -1, New: fresh})
	}
}

// Pending returns the queued task id, or nil.
func (d *drainer) Pending(id string) *asynq.TaskInfo {
	d.t.Helper()
	return d.list()[id]
}

// Len is the number of pending tasks.
func (d *drainer) Len() int {
	d.t.Helper()
	return len(d.list())
}

// Next returns the oldest pending task that is not held, or nil.
func (d *drainer) Next() *asynq.TaskInfo {
	d.t.Helper()
	d.catchUp()
	var best *asynq.TaskInfo
	for id, ti := range d.known {
		if d.held[id] {
			continue
		}
		if best == nil || d.order[id] < d.order[best.ID] {
			best = ti
		}
	}
	return best
}

// Step delivers the next task; ok is false when nothing is left to deliver.
func (d *drainer) Step() (r drainRecord, ok bool) {
	d.t.Helper()
	ti := d.Next()
	if ti == nil {
		return r, false
	}
	d.Drop(ti)
	// Next just listed the queue: no baseline listing needed.
	return d.deliver(ti, false, true), true
}

// Run takes ti off the queue and delivers it once.
func (d *drainer) Run(ti *asynq.TaskInfo) drainRecord {
	d.t.Helper()
	d.Drop(ti)
	return d.deliver(ti, false, false)
}

// Duplicate takes ti off the queue and delivers it twice in a row, as a
// redelivery after a lost acknowledgement would.
func (d *drainer) Duplicate(ti *asynq.TaskInfo) (first, second drainRecord) {
	d.t.Helper()
	first = d.Run(ti)
	return first, d.Again(ti)
}

// Again delivers ti's payload once more (ti was delivered before; it is not
// taken off the queue, whatever is queued under its id now stays there).
func (d *drainer) Again(ti *asynq.TaskInfo) drainRecord {
	d.t.Helper()
	return d.deliver(ti, true, false)
}

// Drop deletes ti from the queue without running it.
func (d *drainer) Drop(ti *asynq.TaskInfo) {
	d.t.Helper()
	require.NoError(d.t, d.insp.DeleteTask(d.queue, ti.ID), "delete %s", ti.ID)
	delete(d.known, ti.ID)
	delete(d.held, ti.ID)
}

// Hold keeps task id in the queue: Next and Drain skip it until Release.
func (d *drainer) Hold(id string) { d.held[id] = true }

// Release lets Next pick task id again.
func (d *drainer) Release(id string) { delete(d.held, id) }

// deliver hands ti to the worker's handler. synced says the drainer listed
// the queue since the last action (known is the handler's baseline).
func (d *drainer) deliver(ti *asynq.TaskInfo, again, synced bool) drainRecord {
	d.t.Helper()
	r := drainRecord{Task: ti.ID, Info: ti, Type: ti.Type, Index: -1, Again: again}
	switch ti.Type {
	case worker.TypeElement:
		p, err := payload.DecodeElement(ti.Payload)
		require.NoError(d.t, err)
		r.MapID, r.Index = p.MapID, p.Index
	case worker.TypeRollback:
		p, err := payload.DecodeRollback(ti.Payload)
		require.NoError(d.t, err)
		r.MapID, r.Index = p.MapID, p.Pos
	case worker.TypeRun:
		p, err := payload.DecodeRun(ti.Payload)
		require.NoError(d.t, err)
		r.RunID = p.RunID
	}
	if !synced {
		d.catchUp() // the baseline: the queue as the handler finds it
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.Err = d.handler.ProcessTask(ctx, asynq.NewTask(ti.Type, ti.Payload))
	cancel()
	r.New = d.diff()
	d.Log = append(d.Log, r)
	return r
}

// Drain delivers tasks one at a time until none is left but held ones. Every
// delivery must succeed. It returns the records of this drain.
func (d *drainer) Drain() []drainRecord {
	d.t.Helper()
	from := len(d.Log)
	for n := 0; ; n++ {
		require.Less(d.t, n, 100_000, "the queue never drains")
		r, ok := d.Step()
		if !ok {
			break
		}
		require.NoError(d.t, r.Err, "%s", r)
	}
	d.requireOnlyPending()
	return d.Log[from:]
}

// DrainUntil delivers tasks one at a time until the next one to deliver
// satisfies stop (which is then returned, still queued) or nothing is left
// (nil).
func (d *drainer) DrainUntil(stop func(ti *asynq.TaskInfo) bool) *asynq.TaskInfo {
	d.t.Helper()
	for n := 0; ; n++ {
		require.Less(d.t, n, 100_000, "the queue never drains")
		ti := d.Next()
		if ti == nil || stop(ti) {
			return ti
		}
		d.Drop(ti)
		r := d.deliver(ti, false, true)
		require.NoError(d.t, r.Err, "%s", r)
	}
}

// requireOnlyPending checks that no task of the queue is anywhere but
// pending: the handlers succeeded, so nothing was scheduled or retried.
func (d *drainer) requireOnlyPending() {
	d.t.Helper()
	qi, err := d.insp.GetQueueInfo(d.queue)
	if errors.Is(err, asynq.ErrQueueNotFound) {
		return
	}
	require.NoError(d.t, err)
	require.Zero(d.t, qi.Active+qi.Scheduled+qi.Retry+qi.Archived+qi.Completed+qi.Aggregating,
		"tasks outside the pending state: %+v", qi)
}

// Appeared is how many tasks of type typ ever appeared in the queue.
func (d *drainer) Appeared(typ string) int { return d.appeared[typ] }

// Bursts returns the non-zero element bursts of the log, in order.
func (d *drainer) Bursts() []int {
	var out []int
	for _, r := range d.Log {
		if b := r.Burst(); b > 0 {
			out = append(out, b)
		}
	}
	return out
}

// MaxBurst is the largest number of element tasks one action enqueued.
func (d *drainer) MaxBurst() int {
	m := 0
	for _, r := range d.Log {
		m = max(m, r.Burst())
	}
	return m
}

// RbBursts returns the non-zero rollback-job bursts of the log, in order.
func (d *drainer) RbBursts() []int {
	var out []int
	for _, r := range d.Log {
		if b := r.Rollbacks(); b > 0 {
			out = append(out, b)
		}
	}
	return out
}

// MaxRbBurst is the largest number of rollback jobs one action enqueued.
func (d *drainer) MaxRbBurst() int {
	m := 0
	for _, r := range d.Log {
		m = max(m, r.Rollbacks())
	}
	return m
}

// ElementTask returns the queued element task of index i of mapID, or nil.
func (d *drainer) ElementTask(mapID string, i int) *asynq.TaskInfo {
	d.t.Helper()
	return d.Pending(fmt.Sprintf("el:%s:%d", mapID, i))
}

// drainIsElement matches the element task of index i.
func drainIsElement(i int) func(ti *asynq.TaskInfo) bool {
	return func(ti *asynq.TaskInfo) bool {
		k := drainTaskKey(ti)
		return k.typ == worker.TypeElement && k.index == i
	}
}
