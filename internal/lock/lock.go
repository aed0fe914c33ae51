// Package lock is goreactor's run lock: a redsync mutex that is tried once
// (never redsync's default 32 retries, which would block a handler for
// seconds), extended by a heartbeat while its holder works, and that tells a
// lost lock apart from a transport error.
package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// ErrHeld is returned when another holder has the lock.
var ErrHeld = errors.New("lock: held by another holder")

// ErrLost is the cause of a lease's context when its lock was lost: an
// extension was refused because the key no longer holds the lease's token, or
// the lock expired before an extension could reach Redis.
var ErrLost = errors.New("lock: lost")

// Locker hands out leases on named locks.
type Locker struct {
	rs     *redsync.Redsync
	expiry time.Duration
	grace  time.Duration
}

// New returns a Locker whose leases expire after expiry unless extended.
// A kept lease outlives the end of its caller's context by up to one expiry
// (see Keep); WithGrace changes that.
func New(rdb redis.UniversalClient, expiry time.Duration) *Locker {
	return &Locker{rs: redsync.New(goredis.NewPool(rdb)), expiry: expiry, grace: expiry}
}

// WithGrace returns a copy of l whose kept leases go on extending their lock
// for up to grace after the caller's context ended, while the holder's code
// is still running.
func (l *Locker) WithGrace(grace time.Duration) *Locker {
	c := *l
	c.grace = grace
	return &c
}

// Expiry returns the lease expiry.
func (l *Locker) Expiry() time.Duration { return l.expiry }

// acquireTimeoutFactor bounds one acquisition attempt to a third of the
// expiry, the heartbeat interval: a lock that took longer to get would have
// too little of its expiry left for Keep's first extension. redsync's default
// (0.05) gives a 90ms lock a 4.5ms budget, which a connection dial or a GC
// pause exceeds, turning a free lock into a transport error.
const acquireTimeoutFactor = 1.0 / 3

// TryAcquire takes the lock at key with a single attempt. It returns ErrHeld
// when someone else holds it.
func (l *Locker) TryAcquire(ctx context.Context, key string) (*Lease, error) {
	m := l.rs.NewMutex(key, redsync.WithExpiry(l.expiry), redsync.WithTries(1),
		redsync.WithTimeoutFactor(acquireTimeoutFactor))
	if err := m.TryLockContext(ctx); err != nil {
		var taken *redsync.ErrTaken
		if errors.As(err, &taken) || errors.Is(err, redsync.ErrFailed) {
			return nil, ErrHeld
		}
		return nil, fmt.Errorf("lock: acquire %s: %w", key, err)
	}
	return &Lease{m: m, expiry: l.expiry, grace: l.grace, done: make(chan struct{})}, nil
}

// Acquire polls for the lock for up to wait. It returns ErrHeld when the
// lock is still held at the end.
func (l *Locker) Acquire(ctx context.Context, key string, wait time.Duration) (*Lease, error) {
	deadline := time.Now().Add(wait)
	delay := 10 * time.Millisecond
	for {
		lease, err := l.TryAcquire(ctx, key)
		remaining := time.Until(deadline)
		if !errors.Is(err, ErrHeld) || remaining <= 0 {
			return lease, err
		}
		t := time.NewTimer(min(delay, remaining))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		delay = min(delay*2, 200*time.Millisecond)
	}
}

// Lease is a held lock. Keep it alive with Keep; release it with Release, or
// let a terminal state write delete the key and just Stop the heartbeat.
type Lease struct {
	m      *redsync.Mutex
	expiry time.Duration
	grace  time.Duration
	// lost is set before the lease's context is cancelled for a loss: once
	// the caller's own context has ended, the cancellation cause is the
	// caller's, and the flag is what still tells a loss apart.
	lost atomic.Bool

	mu      sync.Mutex
	cancel  context.CancelCauseFunc
	done    chan struct{}
	started bool
	stopped bool
}

// Token is the lock's value: the proof of ownership fenced writes check.
func (l *Lease) Token() string { return l.m.Value() }

