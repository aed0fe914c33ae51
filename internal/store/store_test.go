package store_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/store"
)

// fixture is a Store on the shared Redis under a prefix of the test's own.
type fixture struct {
	ctx context.Context
	rdb redis.UniversalClient
	st  *store.Store
	k   keys.Keys
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	ctx := t.Context()
	rdb := redistest.Client(t)
	k := keys.New(redistest.Prefix(t))
	st, err := store.New(ctx, rdb, k)
	require.NoError(t, err)
	return fixture{ctx: ctx, rdb: rdb, st: st, k: k}
}

// hold makes token the value of target's lock, as an acquisition or a
// takeover by another process would.
func (f fixture) hold(t *testing.T, target store.Target, token string) {
	t.Helper()
	require.NoError(t, f.rdb.Set(f.ctx, target.Lock, token, time.Minute).Err())
}

// create holds the lock with token and creates the run with data (version 1).
func (f fixture) create(t *testing.T, target store.Target, token string, data []byte) {
	t.Helper()
	f.hold(t, target, token)
	snap, created, err := f.st.Create(f.ctx, target, token, data)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, store.Snapshot{Data: data, Version: 1}, snap)
}

// requireStored checks the raw state hash: exactly data at version, nothing else.
func (f fixture) requireStored(t *testing.T, target store.Target, data []byte, version int64) {
	t.Helper()
	got, err := f.rdb.HGetAll(f.ctx, target.State).Result()
	require.NoError(t, err)
	delete(got, "n") // the nonce of the last fenced write, if any
	at, err := strconv.ParseInt(got["at"], 10, 64)
	require.NoError(t, err, "every write stamps the server time (field at)")
	srv, err := f.rdb.Time(f.ctx).Result()
	require.NoError(t, err)
	require.InDelta(t, srv.UnixMilli(), at, float64(time.Minute.Milliseconds()), "field at is the server's clock in ms")
	delete(got, "at")
	if fin, ok := got["fin"]; ok {
		require.Contains(t, []string{"0", "1"}, fin, "fin says whether the last write was terminal")
		delete(got, "fin")
	}
	cancel := false
	if cx, ok := got["cx"]; ok {
		require.Equal(t, "1", cx, "cx is a cancel request")
		cancel = true
		delete(got, "cx")
	}
	require.Equal(t, map[string]string{"d": string(data), "v": strconv.FormatInt(version, 10)}, got,
		"raw state hash %s", target.State)
	snap, err := f.st.Load(f.ctx, target)
	require.NoError(t, err)
	require.Equal(t, store.Snapshot{Data: data, Version: version, Cancel: cancel}, snap, "Load reports the request")
}

func (f fixture) pttl(t *testing.T, key string) time.Duration {
	t.Helper()
	d, err := f.rdb.PTTL(f.ctx, key).Result()
	require.NoError(t, err)
	return d
}

// cancelStored reports whether a cancel request is stored for target: the
// field cx of its state.
func (f fixture) cancelStored(t *testing.T, target store.Target) bool {
	t.Helper()
	ok, err := f.rdb.HExists(f.ctx, target.State, "cx").Result()
	require.NoError(t, err)
	return ok
}

func (f fixture) exists(t *testing.T, key string) bool {
	t.Helper()
	n, err := f.rdb.Exists(f.ctx, key).Result()
	require.NoError(t, err)
	return n == 1
}

// noTTL is what go-redis reports as the PTTL of a key without an expiry.
const noTTL = time.Duration(-1)

// Binary payloads: a codec's output is not text.
var (
	data1 = []byte("\x00state-one\xff\x80")
	data2 = []byte("state-two\x00")
	data3 = []byte("state-three")
)

func TestCreateStoresVersionOneOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := f.st.RunTarget("r1")
	require.Equal(t, store.Target{State: f.k.RunState("r1"), Lock: f.k.RunLock("r1"), Cancel: f.k.RunCancel("r1"), Audit: f.k.RunAudit("r1"), Done: f.k.RunDone("r1")}, target)

	f.create(t, target, "tok-a", data1)
	f.requireStored(t, target, data1, 1)
	require.Equal(t, noTTL, f.pttl(t, target.State), "a created run must not expire")

	// A second Create (a duplicate start) returns what is stored and leaves it.
	snap, created, err := f.st.Create(f.ctx, target, "tok-a", data2)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, store.Snapshot{Data: data1, Version: 1}, snap)
	f.requireStored(t, target, data1, 1)

	// After a write, Create reports the current state, not the created one.
	res, err := f.st.Write(f.ctx, target, "tok-a", 1, data3, store.WriteOptions{})
	require.NoError(t, err)
	require.Equal(t, store.WriteResult{Version: 2}, noAt(res))
	require.InDelta(t, time.Now().UnixMilli(), res.At, float64(time.Minute.Milliseconds()), "the server time of the write")
	snap, created, err = f.st.Create(f.ctx, target, "tok-a", data2)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, store.Snapshot{Data: data3, Version: 2}, snap)
	f.requireStored(t, target, data3, 2)
}

