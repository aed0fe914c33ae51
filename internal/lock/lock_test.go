package lock_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/redistest"
)

// fixture is a Locker on the shared Redis and a lock key of the test's own.
type fixture struct {
	ctx    context.Context
	rdb    redis.UniversalClient
	locker *lock.Locker
	key    string
}

func newFixture(t *testing.T, expiry time.Duration) fixture {
	t.Helper()
	rdb := redistest.Client(t)
	return fixture{
		ctx:    t.Context(),
		rdb:    rdb,
		locker: lock.New(rdb, expiry),
		key:    keys.New(redistest.Prefix(t)).RunLock("r1"),
	}
}

// acquire takes f.key and releases it at the end of the test.
func (f fixture) acquire(t *testing.T) *lock.Lease {
	t.Helper()
	lease, err := f.locker.TryAcquire(f.ctx, f.key)
	require.NoError(t, err)
	require.NotEmpty(t, lease.Token())
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	return lease
}

// value returns the lock key's value, "" when it does not exist.
func (f fixture) value(t *testing.T) string {
	t.Helper()
	v, err := f.rdb.Get(context.Background(), f.key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	require.NoError(t, err)
	return v
}

func (f fixture) pttl(t *testing.T) time.Duration {
	t.Helper()
	d, err := f.rdb.PTTL(context.Background(), f.key).Result()
	require.NoError(t, err)
	return d
}

// waitDone waits up to limit for ctx to end.
func waitDone(t *testing.T, ctx context.Context, limit time.Duration) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(limit):
		t.Fatalf("lease context not cancelled within %v", limit)
	}
}

func TestTryAcquireHeldFailsFast(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second)
	first := f.acquire(t)
	require.Equal(t, first.Token(), f.value(t))
	ttl := f.pttl(t)
	require.Greater(t, ttl, time.Duration(0))
	require.LessOrEqual(t, ttl, 10*time.Second)
	require.Equal(t, 10*time.Second, f.locker.Expiry())

	for range 3 {
		start := time.Now()
		lease, err := f.locker.TryAcquire(f.ctx, f.key)
		elapsed := time.Since(start)
		require.ErrorIs(t, err, lock.ErrHeld)
		require.Nil(t, lease)
		require.Less(t, elapsed, 500*time.Millisecond, "TryAcquire must try once, not retry")
	}
	require.Equal(t, first.Token(), f.value(t), "a failed attempt must not disturb the holder")

	// Another key is independent.
	other, err := f.locker.TryAcquire(f.ctx, f.key+":other")
	require.NoError(t, err)
	require.NotEqual(t, first.Token(), other.Token())
	require.NoError(t, other.Release(f.ctx))

	// Once released, the key can be taken again, with a new token.
	require.NoError(t, first.Release(f.ctx))
	require.Empty(t, f.value(t))
	again := f.acquire(t)
	require.NotEqual(t, first.Token(), again.Token())
}

func TestTryAcquireTransportErrorIsNotHeld(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })

	lease, err := lock.New(rdb, time.Second).TryAcquire(t.Context(), "k")
	require.Error(t, err)
	require.NotErrorIs(t, err, lock.ErrHeld, "an unreachable Redis is not a held lock")
	require.Nil(t, lease)
}

func TestAcquireWaitsForRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second)
	holder := f.acquire(t)

	released := make(chan error, 1)
	timer := time.AfterFunc(100*time.Millisecond, func() { released <- holder.Release(context.Background()) })
	t.Cleanup(func() { timer.Stop() })

	start := time.Now()
	lease, err := f.locker.Acquire(f.ctx, f.key, 2*time.Second)
	elapsed := time.Since(start)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Release(context.Background()) })
	require.NoError(t, <-released)
	require.GreaterOrEqual(t, elapsed, 100*time.Millisecond, "acquired before the holder released")
	require.Less(t, elapsed, 2*time.Second)
	require.NotEqual(t, holder.Token(), lease.Token())
	require.Equal(t, lease.Token(), f.value(t))
}