// Keep starts the heartbeat and returns a context derived from parent that is
// cancelled with cause ErrLost if the lock is lost. The heartbeat extends the
// lock every third of its expiry; a transport error (or an extension that
// hangs) is tolerated until the lock would have expired, and then the lease is
// treated as lost.
//
// The heartbeat lives as long as the holder's code, not as long as parent:
// when parent ends (a worker shutting down, a task whose queue lease lapsed)
// the returned context is cancelled at once, asking the code to stop, but the
// lock is extended until Stop is called, for up to the Locker's grace. Code
// that ignores its context therefore cannot run on unlocked while a
// redelivery runs the same step elsewhere; past the grace the lease counts as
// lost (Lost reports true) and its holder must record nothing.
func (l *Lease) Keep(parent context.Context) context.Context {
	ctx, cancel := context.WithCancelCause(parent)
	hb, hbCancel := context.WithCancelCause(context.WithoutCancel(parent))
	l.mu.Lock()
	l.cancel = func(cause error) { cancel(cause); hbCancel(cause) }
	l.started = true
	l.mu.Unlock()
	lose := func() {
		l.lost.Store(true)
		cancel(ErrLost)
		hbCancel(ErrLost)
	}
	go l.heartbeat(hb, lose)
	go func() {
		select {
		case <-hb.Done():
			return
		case <-parent.Done():
		}
		t := time.NewTimer(l.grace)
		defer t.Stop()
		select {
		case <-hb.Done():
		case <-t.C:
			lose()
		}
	}()
	return context.WithValue(ctx, leaseKey{}, l)
}

type leaseKey struct{}

func (l *Lease) heartbeat(ctx context.Context, lose func()) {
	defer close(l.done)
	interval := l.expiry / 3
	t := time.NewTicker(interval)
	defer t.Stop()
	// expired fires when the lock's validity (redsync's Until, a little short
	// of the key's TTL) ends without a successful extension. It runs while an
	// extension is in flight too: go-redis bounds a call by its ReadTimeout
	// and retries, not by the context's deadline, so an extension over a
	// stalled connection can outlast the lock by seconds, and the holder must
	// hear of the loss before another process can take the lock.
	expired := time.NewTimer(time.Until(l.m.Until()))
	defer expired.Stop()
	type extension struct {
		ok  bool
		err error
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-expired.C:
			lose()
			return
		case <-t.C:
		}
		// Extensions use a context detached from ctx's cancellation so that a
		// caller cancelling its work does not look like a lost lock.
		ectx, ecancel := context.WithTimeout(context.WithoutCancel(ctx), interval)
		res := make(chan extension, 1)
		go func() {
			ok, err := l.m.ExtendContext(ectx)
			res <- extension{ok: ok, err: err}
		}()
		var r extension
		select {
		case r = <-res:
		case <-expired.C:
			lose()
			<-res // the mutex is not safe for concurrent use: let the call end
			ecancel()
			return
		}
		ecancel()
		if r.ok {
			expired.Reset(time.Until(l.m.Until()))
			continue
		}
		var taken *redsync.ErrTaken
		if errors.As(r.err, &taken) || !time.Now().Before(l.m.Until()) {
			lose()
			return
		}
	}
}

// Stop ends the heartbeat (it does not release the lock) and waits for it to
// exit. It is idempotent.
func (l *Lease) Stop() {
	l.mu.Lock()
	if !l.started || l.stopped {
		l.stopped = true
		l.mu.Unlock()
		return
	}
	l.stopped = true
	cancel := l.cancel
	l.mu.Unlock()
	cancel(context.Canceled)
	<-l.done
}

// Release stops the heartbeat and deletes the lock if this lease still holds
// it. Releasing a lock that already expired or was taken over is not an error:
// there is nothing left to release.
func (l *Lease) Release(ctx context.Context) error {
	l.Stop()
	_, err := l.m.UnlockContext(ctx)
	var taken *redsync.ErrTaken
	if err == nil || errors.Is(err, redsync.ErrLockAlreadyExpired) || errors.As(err, &taken) {
		return nil
	}
	return fmt.Errorf("lock: release: %w", err)
}

// Lost reports whether ctx (from Keep, or derived from it) ended because the
// lock was lost, including a loss after the caller's own context ended.
func Lost(ctx context.Context) bool {
	if errors.Is(context.Cause(ctx), ErrLost) {
		return true
	}
	l, ok := ctx.Value(leaseKey{}).(*Lease)
	return ok && l.lost.Load()
}