func TestCreateWithoutLockIsRejected(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	t.Run("fresh run, no lock", func(t *testing.T) {
		target := f.st.RunTarget("nolock")
		_, _, err := f.st.Create(f.ctx, target, "tok-a", data1)
		require.ErrorIs(t, err, store.ErrLockNotHeld)
		require.False(t, f.exists(t, target.State))
		require.False(t, f.exists(t, target.Lock))
	})
	t.Run("fresh run, lock held by another", func(t *testing.T) {
		target := f.st.RunTarget("other")
		f.hold(t, target, "tok-b")
		_, _, err := f.st.Create(f.ctx, target, "tok-a", data1)
		require.ErrorIs(t, err, store.ErrLockNotHeld)
		require.False(t, f.exists(t, target.State))
		lockVal, err := f.rdb.Get(f.ctx, target.Lock).Result()
		require.NoError(t, err)
		require.Equal(t, "tok-b", lockVal)
	})
	t.Run("existing run, lock held by another", func(t *testing.T) {
		target := f.st.RunTarget("existing")
		f.create(t, target, "tok-a", data1)
		f.hold(t, target, "tok-b")
		snap, created, err := f.st.Create(f.ctx, target, "tok-a", data2)
		require.ErrorIs(t, err, store.ErrLockNotHeld, "a non-holder must not even read the state through Create")
		require.False(t, created)
		require.Equal(t, store.Snapshot{}, snap)
		f.requireStored(t, target, data1, 1)
	})
}

func TestWriteWithoutLockIsRejected(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	cases := []struct {
		name    string
		lock    string // "" deletes the lock key (expired)
		token   string
		version int64
	}{
		{name: "expired lock, right version", token: "tok-a", version: 1},
		{name: "other holder, right version", lock: "tok-b", token: "tok-a", version: 1},
		{name: "other holder, wrong version", lock: "tok-b", token: "tok-a", version: 7},
		{name: "empty token on expired lock", token: "", version: 1},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			target := f.st.RunTarget(fmt.Sprintf("r%d", i))
			f.create(t, target, "tok-a", data1)
			require.NoError(t, f.st.RequestCancel(f.ctx, target))
			if tc.lock == "" {
				require.NoError(t, f.rdb.Del(f.ctx, target.Lock).Err())
			} else {
				f.hold(t, target, tc.lock)
			}

			for _, o := range []store.WriteOptions{{}, {Retention: time.Hour, Release: true}} {
				res, err := f.st.Write(f.ctx, target, tc.token, tc.version, data2, o)
				require.ErrorIs(t, err, store.ErrLockNotHeld, "options %+v", o)
				var conflict *store.VersionConflictError
				require.False(t, errors.As(err, &conflict), "the lock is checked before the version")
				require.Equal(t, store.WriteResult{}, res)
			}

			f.requireStored(t, target, data1, 1)
			require.Equal(t, noTTL, f.pttl(t, target.State), "a rejected terminal write must not set a TTL")
			require.True(t, f.cancelStored(t, target), "a rejected terminal write must not drop the cancel request")
			if tc.lock == "" {
				require.False(t, f.exists(t, target.Lock))
			} else {
				v, err := f.rdb.Get(f.ctx, target.Lock).Result()
				require.NoError(t, err)
				require.Equal(t, tc.lock, v, "a rejected release must not delete the holder's lock")
			}
		})
	}
}

func TestStaleWriterGetsVersionConflict(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := f.st.RunTarget("r1")
	f.create(t, target, "tok-a", data1)

	// Two writers read version 1; the first one wins.
	res, err := f.st.Write(f.ctx, target, "tok-a", 1, data2, store.WriteOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Version)

	res, err = f.st.Write(f.ctx, target, "tok-a", 1, data3, store.WriteOptions{})
	var conflict *store.VersionConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, &store.VersionConflictError{Expected: 1, Stored: 2}, conflict)
	require.NotErrorIs(t, err, store.ErrLockNotHeld)
	require.Equal(t, store.WriteResult{}, res)
	f.requireStored(t, target, data2, 2)

	// A version from the future is as wrong as a stale one, terminal or not.
	_, err = f.st.Write(f.ctx, target, "tok-a", 3, data3, store.WriteOptions{Retention: time.Hour, Release: true})
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, &store.VersionConflictError{Expected: 3, Stored: 2}, conflict)
	f.requireStored(t, target, data2, 2)
	require.Equal(t, noTTL, f.pttl(t, target.State))
	require.True(t, f.exists(t, target.Lock), "a rejected terminal write must not release the lock")

	// A run that does not exist has version 0: a write that read version 1
	// cannot resurrect it.
	gone := f.st.RunTarget("gone")
	f.hold(t, gone, "tok-a")
	_, err = f.st.Write(f.ctx, gone, "tok-a", 1, data3, store.WriteOptions{})
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, &store.VersionConflictError{Expected: 1, Stored: 0}, conflict)
	require.False(t, f.exists(t, gone.State))
}

