package engine_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redistest"
)

// waitQuick bounds how long a listening Wait may take to return after the
// terminal write: well under its fallback read (4-6 s), so a Wait that only
// returns through the fallback fails the test.
const waitQuick = 3 * time.Second

var waitedDef = engine.MustDefine("waited", engine.Step("noop", engine.StepConfig[engine.Args, int]{
	Run: func(context.Context, engine.Args) (int, error) { return 1, nil },
}))

// enqueued stores n pending runs that nothing executes until the test calls
// Process.
func enqueued(t *testing.T, e *engine.Engine, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("w-%d", i)
		res, err := e.Enqueue(t.Context(), waitedDef, nil, engine.WithRunID(ids[i]))
		require.NoError(t, err)
		require.Equal(t, engine.StatusPending, res.Status)
	}
	return ids
}

// waitAll starts a Wait per id (twice for the first one: waiters share a
// channel) and returns a function that checks every Wait returned the
// completed run within waitQuick of being called.
func waitAll(t *testing.T, e *engine.Engine, ids []string) func() {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(ids)+1)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	for _, id := range append([]string{ids[0]}, ids...) {
		wg.Go(func() {
			res, err := e.Wait(ctx, id)
			if err == nil && (res.Status != engine.StatusCompleted || res.RunID != id) {
				err = fmt.Errorf("wait %s: got %s of %s", id, res.Status, res.RunID)
			}
			errs <- err
		})
	}
	return func() {
		t.Helper()
		defer cancel()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(waitQuick):
			t.Fatalf("the Waits did not return within %s of the runs finishing: they did not hear the terminal writes", waitQuick)
		}
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
}

func process(t *testing.T, e *engine.Engine, ids []string) {
	t.Helper()
	for _, id := range ids {
		res, err := engine.Process(e, t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Status)
	}
}

func TestWaitHearsTheTerminalWrite(t *testing.T) {
	t.Parallel()
	env := newEnv(t, func(c *engine.Config) { c.Enqueuer = nopEnqueuer{} })
	ids := enqueued(t, env.engine, 30)
	check := waitAll(t, env.engine, ids)
	process(t, env.engine, ids)
	check()
	require.Zero(t, engine.WaitConnections(env.engine), "the shared subscriber closes when nobody waits")

	// A finished run returns at once, listening or not.
	res, err := env.engine.Wait(t.Context(), ids[0])
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)
}

// A subscriber connection that the server drops is replaced; a run that
// finished while nobody listened is found by the read that follows the new
// subscription's confirmation.
func TestWaitSurvivesALostSubscriber(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	e, err := engine.NewEngine(t.Context(), engine.Config{Client: rdb, Enqueuer: nopEnqueuer{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ids := enqueued(t, e, 5)
	check := waitAll(t, e, ids)
	require.Eventually(t, func() bool { // every waiter is subscribed
		n, err := rdb.Do(t.Context(), "PUBSUB", "SHARDCHANNELS").Slice()
		return err == nil && len(n) == len(ids)
	}, 5*time.Second, 5*time.Millisecond)
	// Drop the subscriber and finish the runs at once: their announcements
	// land before, during or after the replacement subscribes again; in
	// every case a Wait hears one or reads after the confirmation.
	require.NoError(t, rdb.Do(t.Context(), "CLIENT", "KILL", "TYPE", "pubsub").Err())
	process(t, e, ids)
	check()
}

// Wait on a three-node Redis Cluster: runs in slots of every node, one
// subscriber connection per master.
func TestClusterWait(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.StartCluster(t)})
	t.Cleanup(func() { _ = cc.Close() })
	e, err := engine.NewEngine(t.Context(), engine.Config{Client: cc, Enqueuer: nopEnqueuer{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ids := enqueued(t, e, 24)
	check := waitAll(t, e, ids)
	require.Eventually(t, func() bool { return engine.WaitConnections(e) == 3 }, 5*time.Second, 5*time.Millisecond,
		"24 runs spread over 3 masters: one subscriber each")
	process(t, e, ids)
	check()
	require.Zero(t, engine.WaitConnections(e))
}
