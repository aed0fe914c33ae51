package sweeper_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

// TestTrimReactorAndIDIndexes: the dashboard's indexes (idx:reactor:<name>,
// idx:rs:<name>:<s>, idx:ids, and the name in idx:reactors) lose the entries
// of runs whose state is gone, like idx:runs; a retained run keeps all of
// them, an entry in another reactor's index or in a status its run is not in
// goes, and a name goes once every index of it is empty.
func TestTrimReactorAndIDIndexes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	def := reactor.MustDefine("shop", reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "", reactor.Permanent(errors.New("no")) },
	}))
	res, err := e.engine.Run(ctx, def, nil, reactor.WithRunID("kept"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)

	srv, err := e.rdb.Time(ctx).Result()
	require.NoError(t, err)
	old := float64(srv.Add(-engine.Retention(e.engine) - 24*time.Hour).UnixMilli())
	p := e.prefix
	byReactor, rsFailed, rsRunning := p+":idx:reactor:shop", p+":idx:rs:shop:failed", p+":idx:rs:shop:running"
	ghost, ghostFailed := p+":idx:reactor:ghost", p+":idx:rs:ghost:failed"
	ids, names, runs := p+":idx:ids", p+":idx:reactors", p+":idx:runs"
	// Gone runs, in every index; the kept run in the ghost reactor's index
	// and in the wrong status (an id another reactor holds, a stale entry).
	require.NoError(t, e.rdb.ZAdd(ctx, runs, redis.Z{Score: old, Member: "gone"}).Err())
	require.NoError(t, e.rdb.ZAdd(ctx, byReactor, redis.Z{Score: old, Member: "gone"}, redis.Z{Score: old + 1, Member: "kept"}).Err())
	require.NoError(t, e.rdb.ZAdd(ctx, rsFailed, redis.Z{Score: old, Member: "gone"}).Err())
	require.NoError(t, e.rdb.ZAdd(ctx, rsRunning, redis.Z{Score: old, Member: "kept"}).Err())
	require.NoError(t, e.rdb.ZAdd(ctx, ghost, redis.Z{Score: old, Member: "kept"}, redis.Z{Score: old + 1, Member: "gone-2"}).Err())
	require.NoError(t, e.rdb.ZAdd(ctx, ghostFailed, redis.Z{Score: old, Member: "gone-2"}).Err())
	require.NoError(t, e.rdb.ZAdd(ctx, ids, redis.Z{Member: "gone"}).Err())
	require.NoError(t, e.rdb.SAdd(ctx, names, "ghost").Err())

	trim, err := sweeper.NewIndexTrimmer(sweeper.TrimConfig{Engine: e.engine, StaleAfter: e.stale, Logger: discard})
	require.NoError(t, err)
	rep, err := trim.Trim(ctx)
	require.NoError(t, err)
	// idx:runs gone, shop: gone, rs failed gone, rs running kept; ghost:
	// kept and gone-2, ghost failed gone-2.
	require.Equal(t, 7, rep.Trimmed)

	require.Equal(t, []string{"kept"}, e.rdb.ZRange(ctx, ids, 0, -1).Val(), "the id index loses the gone run with idx:runs")
	require.Equal(t, []string{"kept"}, e.rdb.ZRange(ctx, byReactor, 0, -1).Val())
	require.Equal(t, []string{"kept"}, e.rdb.ZRange(ctx, rsFailed, 0, -1).Val(), "the stored run's reactor x status entry stays")
	require.Empty(t, e.rdb.ZRange(ctx, rsRunning, 0, -1).Val(), "a status the run is not in goes")
	require.Empty(t, e.rdb.ZRange(ctx, ghost, 0, -1).Val(), "another reactor's run goes")
	require.Equal(t, []string{"shop"}, e.rdb.SMembers(ctx, names).Val(), "a reactor with no entries left loses its name")
}