func TestConcurrentWritersOfOneVersionExactlyOneWins(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := f.st.RunTarget("r1")
	f.create(t, target, "tok-a", data1)

	const writers = 16
	var (
		wg        sync.WaitGroup
		start     = make(chan struct{})
		errs      = make([]error, writers)
		results   = make([]store.WriteResult, writers)
		payloadOf = func(i int) []byte { return fmt.Appendf(nil, "writer-%d", i) }
	)
	for i := range writers {
		wg.Go(func() {
			<-start
			results[i], errs[i] = f.st.Write(f.ctx, target, "tok-a", 1, payloadOf(i), store.WriteOptions{})
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, err := range errs {
		if err == nil {
			require.Equal(t, -1, winner, "writers %d and %d both wrote version 1", winner, i)
			winner = i
			require.Equal(t, int64(2), results[i].Version)
			continue
		}
		var conflict *store.VersionConflictError
		require.ErrorAs(t, err, &conflict)
		require.Equal(t, int64(2), conflict.Stored)
	}
	require.NotEqual(t, -1, winner, "no writer won")
	f.requireStored(t, target, payloadOf(winner), 2)
}

func TestOldTokenCannotWriteAfterTakeover(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	t.Run("lock key overwritten", func(t *testing.T) {
		target := f.st.RunTarget("set")
		f.create(t, target, "tok-a", data1)
		res, err := f.st.Write(f.ctx, target, "tok-a", 1, data2, store.WriteOptions{})
		require.NoError(t, err)
		require.Equal(t, int64(2), res.Version)

		f.hold(t, target, "tok-b") // takeover after tok-a's lease expired

		_, err = f.st.Write(f.ctx, target, "tok-a", 2, data3, store.WriteOptions{})
		require.ErrorIs(t, err, store.ErrLockNotHeld)
		_, err = f.st.Write(f.ctx, target, "tok-a", 2, data3, store.WriteOptions{Retention: time.Hour, Release: true})
		require.ErrorIs(t, err, store.ErrLockNotHeld)
		_, _, err = f.st.Create(f.ctx, target, "tok-a", data3)
		require.ErrorIs(t, err, store.ErrLockNotHeld)
		f.requireStored(t, target, data2, 2)

		// The new holder, having read version 2, writes normally.
		res, err = f.st.Write(f.ctx, target, "tok-b", 2, data3, store.WriteOptions{})
		require.NoError(t, err)
		require.Equal(t, int64(3), res.Version)
		f.requireStored(t, target, data3, 3)
	})

	t.Run("real leases", func(t *testing.T) {
		locker := lock.New(f.rdb, time.Minute)
		target := f.st.RunTarget("lease")
		a, err := locker.TryAcquire(f.ctx, target.Lock)
		require.NoError(t, err)
		t.Cleanup(func() { _ = a.Release(context.Background()) })
		_, created, err := f.st.Create(f.ctx, target, a.Token(), data1)
		require.NoError(t, err)
		require.True(t, created)

		// a's lock expires and b takes the run over.
		require.NoError(t, f.rdb.Del(f.ctx, target.Lock).Err())
		b, err := locker.TryAcquire(f.ctx, target.Lock)
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Release(context.Background()) })
		require.NotEqual(t, a.Token(), b.Token())

		_, err = f.st.Write(f.ctx, target, a.Token(), 1, data2, store.WriteOptions{})
		require.ErrorIs(t, err, store.ErrLockNotHeld)
		f.requireStored(t, target, data1, 1)

		res, err := f.st.Write(f.ctx, target, b.Token(), 1, data3, store.WriteOptions{Retention: time.Hour, Release: true})
		require.NoError(t, err)
		require.Equal(t, int64(2), res.Version)
		f.requireStored(t, target, data3, 2)
		require.False(t, f.exists(t, target.Lock))
	})
}

func TestTerminalWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const retention = 10 * time.Second

	cases := []struct {
		name string
		o    store.WriteOptions
	}{
		{name: "retention and release", o: store.WriteOptions{Retention: retention, Release: true}},
		{name: "retention only", o: store.WriteOptions{Retention: retention}},
		{name: "release only", o: store.WriteOptions{Release: true}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			target := f.st.RunTarget(fmt.Sprintf("r%d", i))
			f.create(t, target, "tok-a", data1)
			require.NoError(t, f.st.RequestCancel(f.ctx, target))

			// An ordinary write first: it must not set a TTL or touch the lock.
			res, err := f.st.Write(f.ctx, target, "tok-a", 1, data2, store.WriteOptions{})
			require.NoError(t, err)
			require.Equal(t, store.WriteResult{Version: 2, CancelRequested: true}, noAt(res))
			require.Equal(t, noTTL, f.pttl(t, target.State))
			require.True(t, f.exists(t, target.Lock))

			res, err = f.st.Write(f.ctx, target, "tok-a", 2, data3, tc.o)
			require.NoError(t, err)
			terminal := tc.o.Retention > 0
			// A terminal write drops the cancel request, so it cannot report one.
			require.Equal(t, store.WriteResult{Version: 3, CancelRequested: !terminal}, noAt(res))
			f.requireStored(t, target, data3, 3)

			ttl := f.pttl(t, target.State)
			if terminal {
				require.Greater(t, ttl, time.Duration(0))
				require.LessOrEqual(t, ttl, retention)
			} else {
				require.Equal(t, noTTL, ttl)
			}
			require.Equal(t, !terminal, f.cancelStored(t, target), "cancel request")
			require.Equal(t, !tc.o.Release, f.exists(t, target.Lock), "lock key")

			if terminal && !tc.o.Release {
				// A later ordinary write (an undo of the finished run) makes
				// the state persistent again: a live run never expires.
				_, err = f.st.Write(f.ctx, target, "tok-a", 3, data1, store.WriteOptions{})
				require.NoError(t, err)
				require.Equal(t, noTTL, f.pttl(t, target.State))
			}
			if tc.o.Release {
				// The released token is no longer a holder.
				_, err = f.st.Write(f.ctx, target, "tok-a", 3, data1, store.WriteOptions{})
				require.ErrorIs(t, err, store.ErrLockNotHeld)
				f.requireStored(t, target, data3, 3)
			}
		})
	}
}