func TestAcquireGivesUpWhileHeld(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second)
	holder := f.acquire(t)

	start := time.Now()
	lease, err := f.locker.Acquire(f.ctx, f.key, 200*time.Millisecond)
	elapsed := time.Since(start)
	require.ErrorIs(t, err, lock.ErrHeld)
	require.Nil(t, lease)
	require.GreaterOrEqual(t, elapsed, 200*time.Millisecond, "Acquire must poll for the whole wait, not give up early")
	require.Less(t, elapsed, time.Second)
	require.Equal(t, holder.Token(), f.value(t))
}

func TestAcquireStopsOnContextCancel(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10*time.Second)
	f.acquire(t)

	ctx, cancel := context.WithCancel(f.ctx)
	timer := time.AfterFunc(50*time.Millisecond, cancel)
	t.Cleanup(func() { timer.Stop(); cancel() })

	start := time.Now()
	lease, err := f.locker.Acquire(ctx, f.key, 10*time.Second)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, lock.ErrHeld)
	require.Nil(t, lease)
	require.Less(t, time.Since(start), 2*time.Second)
}

func TestKeepExtendsLease(t *testing.T) {
	t.Parallel()
	// A heartbeat every 333ms: an extension may come up to 667ms late (a
	// test process starved by a parallel run) before the key lapses.
	const expiry = time.Second
	f := newFixture(t, expiry)
	lease := f.acquire(t)
	ctx := lease.Keep(f.ctx)

	// Control: a lease nobody keeps does expire after 1s, so what follows
	// is the heartbeat's doing.
	unkept, err := f.locker.TryAcquire(f.ctx, f.key+":unkept")
	require.NoError(t, err)
	t.Cleanup(func() { _ = unkept.Release(context.Background()) })

	// The behaviour under test is time itself: watch the key for three
	// expiries.
	deadline := time.Now().Add(3 * expiry)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		<-tick.C
		require.Equal(t, lease.Token(), f.value(t), "lock lost while kept")
		ttl := f.pttl(t)
		require.Greater(t, ttl, time.Duration(0))
		require.LessOrEqual(t, ttl, expiry)
		require.NoError(t, ctx.Err())
	}
	n, err := f.rdb.Exists(f.ctx, f.key+":unkept").Result()
	require.NoError(t, err)
	require.Zero(t, n, "the unkept lease should have expired")
	require.False(t, lock.Lost(ctx))

	require.NoError(t, lease.Release(f.ctx))
	require.Empty(t, f.value(t))
	require.ErrorIs(t, ctx.Err(), context.Canceled)
	require.False(t, lock.Lost(ctx), "a release is not a loss")
}

func TestLostLock(t *testing.T) {
	t.Parallel()
	const expiry = 300 * time.Millisecond

	t.Run("taken over", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, expiry)
		lease := f.acquire(t)
		ctx := lease.Keep(f.ctx)

		require.NoError(t, f.rdb.Set(f.ctx, f.key, "other-holder", time.Minute).Err())
		waitDone(t, ctx, time.Second)
		require.ErrorIs(t, context.Cause(ctx), lock.ErrLost)
		require.True(t, lock.Lost(ctx))

		require.NoError(t, lease.Release(f.ctx))
		require.Equal(t, "other-holder", f.value(t), "Release must not delete another holder's lock")
	})

	t.Run("taken over, detected by the refused extension", func(t *testing.T) {
		t.Parallel()
		// With a 1.5s expiry the heartbeat runs every 500ms: the refusal at
		// the first one must end the lease, not the lease's validity running
		// out about 1.5s after the acquisition.
		f := newFixture(t, 1500*time.Millisecond)
		lease := f.acquire(t)
		ctx := lease.Keep(f.ctx)
		require.NoError(t, f.rdb.Set(f.ctx, f.key, "other-holder", time.Minute).Err())
		waitDone(t, ctx, time.Second)
		require.True(t, lock.Lost(ctx))
		require.NoError(t, lease.Release(f.ctx))
		require.Equal(t, "other-holder", f.value(t))
	})

	t.Run("deleted", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, expiry)
		lease := f.acquire(t)
		ctx := lease.Keep(f.ctx)

		require.NoError(t, f.rdb.Del(f.ctx, f.key).Err())
		waitDone(t, ctx, time.Second)
		require.True(t, lock.Lost(ctx))
		require.Empty(t, f.value(t), "the heartbeat must not recreate a lost lock")

		require.NoError(t, lease.Release(f.ctx))
		require.Empty(t, f.value(t))
	})
}

