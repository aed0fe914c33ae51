package store_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/store"
)

// pipeCounter counts the pipelines a client sends (not a new connection's
// handshake, a pipeline of its own).
type pipeCounter struct{ n atomic.Int64 }

func (c *pipeCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *pipeCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (c *pipeCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() != "hello" && cmds[0].Name() != "client" {
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// Concurrent writers share pipelines, each reads its own results, and one
// writer's failed command fails nobody else's.
func TestConcurrentWritesSharePipelinesAndKeepTheirOwnResults(t *testing.T) {
	f := newFixture(t)
	pc := &pipeCounter{}
	f.rdb.AddHook(pc)
	const writers = 200
	var wg sync.WaitGroup
	errs := make([]error, writers)
	vals := make([]int64, writers)
	start := make(chan struct{})
	for i := range writers {
		wg.Go(func() {
			<-start
			key := f.k.RunState("b" + string(rune('a'+i%26)) + time.Now().String())
			cmds, err := f.st.Pipelined(f.ctx, func(p redis.Pipeliner) {
				p.Set(f.ctx, key, "x", time.Minute)
				if i%10 == 0 {
					p.Incr(f.ctx, key) // not an integer: this writer's error only
				} else {
					p.Incr(f.ctx, key+":n")
					p.Expire(f.ctx, key+":n", time.Minute)
				}
			})
			t.Cleanup(func() { f.rdb.Del(context.Background(), key, key+":n") })
			errs[i] = err
			if err == nil {
				require.Len(t, cmds, 3)
				vals[i] = cmds[1].(*redis.IntCmd).Val()
			}
		})
	}
	close(start)
	wg.Wait()
	for i := range writers {
		if i%10 == 0 {
			require.Error(t, errs[i], "writer %d queued a failing command", i)
			continue
		}
		require.NoError(t, errs[i], "writer %d", i)
		require.Equal(t, int64(1), vals[i], "writer %d reads its own INCR", i)
	}
	require.Less(t, pc.n.Load(), int64(writers), "%d writers in %d pipelines: none shared", writers, pc.n.Load())
}

// A lone write is sent at once, in a pipeline of its own.
func TestLoneWriteIsNotDelayed(t *testing.T) {
	f := newFixture(t)
	pc := &pipeCounter{}
	f.rdb.AddHook(pc)
	key := f.k.RunState("lone")
	t.Cleanup(func() { f.rdb.Del(context.Background(), key) })
	for i := range 3 {
		cmds, err := f.st.Pipelined(f.ctx, func(p redis.Pipeliner) { p.Incr(f.ctx, key) })
		require.NoError(t, err)
		require.Equal(t, int64(i+1), cmds[0].(*redis.IntCmd).Val())
	}
	require.Equal(t, int64(3), pc.n.Load())
}

// A caller whose context ends while its pipeline is in flight returns
// with the context's error.
func TestPipelinedReturnsWhenItsContextEnds(t *testing.T) {
	f := newFixture(t)
	blocked := make(chan struct{})
	release := make(chan struct{})
	f.rdb.AddHook(blockHook{blocked: blocked, release: release})
	go func() {
		_, _ = f.st.Pipelined(context.Background(), func(p redis.Pipeliner) { p.Ping(f.ctx) })
	}()
	<-blocked // the first flusher is held in its round trip
	ctx, cancel := context.WithCancel(f.ctx)
	// Four flushers may be in flight; hold them all so the next write
	// waits in the queue.
	for range 3 {
		go func() { _, _ = f.st.Pipelined(context.Background(), func(p redis.Pipeliner) { p.Ping(f.ctx) }) }()
		<-blocked
	}
	done := make(chan error, 1)
	go func() {
		_, err := f.st.Pipelined(ctx, func(p redis.Pipeliner) { p.Ping(f.ctx) })
		done <- err
	}()
	cancel()
	require.True(t, errors.Is(<-done, context.Canceled))
	close(release)
	// The held flushers go on and send the queued ping too.
	_, err := f.st.Pipelined(f.ctx, func(p redis.Pipeliner) { p.Ping(f.ctx) })
	require.NoError(t, err)
}

type blockHook struct{ blocked, release chan struct{} }

func (h blockHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h blockHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h blockHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() != "ping" {
			return next(ctx, cmds) // a new connection's handshake
		}
		select {
		case <-h.release:
		case h.blocked <- struct{}{}:
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// CreateNew takes the lock in the create, indexes the run in the same
// round trip, and refuses a lock someone holds.
func TestCreateNewTakesTheLock(t *testing.T) {
	f := newFixture(t)
	target := f.st.RunTarget("fresh")
	t.Cleanup(func() { f.rdb.Del(context.Background(), target.State, target.Lock, f.k.Active()) })
	indexed := false
	snap, created, err := f.st.CreateNew(f.ctx, target, "tok", 5*time.Second, []byte("d1"), "", func(p redis.Pipeliner) {
		indexed = true
		p.ZAdd(f.ctx, f.k.Active(), redis.Z{Score: 1, Member: "fresh"})
	})
	require.NoError(t, err)
	require.True(t, created)
	require.True(t, indexed)
	require.Equal(t, store.Snapshot{Data: []byte("d1"), Version: 1}, snap)
	require.Equal(t, "tok", f.rdb.Get(f.ctx, target.Lock).Val())
	ttl := f.rdb.PTTL(f.ctx, target.Lock).Val()
	require.True(t, ttl > 4*time.Second && ttl <= 5*time.Second, "lock ttl %v", ttl)
	require.Equal(t, float64(1), f.rdb.ZScore(f.ctx, f.k.Active(), "fresh").Val())

	// Someone else's lock: refused, the state untouched.
	_, _, err = f.st.CreateNew(f.ctx, target, "other", 5*time.Second, []byte("d2"), "", func(redis.Pipeliner) {})
	require.ErrorIs(t, err, store.ErrLockNotHeld)
	require.Equal(t, "tok", f.rdb.Get(f.ctx, target.Lock).Val())
	// A stored state with a free lock: the existing snapshot, not created.
	require.NoError(t, f.rdb.Del(f.ctx, target.Lock).Err())
	snap, created, err = f.st.CreateNew(f.ctx, target, "third", 5*time.Second, []byte("d3"), "", func(redis.Pipeliner) {})
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, store.Snapshot{Data: []byte("d1"), Version: 1}, snap)
}