func TestRetentionExpiresState(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := f.st.RunTarget("r1")
	f.create(t, target, "tok-a", data1)
	_, err := f.st.Write(f.ctx, target, "tok-a", 1, data2, store.WriteOptions{Retention: 100 * time.Millisecond, Release: true})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := f.st.Load(f.ctx, target)
		return errors.Is(err, store.ErrNotFound)
	}, 5*time.Second, 10*time.Millisecond)
}

func TestRequestCancel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := f.st.RunTarget("r1")
	other := f.st.RunTarget("r2")
	f.create(t, target, "tok-a", data1)
	f.create(t, other, "tok-b", data1)

	res, err := f.st.Write(f.ctx, target, "tok-a", 1, data2, store.WriteOptions{})
	require.NoError(t, err)
	require.Equal(t, store.WriteResult{Version: 2, CancelRequested: false}, noAt(res))

	require.NoError(t, f.st.RequestCancel(f.ctx, target))
	require.True(t, f.cancelStored(t, target))
	// The key earlier versions read, for a rolling deploy: it expires on
	// its own, since only those versions delete it.
	ttl := f.pttl(t, target.Cancel)
	require.Greater(t, ttl, 59*time.Minute)
	require.LessOrEqual(t, ttl, time.Hour)

	res, err = f.st.Write(f.ctx, target, "tok-a", 2, data3, store.WriteOptions{})
	require.NoError(t, err)
	require.Equal(t, store.WriteResult{Version: 3, CancelRequested: true}, noAt(res))
	f.requireStored(t, target, data3, 3)

	// The request is for r1 only.
	res, err = f.st.Write(f.ctx, other, "tok-b", 1, data2, store.WriteOptions{})
	require.NoError(t, err)
	require.Equal(t, store.WriteResult{Version: 2, CancelRequested: false}, noAt(res))

	// A rejected write does not report (or consume) the request.
	_, err = f.st.Write(f.ctx, target, "tok-x", 3, data1, store.WriteOptions{})
	require.ErrorIs(t, err, store.ErrLockNotHeld)
	require.True(t, f.cancelStored(t, target))
}

func TestLoadMissingRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	snap, err := f.st.Load(f.ctx, f.st.RunTarget("missing"))
	require.ErrorIs(t, err, store.ErrNotFound)
	require.Equal(t, store.Snapshot{}, snap)

	// A hold on the lock or a cancel request is not a run.
	target := f.st.RunTarget("locked")
	f.hold(t, target, "tok-a")
	require.NoError(t, f.rdb.Set(f.ctx, target.Cancel, "1", time.Minute).Err())
	_, err = f.st.Load(f.ctx, target)
	require.ErrorIs(t, err, store.ErrNotFound)
}

// TestHardeningCancelOfAFinishedRunStoresNothing: a cancel request can only
// be deleted by the run's terminal write, so one that arrives after it (or
// for a run that is gone) is refused instead of living for ever.
func TestHardeningCancelOfAFinishedRunStoresNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := f.st.RunTarget("done")
	f.create(t, target, "tok", []byte("one"))
	_, err := f.st.Write(f.ctx, target, "tok", 1, []byte("two"), store.WriteOptions{Retention: time.Minute, Release: true})
	require.NoError(t, err)
	require.ErrorIs(t, f.st.RequestCancel(f.ctx, target), store.ErrAlreadyDone)
	require.ErrorIs(t, f.st.RequestCancel(f.ctx, f.st.RunTarget("gone")), store.ErrAlreadyDone)
	for _, key := range []string{target.Cancel, f.st.RunTarget("gone").Cancel} { // two slots: one EXISTS each
		n, err := f.rdb.Exists(f.ctx, key).Result()
		require.NoError(t, err)
		require.Zero(t, n, "no cancel key for a finished or missing run: %s", key)
	}
	require.False(t, f.cancelStored(t, target), "no request on a finished run")
	require.False(t, f.exists(t, f.st.RunTarget("gone").State), "nor a state for a missing one")
}

