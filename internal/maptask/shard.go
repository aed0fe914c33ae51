package maptask

import (
	"hash/fnv"
	"strconv"

	"github.com/goreactor/goreactor/internal/envconfig"
)

// Sharding a map's tasks. asynq keeps a whole queue under one hash tag,
// asynq:{<queue>}, so on a Redis Cluster every task of a queue, pending,
// active or retained, lives on one master. A big fan-out map would put all
// of its element and rollback traffic there. With shards N > 1 a worker
// Client puts element tasks and rollback jobs on N queues named
// <queue>.shard<i> instead (ShardQueue), whose hash tags land on different
// slots; owner tasks (runs, resumes, control) stay on the base queue.
//
// The shard of a task is a function of its map id and element index only
// (ShardOf), never of a delivery: the map's first dispatch, the claims of
// later batches, a rollback's jobs, and the sweeper's redeliveries and
// lookups all name the same queue for the same element, so the task-id
// dedup that asynq does per queue keeps working. Changing N while maps are
// in flight moves their remaining tasks: the sweeper, looking on the new
// shard, finds them missing once the map goes stale and enqueues them
// again there (a duplicate delivery, which the element lock serializes and
// first-writer-wins settles absorb), and tasks left on queues no worker
// serves any more wait there (worker.shards.unserved names them).

// MaxShards bounds the shard count (envconfig.CheckShards).
const MaxShards = envconfig.MaxShards

// ShardOf returns the shard (0..shards-1) of element index of map mapID.
// It is the FNV-1a hash of the map id, plus the index, modulo shards: the
// elements of one map go round-robin over the shards from a start that
// the map id picks, so a batch of B elements puts B/shards (rounded) on
// each shard, and many small maps still spread. shards <= 1 is shard 0.
func ShardOf(mapID string, index, shards int) int {
	if shards <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(mapID))
	i := index % shards
	if i < 0 {
		i += shards
	}
	return int((uint64(h.Sum32()) + uint64(i)) % uint64(shards))
}

// ShardQueue is the name of shard i of base: "<base>.shard<i>".
func ShardQueue(base string, i int) string { return base + ".shard" + strconv.Itoa(i) }

// ShardQueues returns the shard queues of base, in shard order; none for
// shards <= 1 (the base queue carries everything).
func ShardQueues(base string, shards int) []string {
	if shards <= 1 {
		return nil
	}
	qs := make([]string, shards)
	for i := range qs {
		qs[i] = ShardQueue(base, i)
	}
	return qs
}

// QueueOf is the queue of element index of map mapID with base queue base
// and shards shards: base itself when shards <= 1.
func QueueOf(base string, shards int, mapID string, index int) string {
	if shards <= 1 {
		return base
	}
	return ShardQueue(base, ShardOf(mapID, index, shards))
}

// TaskRef names a task to a TaskInspector: its id, and what chooses its
// queue.
type TaskRef struct {
	ID string
	// Sharded is set for an element task or a rollback job: its queue is
	// QueueOf(base, shards, MapID, Index). Unset: an owner task (a resume),
	// on the base queue.
	Sharded bool
	MapID   string
	Index   int
}

// OwnerRef names owner task id, on the base queue.
func OwnerRef(id string) TaskRef { return TaskRef{ID: id} }

// Ref names t's task.
func (t ElementTask) Ref() TaskRef {
	return TaskRef{ID: t.TaskID(), Sharded: true, MapID: t.MapID, Index: t.Index}
}

// Ref names t's task; t.Index must be set (it chooses the shard).
func (t RollbackTask) Ref() TaskRef {
	return TaskRef{ID: t.TaskID(), Sharded: true, MapID: t.MapID, Index: t.Index}
}

// Redelivered names the redelivery of r under id suffix (ElementTask's
// Redelivery): the same queue, a fresh id.
func (r TaskRef) Redelivered(suffix string) TaskRef {
	r.ID += ":" + suffix
	return r
}

// Queue is r's queue, with base queue base and shards shards.
func (r TaskRef) Queue(base string, shards int) string {
	if !r.Sharded {
		return base
	}
	return QueueOf(base, shards, r.MapID, r.Index)
}