func TestParentCancelIsNotLost(t *testing.T) {
	t.Parallel()
	// A long expiry (and so grace): the lease is not lost because nothing
	// lapses, whatever the test's pace.
	f := newFixture(t, 10*time.Second)
	lease := f.acquire(t)
	parent, cancel := context.WithCancel(f.ctx)
	ctx := lease.Keep(parent)
	cancel()
	waitDone(t, ctx, time.Second)
	require.False(t, lock.Lost(ctx))
	require.ErrorIs(t, context.Cause(ctx), context.Canceled)
	require.Equal(t, lease.Token(), f.value(t), "cancelling the work does not release the lock")
	lease.Stop()
	require.NoError(t, lease.Release(f.ctx))
	require.Empty(t, f.value(t))
}

func TestStopIsIdempotent(t *testing.T) {
	t.Parallel()
	// The subtests that read the key after Stop give it a long expiry: the
	// key is still there because Stop did not release it, not because the
	// test was fast enough.
	const expiry, long = 300 * time.Millisecond, 10 * time.Second

	t.Run("kept", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, long)
		lease := f.acquire(t)
		ctx := lease.Keep(f.ctx)

		lease.Stop()
		require.Error(t, ctx.Err())
		require.False(t, lock.Lost(ctx), "a stop is not a loss")
		lease.Stop()
		require.Equal(t, lease.Token(), f.value(t), "Stop must not release the lock")

		require.NoError(t, lease.Release(f.ctx))
		require.Empty(t, f.value(t))
		require.NoError(t, lease.Release(f.ctx), "releasing twice is not an error")
		lease.Stop()
	})

	t.Run("stopped heartbeat no longer extends", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, expiry)
		lease := f.acquire(t)
		lease.Keep(f.ctx)
		lease.Stop()
		require.Eventually(t, func() bool { return f.value(t) == "" }, 2*time.Second, 10*time.Millisecond)
		require.NoError(t, lease.Release(f.ctx), "releasing an expired lock is not an error")
	})

	t.Run("concurrent", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, long)
		lease := f.acquire(t)
		ctx := lease.Keep(f.ctx)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(lease.Stop)
		}
		wg.Wait()
		require.Error(t, ctx.Err())
		require.NoError(t, lease.Release(f.ctx))
		require.Empty(t, f.value(t))
	})

	t.Run("never kept", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, long)
		lease := f.acquire(t)
		lease.Stop()
		lease.Stop()
		require.Equal(t, lease.Token(), f.value(t))
		require.NoError(t, lease.Release(f.ctx))
		require.Empty(t, f.value(t))
	})
}

// newDedicated starts a Redis of the test's own (args as for StartServer)
// and a client that fails fast instead of retrying while it is down.
func newDedicated(t *testing.T, args ...string) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.StartServer(t, args...)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	return srv, rdb
}