// A finished run kept for a person (KeepForever: terminal, no expiry) takes
// no cancel request either; made live again by a later write, it does.
func TestCancelOfAKeptForeverRunStoresNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := f.st.RunTarget("kept")
	f.create(t, target, "tok", []byte("one"))
	require.NoError(t, f.st.RequestCancel(f.ctx, target))
	res, err := f.st.Write(f.ctx, target, "tok", 1, []byte("two"), store.WriteOptions{KeepForever: true})
	require.NoError(t, err)
	require.False(t, res.CancelRequested, "a terminal write drops the request")
	require.Equal(t, noTTL, f.pttl(t, target.State), "kept forever")
	require.False(t, f.cancelStored(t, target))
	require.ErrorIs(t, f.st.RequestCancel(f.ctx, target), store.ErrAlreadyDone)
	require.False(t, f.cancelStored(t, target))

	_, err = f.st.Write(f.ctx, target, "tok", 2, []byte("three"), store.WriteOptions{})
	require.NoError(t, err)
	require.NoError(t, f.st.RequestCancel(f.ctx, target), "live again")
}

// zscore returns id's score in the sorted set at key and whether it is there.
func (f fixture) zscore(t *testing.T, key, id string) (float64, bool) {
	t.Helper()
	s, err := f.rdb.ZScore(f.ctx, key, id).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false
	}
	require.NoError(t, err)
	return s, true
}

func (f fixture) requireScore(t *testing.T, key, id string, at time.Time) {
	t.Helper()
	s, ok := f.zscore(t, key, id)
	require.True(t, ok, "%s missing from %s", id, key)
	require.Equal(t, float64(at.UnixMilli()), s, "score of %s in %s", id, key)
}

func (f fixture) requireAbsent(t *testing.T, key, id string) {
	t.Helper()
	_, ok := f.zscore(t, key, id)
	require.False(t, ok, "%s still in %s", id, key)
}

func TestIndexLifecycle(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := f.k
	t0 := time.UnixMilli(1_700_000_000_000)
	t1, t2, t3 := t0.Add(time.Second), t0.Add(2*time.Second), t0.Add(3*time.Second)

	require.NoError(t, f.st.MarkStarted(f.ctx, "r1", "", "running", t0))
	require.NoError(t, f.st.MarkStarted(f.ctx, "bystander", "", "running", t0))
	f.requireScore(t, k.Active(), "r1", t0)
	f.requireScore(t, k.Runs(), "r1", t0)
	f.requireScore(t, k.Status("running"), "r1", t0)

	// Indexing again (a retried start) touches active but keeps the creation time.
	require.NoError(t, f.st.MarkStarted(f.ctx, "r1", "", "running", t1))
	f.requireScore(t, k.Active(), "r1", t1)
	f.requireScore(t, k.Runs(), "r1", t0)
	f.requireScore(t, k.Status("running"), "r1", t1)

	// A non-terminal move: out of the old status, into the new one, still active.
	require.NoError(t, f.st.MarkStatus(f.ctx, "r1", "", "running", "compensating", false, t2))
	f.requireAbsent(t, k.Status("running"), "r1")
	f.requireScore(t, k.Status("compensating"), "r1", t2)
	f.requireScore(t, k.Active(), "r1", t2)
	f.requireScore(t, k.Runs(), "r1", t0)

	// A terminal move leaves the active index.
	require.NoError(t, f.st.MarkStatus(f.ctx, "r1", "", "compensating", "failed", true, t3))
	f.requireAbsent(t, k.Status("compensating"), "r1")
	f.requireAbsent(t, k.Active(), "r1")
	f.requireScore(t, k.Status("failed"), "r1", t3)
	f.requireScore(t, k.Runs(), "r1", t0)

	// The other run was never touched.
	f.requireScore(t, k.Active(), "bystander", t0)
	f.requireScore(t, k.Runs(), "bystander", t0)
	f.requireScore(t, k.Status("running"), "bystander", t0)
	n, err := f.rdb.ZCard(f.ctx, k.Status("failed")).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
}

func TestMarkStatusSameOrNoPreviousStatus(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := f.k
	t0 := time.UnixMilli(1_700_000_000_000)
	t1 := t0.Add(time.Second)

	// from == to refreshes the score and keeps the entry.
	require.NoError(t, f.st.MarkStarted(f.ctx, "r1", "", "running", t0))
	require.NoError(t, f.st.MarkStatus(f.ctx, "r1", "", "running", "running", false, t1))
	f.requireScore(t, k.Status("running"), "r1", t1)
	f.requireScore(t, k.Active(), "r1", t1)

	// from == "" only adds.
	require.NoError(t, f.st.MarkStatus(f.ctx, "r2", "", "", "completed", true, t1))
	f.requireScore(t, k.Status("completed"), "r2", t1)
	f.requireAbsent(t, k.Active(), "r2")
	f.requireAbsent(t, k.Runs(), "r2")
}

