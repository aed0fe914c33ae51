package maptask

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The shard of an element is part of the stored state's contract: a task
// enqueued by one process is looked up by another (the sweeper), maybe of
// another build, so the function must not drift. These values pin it.
func TestShardOfIsStable(t *testing.T) {
	for _, tc := range []struct {
		mapID         string
		index, shards int
		want          int
	}{
		{"order-1~each", 0, 3, 1},
		{"order-1~each", 1, 3, 2},
		{"order-1~each", 2, 3, 0},
		{"order-1~each", 7, 3, 2},
		{"order-2~each", 0, 3, 2},
		{"order-2~each", 0, 8, 3},
		{"order-2~each", 5, 64, 8},
		{"", 0, 5, 1}, // FNV-1a's offset basis, 2166136261, mod 5
	} {
		require.Equal(t, tc.want, ShardOf(tc.mapID, tc.index, tc.shards), "%+v", tc)
		// The same answer every time, and the queue QueueOf names.
		require.Equal(t, ShardOf(tc.mapID, tc.index, tc.shards), ShardOf(tc.mapID, tc.index, tc.shards))
		require.Equal(t, fmt.Sprintf("q.shard%d", tc.want), QueueOf("q", tc.shards, tc.mapID, tc.index))
	}
}

func TestShardOfWithoutShardsIsTheBaseQueue(t *testing.T) {
	for _, shards := range []int{-1, 0, 1} {
		require.Equal(t, 0, ShardOf("m", 12, shards))
		require.Equal(t, "q", QueueOf("q", shards, "m", 12))
		require.Nil(t, ShardQueues("q", shards))
	}
	require.Equal(t, []string{"q.shard0", "q.shard1", "q.shard2"}, ShardQueues("q", 3))
}

// A map's elements go round-robin over the shards, so any batch of B
// consecutive elements puts B/shards (rounded) on each; and the start
// differs between maps, so many one-element maps spread too.
func TestShardOfSpreadsABatchEvenly(t *testing.T) {
	for _, shards := range []int{2, 3, 7, 64} {
		for _, mapID := range []string{"a~each", "b~each", "run-12345~step.sub"} {
			for _, from := range []int{0, 13, 50} {
				const batch = 50
				per := make([]int, shards)
				for i := from; i < from+batch; i++ {
					s := ShardOf(mapID, i, shards)
					require.True(t, s >= 0 && s < shards, "shard %d of %d", s, shards)
					per[s]++
				}
				for s, n := range per {
					require.InDelta(t, float64(batch)/float64(shards), n, 1, "%s shards=%d from=%d shard %d: %v", mapID, shards, from, s, per)
				}
			}
		}
	}
	firsts := make([]int, 3)
	for m := range 300 {
		firsts[ShardOf(fmt.Sprintf("run-%d~each", m), 0, 3)]++
	}
	for s, n := range firsts {
		require.Greater(t, n, 60, "element 0 of 300 maps on shard %d: %v", s, firsts)
	}
}

// Every way of naming one element's task (its first delivery, a
// redelivery, a rollback job of any generation, the sweeper's lookup)
// names the same queue.
func TestTaskRefsOfAnElementNameOneQueue(t *testing.T) {
	const mapID, shards = "run-7~each", 5
	for i := range 20 {
		want := QueueOf("q", shards, mapID, i)
		el := ElementTask{MapID: mapID, Index: i}
		require.Equal(t, want, el.Ref().Queue("q", shards))
		require.Equal(t, want, el.Ref().Redelivered("r1").Queue("q", shards))
		require.Equal(t, el.TaskID()+":r1", el.Ref().Redelivered("r1").ID)
		for gen := 1; gen <= 2; gen++ {
			rb := RollbackTask{MapID: mapID, Gen: gen, Pos: 19 - i, Index: i}
			require.Equal(t, want, rb.Ref().Queue("q", shards))
			require.Equal(t, rb.TaskID(), rb.Ref().ID)
		}
	}
	require.Equal(t, "q", OwnerRef("resume:x:fwd:y").Queue("q", shards))
}