// A transport error within the expiry does not end the lease: the next
// extension that gets through keeps the lock. The errors come from a proxy
// that resets every connection while broken, so Redis and the key stay up
// (killing a Redis with an AOF to restart it could block for seconds in an
// fsync under load, eating the lock's expiry before the test began).
func TestTransportErrorShorterThanExpiryIsNotLost(t *testing.T) {
	t.Parallel()
	proxy := startStallingProxy(t, redistest.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	key := keys.New(redistest.Prefix(t)).RunLock("r1")
	const expiry = 3 * time.Second // heartbeat every 1s
	lease, err := lock.New(rdb, expiry).TryAcquire(t.Context(), key)
	require.NoError(t, err)
	acquired := time.Now()
	t.Cleanup(lease.Stop)
	ctx := lease.Keep(t.Context())

	// Broken across the first heartbeat (at 1s): mended as soon as its
	// extension has failed, well before the lock's 3s expiry.
	proxy.Break()
	select {
	case <-proxy.Refused():
	case <-time.After(expiry):
		t.Fatal("no extension attempted within the expiry")
	}
	direct := redistest.Client(t)
	left, err := direct.PTTL(context.Background(), key).Result()
	require.NoError(t, err)
	proxy.Mend()
	require.NoError(t, ctx.Err(), "a failed extension within the expiry must not end the lease (cause: %v)", context.Cause(ctx))
	require.Positive(t, left, "the lock expired %v after its acquisition", time.Since(acquired))

	// Without a successful extension after the failed one, the key's TTL
	// only falls; the heartbeat alone can raise it.
	require.Eventually(t, func() bool {
		d, err := direct.PTTL(context.Background(), key).Result()
		return err == nil && d > left
	}, expiry, 20*time.Millisecond, "the lock was not extended once the proxy was mended")
	v, err := direct.Get(context.Background(), key).Result()
	require.NoError(t, err)
	require.Equal(t, lease.Token(), v)
	require.NoError(t, ctx.Err())
	require.False(t, lock.Lost(ctx))

	require.NoError(t, lease.Release(context.Background()))
	n, err := direct.Exists(context.Background(), key).Result()
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestTransportErrorPastExpiryIsLost(t *testing.T) {
	t.Parallel()
	srv, rdb := newDedicated(t)
	const expiry = 600 * time.Millisecond
	lease, err := lock.New(rdb, expiry).TryAcquire(t.Context(), "lock")
	require.NoError(t, err)
	t.Cleanup(lease.Stop)
	ctx := lease.Keep(t.Context())

	start := time.Now()
	srv.Stop()
	// Redis is unreachable: nobody can say the lock was taken, but once its
	// expiry has passed without an extension another process may hold it.
	waitDone(t, ctx, 3*time.Second)
	require.True(t, lock.Lost(ctx))
	require.GreaterOrEqual(t, time.Since(start), expiry/2, "lost on the first transport error, before the lock could expire")
	require.Error(t, lease.Release(context.Background()), "Release cannot reach Redis")
}

// stallingProxy forwards TCP connections to a Redis until Stall or Break is
// called. From Stall on it reads and drops the traffic both ways, like a
// network partition that leaves connections open: calls hang instead of
// failing. While broken (Break until Mend) it closes every connection, and
// each one it accepts at once, signalling Refused: calls fail fast with a
// transport error.
type stallingProxy struct {
	l       net.Listener
	target  string
	stalled atomic.Bool
	wg      sync.WaitGroup
	refused chan struct{}

	mu     sync.Mutex
	closed bool
	broken bool
	conns  []net.Conn
}

func startStallingProxy(t *testing.T, target string) *stallingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallingProxy{l: l, target: target, refused: make(chan struct{}, 1)}
	p.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.serve(c)
		}
	})
	t.Cleanup(p.Close)
	return p
}

func (p *stallingProxy) serve(c net.Conn) {
	p.mu.Lock()
	broken := p.broken
	p.mu.Unlock()
	if broken {
		_ = c.Close()
		select {
		case p.refused <- struct{}{}:
		default:
		}
		return
	}
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	if !p.track(c, u) {
		return
	}
	p.wg.Go(func() { p.pipe(u, c) })
	p.wg.Go(func() { p.pipe(c, u) })
}

func (p *stallingProxy) Addr() string { return p.l.Addr().String() }

func (p *stallingProxy) Stall() { p.stalled.Store(true) }

// Break closes every connection and refuses new ones until Mend.
func (p *stallingProxy) Break() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.broken = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Mend ends Break: connections are forwarded again.
func (p *stallingProxy) Mend() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.broken = false
}

// Refused receives when a connection was refused while broken.
func (p *stallingProxy) Refused() <-chan struct{} { return p.refused }