func TestUnindex(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := f.k
	t0 := time.UnixMilli(1_700_000_000_000)

	require.NoError(t, f.st.MarkStarted(f.ctx, "r1", "", "running", t0))
	require.NoError(t, f.st.MarkStarted(f.ctx, "r2", "", "running", t0))

	// The speculative status entry goes; the active entry stays for the
	// sweeper, which completes a finished run's retention before dropping it.
	require.NoError(t, f.st.Unindex(f.ctx, "r1", "", "running"))
	f.requireScore(t, k.Active(), "r1", t0)
	f.requireAbsent(t, k.Status("running"), "r1")
	f.requireScore(t, k.Runs(), "r1", t0)

	require.NoError(t, f.st.Unindex(f.ctx, "r2", "", ""))
	f.requireScore(t, k.Active(), "r2", t0)
	f.requireScore(t, k.Status("running"), "r2", t0)
	f.requireScore(t, k.Runs(), "r2", t0)
}

// scriptSHA returns the SHA1 Redis files the script at path under.
func scriptSHA(t *testing.T, path string) string {
	t.Helper()
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	sum := sha1.Sum(src)
	return hex.EncodeToString(sum[:])
}

func TestScriptsWorkAfterScriptFlush(t *testing.T) {
	t.Parallel()
	// SCRIPT FLUSH is server-wide: a dedicated server keeps it from touching
	// other packages' tests.
	srv := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	st, err := store.New(ctx, rdb, keys.New("grt"))
	require.NoError(t, err)

	shas := []string{scriptSHA(t, "lua/create.lua"), scriptSHA(t, "lua/write.lua")}
	exist, err := rdb.ScriptExists(ctx, shas...).Result()
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, exist, "New must load both scripts")

	flush := func() {
		t.Helper()
		require.NoError(t, rdb.ScriptFlush(ctx).Err())
		exist, err := rdb.ScriptExists(ctx, shas...).Result()
		require.NoError(t, err)
		require.Equal(t, []bool{false, false}, exist)
	}

	target := st.RunTarget("r1")
	require.NoError(t, rdb.Set(ctx, target.Lock, "tok-a", time.Minute).Err())
	flush()
	snap, created, err := st.Create(ctx, target, "tok-a", data1)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, int64(1), snap.Version)

	flush()
	res, err := st.Write(ctx, target, "tok-a", 1, data2, store.WriteOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Version)

	flush()
	_, err = st.Write(ctx, target, "tok-a", 1, data3, store.WriteOptions{})
	var conflict *store.VersionConflictError
	require.ErrorAs(t, err, &conflict, "the fallback must run the same script")

	snap, err = st.Load(ctx, target)
	require.NoError(t, err)
	require.Equal(t, store.Snapshot{Data: data2, Version: 2}, snap)
}

func TestNewFailsOnUnreachableRedis(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	st, err := store.New(t.Context(), rdb, keys.New("grt"))
	require.Error(t, err)
	require.Nil(t, st)
}

// crc16 is the CRC-16/XMODEM Redis Cluster hashes keys with.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// hashSlot is Redis Cluster's key slot: the CRC16 of the key's hash tag (the
// part between the first '{' and the next '}', if not empty) or of the key.
func hashSlot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return int(crc16([]byte(key)) % 16384)
}

