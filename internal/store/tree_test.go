package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The retention walk expires a map's element states with its other keys,
// and takes the expiry off them again when an undo makes the run live.
func TestRetainTreeExpiresTheMapsElementStates(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const run, mapID = "tree-run", "tree-run~each"
	require.NoError(t, f.rdb.SAdd(f.ctx, f.k.RunTree(run), mapID).Err())
	require.NoError(t, f.rdb.HSet(f.ctx, f.k.MapMeta(mapID), "total", 3, "layout", 2).Err())
	require.NoError(t, f.rdb.HSet(f.ctx, f.k.MapResults(mapID), "0", "x").Err())
	require.NoError(t, f.rdb.BitField(f.ctx, f.k.MapStates(mapID), "SET", "u4", "#0", 1).Err())

	require.NoError(t, f.st.RetainTree(f.ctx, run, time.Minute))
	for _, key := range []string{f.k.MapMeta(mapID), f.k.MapResults(mapID), f.k.MapStates(mapID)} {
		ttl := f.pttl(t, key)
		require.Greater(t, ttl, time.Duration(0), key)
		require.LessOrEqual(t, ttl, time.Minute, key)
	}

	require.NoError(t, f.st.RetainTree(f.ctx, run, 0))
	require.Equal(t, noTTL, f.pttl(t, f.k.MapStates(mapID)), "a live run's map keeps its states")
	// Two slots: the run's tree and the map's keys.
	require.NoError(t, f.rdb.Del(f.ctx, f.k.RunTree(run)).Err())
	require.NoError(t, f.rdb.Del(f.ctx, f.k.MapMeta(mapID), f.k.MapResults(mapID), f.k.MapStates(mapID)).Err())
}