func (p *stallingProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.broken {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	p.conns = append(p.conns, conns...)
	return true
}

func (p *stallingProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			_ = dst.Close()
			return
		}
		if p.stalled.Load() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// Close closes the listener and every connection, ending hung calls with an
// error, and waits for the proxy's goroutines. It is idempotent.
func (p *stallingProxy) Close() {
	_ = p.l.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

func TestStalledExtensionIsLostWhenTheLockExpires(t *testing.T) {
	t.Parallel()
	const expiry = 600 * time.Millisecond
	proxy := startStallingProxy(t, redistest.Addr())
	// Default client options: a call is bounded by ReadTimeout (3s) and
	// retries, not by the heartbeat's context deadline.
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	key := keys.New(redistest.Prefix(t)).RunLock("r1")

	lease, err := lock.New(rdb, expiry).TryAcquire(t.Context(), key)
	require.NoError(t, err)
	ctx := lease.Keep(t.Context())
	t.Cleanup(func() {
		proxy.Close() // ends a hung extension, so Stop returns
		lease.Stop()
	})
	start := time.Now()
	proxy.Stall()

	// The key expires on the server about 600ms after the acquisition, and
	// then another process may take the run: the holder must know by then.
	waitDone(t, ctx, expiry+300*time.Millisecond)
	elapsed := time.Since(start)
	require.True(t, lock.Lost(ctx))
	require.GreaterOrEqual(t, elapsed, expiry/2, "a stalled extension is not a refused one")
}

// TestHardeningHeartbeatOutlivesTheCallersContext: when the caller's context
// ends (a worker shutting down, a task whose queue lease lapsed) while the
// holder's code still runs, the lock stays extended until Stop, for up to the
// grace; past it the lease counts as lost, although the context's cause is
// the caller's cancellation.
func TestHardeningHeartbeatOutlivesTheCallersContext(t *testing.T) {
	t.Parallel()
	const expiry = 300 * time.Millisecond

	t.Run("extended until Stop", func(t *testing.T) {
		t.Parallel()
		// As in TestKeepExtendsLease: 667ms of slack for a late heartbeat.
		const expiry = time.Second
		f := newFixture(t, expiry)
		f.locker = f.locker.WithGrace(10 * expiry)
		lease := f.acquire(t)
		parent, cancel := context.WithCancel(f.ctx)
		ctx := lease.Keep(parent)
		cancel()
		waitDone(t, ctx, time.Second)
		// The code ignoring its context runs on for three expiries: the lock
		// must still be this lease's all along.
		deadline := time.Now().Add(3 * expiry)
		for time.Now().Before(deadline) {
			require.Equal(t, lease.Token(), f.value(t), "the lock lapsed while the holder's code still ran")
			time.Sleep(20 * time.Millisecond)
		}
		require.False(t, lock.Lost(ctx))
		lease.Stop()
		require.NoError(t, lease.Release(f.ctx))
		require.Empty(t, f.value(t))
	})

	t.Run("lost past the grace", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, expiry)
		f.locker = f.locker.WithGrace(2 * expiry)
		lease := f.acquire(t)
		parent, cancel := context.WithCancel(f.ctx)
		ctx := lease.Keep(parent)
		inner, innerCancel := context.WithTimeout(ctx, time.Hour) // a step's own context
		defer innerCancel()
		cancel()
		require.Eventually(t, func() bool { return lock.Lost(inner) }, 5*time.Second, 10*time.Millisecond,
			"past the grace the lease must count as lost")
		require.ErrorIs(t, context.Cause(ctx), context.Canceled, "the cause stays the caller's")
		// No extension after the loss: the key lapses on its own.
		require.Eventually(t, func() bool { return f.value(t) == "" }, 5*time.Second, 10*time.Millisecond)
		lease.Stop()
	})
}

// TestShortLeaseStartsNoGoroutine: a holder that finishes within a third of
// the expiry (most runs) costs no goroutine; the heartbeat is a timer that has
// not fired yet. Not parallel: no other test's lease may be beating.
func TestShortLeaseStartsNoGoroutine(t *testing.T) {
	f := newFixture(t, 3*time.Second)
	lease := f.acquire(t)
	parent, cancel := context.WithCancel(f.ctx)
	defer cancel()
	ctx := lease.Keep(parent)
	time.Sleep(50 * time.Millisecond)
	var buf bytes.Buffer
	require.NoError(t, pprof.Lookup("goroutine").WriteTo(&buf, 1))
	require.NotContains(t, buf.String(), "internal/lock.(*Lease)", "a kept lease waits on a timer, not a goroutine")
	lease.Stop()
	require.ErrorIs(t, context.Cause(ctx), context.Canceled)
	require.False(t, lock.Lost(ctx))
	require.Equal(t, lease.Token(), f.value(t))
}