func TestRunKeysShareOneSlot(t *testing.T) {
	t.Parallel()
	// The reference values from the Redis Cluster specification.
	require.Equal(t, uint16(0x31C3), crc16([]byte("123456789")))
	require.Equal(t, 12182, hashSlot("foo"))
	require.Equal(t, hashSlot("{user1000}.following"), hashSlot("{user1000}.followers"))
	require.Equal(t, int(crc16([]byte("foo{}{bar}"))%16384), hashSlot("foo{}{bar}"), "an empty tag hashes the whole key")

	k := keys.New("grt:prefix:with:colons")
	slots := map[int]bool{}
	for _, id := range []string{"r1", "order-42", "a:b:c", "ünïcode", "01J9Z3K6W2", "x y"} {
		want := hashSlot("run:" + id)
		for _, key := range []string{k.RunState(id), k.RunLock(id), k.RunCancel(id), k.RunAudit(id)} {
			require.Equal(t, want, hashSlot(key), "slot of %s", key)
		}
		slots[want] = true
	}
	require.Greater(t, len(slots), 1, "different runs should spread over slots")
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	addrs := redistest.StartCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = cc.Close() })
	ctx := t.Context()
	k := keys.New(redistest.Prefix(t))
	st, err := store.New(ctx, cc, k)
	require.NoError(t, err)
	locker := lock.New(cc, time.Minute)
	now := time.UnixMilli(1_700_000_000_000)

	nodes := map[string]bool{}
	for i := range 12 {
		id := fmt.Sprintf("run-%d", i)
		target := st.RunTarget(id)

		slot, err := cc.ClusterKeySlot(ctx, target.State).Result()
		require.NoError(t, err)
		require.Equal(t, int64(hashSlot(target.State)), slot, "local CRC16 agrees with CLUSTER KEYSLOT")
		for _, key := range []string{target.Lock, target.Cancel, k.RunAudit(id)} {
			s, err := cc.ClusterKeySlot(ctx, key).Result()
			require.NoError(t, err)
			require.Equal(t, slot, s, "CLUSTER KEYSLOT %s", key)
		}
		master, err := cc.MasterForKey(ctx, target.State)
		require.NoError(t, err)
		nodes[master.Options().Addr] = true

		lease, err := locker.TryAcquire(ctx, target.Lock)
		require.NoError(t, err)
		require.NoError(t, st.MarkStarted(ctx, id, "", "running", now))
		snap, created, err := st.Create(ctx, target, lease.Token(), data1)
		require.NoError(t, err)
		require.True(t, created)
		require.Equal(t, int64(1), snap.Version)

		require.NoError(t, st.RequestCancel(ctx, target))
		res, err := st.Write(ctx, target, lease.Token(), 1, data2, store.WriteOptions{})
		require.NoError(t, err)
		require.Equal(t, store.WriteResult{Version: 2, CancelRequested: true}, noAt(res))

		_, err = st.Write(ctx, target, "not-the-holder", 2, data3, store.WriteOptions{})
		require.ErrorIs(t, err, store.ErrLockNotHeld)

		res, err = st.Write(ctx, target, lease.Token(), 2, data3, store.WriteOptions{Retention: time.Hour, Release: true,
			Audit: [][]string{{"k", "rollback_completed"}}})
		require.NoError(t, err)
		require.Equal(t, store.WriteResult{Version: 3}, noAt(res))
		require.Equal(t, int64(1), cc.XLen(ctx, target.Audit).Val(), "the audit entry landed in the run's slot")
		clock, err := st.ServerTime(ctx, target)
		require.NoError(t, err, "the clock is read on the run's node")
		require.GreaterOrEqual(t, clock, res.At-1000)
		require.NoError(t, st.MarkStatus(ctx, id, "", "running", "completed", true, now))
		lease.Stop()

		snap, err = st.Load(ctx, target)
		require.NoError(t, err)
		require.Equal(t, store.Snapshot{Data: data3, Version: 3}, snap)
		n, err := cc.Exists(ctx, target.Lock).Result()
		require.NoError(t, err)
		require.Zero(t, n)
		require.False(t, cc.HExists(ctx, target.State, "cx").Val(), "the terminal write dropped the request")
		ttl, err := cc.PTTL(ctx, target.State).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, time.Duration(0))

		_, err = cc.ZScore(ctx, k.Status("completed"), id).Result()
		require.NoError(t, err)
		_, err = cc.ZScore(ctx, k.Active(), id).Result()
		require.ErrorIs(t, err, redis.Nil)
	}
	require.Len(t, nodes, 3, "the runs should exercise the scripts on every node")

	// Control: keys of two runs in different slots are refused by the cluster,
	// so the successes above do depend on the shared hash tag.
	a, b := "run-0", "run-1"
	require.NotEqual(t, hashSlot(k.RunState(a)), hashSlot(k.RunState(b)))
	mixed := store.Target{State: k.RunState(a), Lock: k.RunLock(b), Cancel: k.RunCancel(a)}
	_, err = st.Write(ctx, mixed, "tok", 3, data1, store.WriteOptions{})
	require.ErrorContains(t, err, "CROSSSLOT")

	clusterWatch(t, ctx, cc, st, k)
}

// A fenced write whose reply is lost is sent again by the client with the
// same arguments; the resend must report the write as done, not as a lost
// lock (terminal writes delete the lock) or a stale version.
func TestResentWriteIsIdempotent(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := f.st.RunTarget("resend")
	f.create(t, target, "tok-a", data1)
	var sent []any
	f.rdb.AddHook(resendHook{args: &sent})
	res, err := f.st.Write(f.ctx, target, "tok-a", 1, data2, store.WriteOptions{Retention: time.Minute, Release: true})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Version)
	require.False(t, f.exists(t, target.Lock), "the first send released the lock")
	f.requireStored(t, target, data2, 2)
}

// resendHook sends every EVALSHA twice, as go-redis does after a read
// timeout, and returns the second reply.
type resendHook struct{ args *[]any }

func (h resendHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h resendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "evalsha" {
			return next(ctx, cmd)
		}
		first := redis.NewCmd(ctx, cmd.Args()...)
		if err := next(ctx, first); err != nil {
			return err
		}
		return next(ctx, cmd)
	}
}
func (h resendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// An index entry is removed only if nobody re-indexed it since it was read:
// the window between a terminal write and its index removal, where an undo
// makes the run live again, must not lose the new entry.
func TestRemoveIfScoreKeepsAReindexedEntry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	t0 := time.UnixMilli(1_700_000_000_123)
	require.NoError(t, f.st.MarkStarted(f.ctx, "r1", "", "running", t0))
	score, err := f.rdb.ZScore(f.ctx, f.k.Active(), "r1").Result()
	require.NoError(t, err)

	// A writer re-indexes the run after the read.
	require.NoError(t, f.st.MarkStatus(f.ctx, "r1", "", "running", "rolling_back", false, t0.Add(time.Millisecond)))
	removed, err := f.st.RemoveIfScore(f.ctx, f.k.Active(), "r1", score)
	require.NoError(t, err)
	require.False(t, removed, "a re-indexed entry must stay")
	n, err := f.rdb.ZScore(f.ctx, f.k.Active(), "r1").Result()
	require.NoError(t, err)
	require.Equal(t, float64(t0.Add(time.Millisecond).UnixMilli()), n)

	removed, err = f.st.RemoveIfScore(f.ctx, f.k.Active(), "r1", n)
	require.NoError(t, err)
	require.True(t, removed, "an unchanged entry goes")
	removed, err = f.st.RemoveIfScore(f.ctx, f.k.Active(), "r1", n)
	require.NoError(t, err)
	require.False(t, removed, "a missing entry is not an error")
}

