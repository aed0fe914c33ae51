package store_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/store"
)

// A fenced write that Redis refuses because the node cannot take writes
// right now (here READONLY: a replica, as a demoted master answers during
// a failover) is sent again until the node can, and lands once: the write
// returns only then. A write whose context ends first returns the refusal
// and the context's error.
func TestWriteRidesOutARefusal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two redis-servers")
	}
	t.Parallel()
	ctx := t.Context()
	master := redistest.StartServer(t, "--repl-diskless-sync-delay", "0")
	replica := redistest.StartServer(t, "--replicaof", strings.Replace(master.Addr, ":", " ", 1))
	mc := redis.NewClient(&redis.Options{Addr: master.Addr})
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
	t.Cleanup(func() { _ = mc.Close(); _ = rc.Close() })
	k := keys.New("ride")
	ms, err := store.New(ctx, mc, k)
	require.NoError(t, err)
	// The write that gives up goes to a run of its own: a caller that stops
	// waiting does not take back a write already queued, which may still
	// land once the node takes writes again.
	target, gaveUp := ms.RunTarget("r1"), ms.RunTarget("r0")
	for _, tg := range []store.Target{target, gaveUp} {
		require.NoError(t, mc.Set(ctx, tg.Lock, "tok", time.Hour).Err())
		_, created, err := ms.Create(ctx, tg, "tok", []byte("one"))
		require.NoError(t, err)
		require.True(t, created)
		require.Eventually(t, func() bool {
			return rc.Exists(ctx, tg.State, tg.Lock).Val() == 2
		}, 10*time.Second, 5*time.Millisecond, "the replica has the run")
	}

	rs, err := store.New(ctx, rc, k)
	require.NoError(t, err)
	// A write whose caller gives up returns its context's error.
	refusedBefore := readOnlyRefusals(t, rc)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = rs.Write(short, gaveUp, "tok", 1, []byte("two"), store.WriteOptions{})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Greater(t, readOnlyRefusals(t, rc), refusedBefore+1, "refused, sent again, refused")

	type outcome struct {
		res store.WriteResult
		err error
	}
	done := make(chan outcome, 1)
	refusedBefore = readOnlyRefusals(t, rc)
	go func() {
		res, err := rs.Write(ctx, target, "tok", 1, []byte("two"), store.WriteOptions{})
		done <- outcome{res, err}
	}()
	// Refused at least twice (sent again), and still waiting.
	require.Eventually(t, func() bool { return readOnlyRefusals(t, rc) >= refusedBefore+2 }, 10*time.Second, 5*time.Millisecond)
	select {
	case o := <-done:
		t.Fatalf("the write returned while the node refused it: %+v, %v", o.res, o.err)
	default:
	}
	require.NoError(t, rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(), "the replica is promoted")
	o := <-done
	require.NoError(t, o.err)
	require.Equal(t, int64(2), o.res.Version, "the write landed once")
	snap, err := rs.Load(ctx, target)
	require.NoError(t, err)
	require.Equal(t, store.Snapshot{Data: []byte("two"), Version: 2}, snap)
	require.False(t, store.ClusterTransient(errors.New("READONLYISH")), "only Redis's own replies count")
}

// readOnlyRefusals is how many READONLY errors the server at c returned.
func readOnlyRefusals(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(t.Context(), "errorstats").Result()
	require.NoError(t, err)
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "errorstat_READONLY:count="); ok {
			n, err := strconv.Atoi(v)
			require.NoError(t, err)
			return n
		}
	}
	return 0
}