// A lease kept after its lock's validity ended (its holder stalled between
// the acquisition and Keep) is lost at once: another process may hold it.
func TestKeptAfterItsValidityIsLost(t *testing.T) {
	t.Parallel()
	const expiry = 300 * time.Millisecond
	f := newFixture(t, expiry)
	lease := f.acquire(t)
	time.Sleep(expiry + 50*time.Millisecond)
	ctx := lease.Keep(f.ctx)
	waitDone(t, ctx, expiry/3)
	require.True(t, lock.Lost(ctx))
	lease.Stop()
}

// A lock its caller took with a token of its own is kept and released like
// an acquired one, and a queued release deletes only its own token.
func TestAdoptedLeaseIsKeptAndReleased(t *testing.T) {
	f := newFixture(t, 300*time.Millisecond)
	token := lock.NewToken()
	require.NotEqual(t, token, lock.NewToken())
	sent := time.Now()
	require.NoError(t, f.rdb.SetNX(f.ctx, f.key, token, 300*time.Millisecond).Err())
	lease := f.locker.Adopt(f.key, token, sent)
	require.Equal(t, token, lease.Token())
	ctx := lease.Keep(f.ctx)
	// Past two expiries the heartbeat has extended it: still ours.
	select {
	case <-ctx.Done():
		t.Fatalf("adopted lease lost: %v", context.Cause(ctx))
	case <-time.After(700 * time.Millisecond):
	}
	require.Equal(t, token, f.rdb.Get(f.ctx, f.key).Val())
	require.NoError(t, lock.LoadScripts(f.ctx, f.rdb))
	var rel *redis.Cmd
	_, err := f.rdb.Pipelined(f.ctx, func(p redis.Pipeliner) error {
		rel = lease.QueueRelease(f.ctx, p)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(1), rel.Val())
	require.Equal(t, int64(0), f.rdb.Exists(f.ctx, f.key).Val())

	// Someone else's lock stays.
	require.NoError(t, f.rdb.Set(f.ctx, f.key, "other", time.Minute).Err())
	t.Cleanup(func() { f.rdb.Del(context.Background(), f.key) })
	other := f.locker.Adopt(f.key, token, time.Now())
	_, err = f.rdb.Pipelined(f.ctx, func(p redis.Pipeliner) error {
		rel = other.QueueRelease(f.ctx, p)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(0), rel.Val())
	require.Equal(t, "other", f.rdb.Get(f.ctx, f.key).Val())
}

// A lock taken by its caller's script whose reply came back late (go-redis
// retried the script through a cluster slot migration: the validity counts
// from the first send, which is already past) is extended by Keep before
// the caller's code runs, when the key still holds its token; when it does
// not, the returned context is already cancelled as lost. Either way the
// caller never runs code on a lease about to be declared lost.
func TestAdoptedLateReplyIsExtendedBeforeKeepReturns(t *testing.T) {
	t.Parallel()
	const expiry = 300 * time.Millisecond
	f := newFixture(t, expiry)
	token := lock.NewToken()
	sent := time.Now().Add(-2 * expiry) // the first send, long before the reply
	require.NoError(t, f.rdb.SetNX(f.ctx, f.key, token, expiry).Err())
	t.Cleanup(func() { f.rdb.Del(context.Background(), f.key) })
	lease := f.locker.Adopt(f.key, token, sent)
	ctx := lease.Keep(f.ctx)
	require.NoError(t, ctx.Err(), "the lease was extended, not lost")
	pttl := f.rdb.PTTL(f.ctx, f.key).Val()
	require.Greater(t, pttl, expiry/2, "extended by Keep itself")
	// And it stays kept: past two expiries, the heartbeat extended it.
	select {
	case <-ctx.Done():
		t.Fatalf("adopted lease lost: %v", context.Cause(ctx))
	case <-time.After(2 * expiry):
	}
	require.Equal(t, token, f.rdb.Get(f.ctx, f.key).Val())
	lease.Stop()

	// Taken over meanwhile: lost before Keep returns.
	require.NoError(t, f.rdb.Set(f.ctx, f.key, "other", time.Minute).Err())
	late := f.locker.Adopt(f.key, token, sent)
	lctx := late.Keep(f.ctx)
	require.ErrorIs(t, context.Cause(lctx), lock.ErrLost)
	require.True(t, lock.Lost(lctx))
	late.Stop()
	require.Equal(t, "other", f.rdb.Get(f.ctx, f.key).Val())
}