func TestReactorAndIDIndexes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	k := f.k
	t0 := time.UnixMilli(1_700_000_000_000)
	t1, t2 := t0.Add(time.Second), t0.Add(2*time.Second)

	require.NoError(t, f.st.MarkStarted(f.ctx, "order-1", "checkout", "running", t0))
	f.requireScore(t, k.Reactor("checkout"), "order-1", t0)
	f.requireScore(t, k.ReactorStatus("checkout", "running"), "order-1", t0)
	f.requireScore(t, k.IDs(), "order-1", time.UnixMilli(0))
	names, err := f.rdb.SMembers(f.ctx, k.Reactors()).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"checkout"}, names)

	// A retried start keeps the creation time in the reactor index.
	require.NoError(t, f.st.MarkStarted(f.ctx, "order-1", "checkout", "running", t1))
	f.requireScore(t, k.Reactor("checkout"), "order-1", t0)

	require.NoError(t, f.st.MarkStatus(f.ctx, "order-1", "checkout", "running", "failed", true, t2))
	f.requireAbsent(t, k.ReactorStatus("checkout", "running"), "order-1")
	f.requireScore(t, k.ReactorStatus("checkout", "failed"), "order-1", t2)
	f.requireScore(t, k.Reactor("checkout"), "order-1", t0)

	// A taken-back start removes its speculative reactor x status entry.
	require.NoError(t, f.st.MarkStarted(f.ctx, "order-1", "checkout", "pending", t2))
	require.NoError(t, f.st.TakeBackStart(f.ctx, "order-1", "checkout", "pending", false, t2))
	f.requireAbsent(t, k.ReactorStatus("checkout", "pending"), "order-1")
	f.requireScore(t, k.ReactorStatus("checkout", "failed"), "order-1", t2)

	// Without a reactor name, no reactor index is written.
	require.NoError(t, f.st.MarkStarted(f.ctx, "anon", "", "running", t0))
	n, err := f.rdb.SCard(f.ctx, k.Reactors()).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	f.requireScore(t, k.IDs(), "anon", time.UnixMilli(0))
}

// noAt is r without its server time, which a test cannot predict.
func noAt(r store.WriteResult) store.WriteResult {
	r.At = 0
	return r
}

// A start writes its reactor's name in idx:reactors only after the
// reactor's index entries, the order the index trimmer's removal of an
// empty name relies on (sweeper/trim.go). One pipeline keeps that order on
// one Redis; on a cluster, whose client sends a pipeline's commands to
// several nodes at once, the name goes in a later round trip.
func TestReactorNameGoesAfterItsEntries(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	ctx := t.Context()
	addrs := redistest.StartCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = cc.Close() })
	one := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr})
	t.Cleanup(func() { _ = one.Close() })
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
	}{{"one Redis", one}, {"a cluster", cc}} {
		t.Run(tc.name, func(t *testing.T) {
			k := keys.New("names")
			st, err := store.New(ctx, tc.rdb, k)
			require.NoError(t, err)
			now := time.UnixMilli(1_700_000_000_000)
			cmds, err := tc.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				st.QueueIndexStart(ctx, p, "r1", "shop", "running", now)
				return nil
			})
			require.NoError(t, err)
			var names []string
			for _, c := range cmds {
				names = append(names, c.Name())
			}
			if st.Ordered() {
				require.Equal(t, "sadd", names[len(names)-1], "the name last, in the entries' pipeline: %v", names)
			} else {
				require.NotContains(t, names, "sadd", "no name in the entries' pipeline")
			}
			// IndexStart and CreateNew add it after the entries.
			_, err = st.IndexStart(ctx, "r2", "shop", "running", now)
			require.NoError(t, err)
			require.True(t, tc.rdb.SIsMember(ctx, k.Reactors(), "shop").Val())
			require.NoError(t, tc.rdb.SRem(ctx, k.Reactors(), "shop").Err())
			target := st.RunTarget("r3")
			_, created, err := st.CreateNew(ctx, target, "tok", time.Minute, data1, "shop", func(p redis.Pipeliner) {
				st.QueueIndexStart(ctx, p, "r3", "shop", "running", now)
			})
			require.NoError(t, err)
			require.True(t, created)
			require.True(t, tc.rdb.SIsMember(ctx, k.Reactors(), "shop").Val())
		})
	}
}
