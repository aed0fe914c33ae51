// Package lock is goreactor's run lock: a redsync mutex that is tried once
// (never redsync's default 32 retries, which would block a handler for
// seconds), extended by a heartbeat while its holder works, and that tells a
// lost lock apart from a transport error.
package lock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
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
	return &Lease{m: m, expiry: l.expiry, grace: l.grace}, nil
}

// NewToken returns a fresh lock value, for a caller that takes the lock
// inside a script of its own (a create that sets the lock key with NX and
// the Locker's expiry in the same step) and then Adopts it.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.StdEncoding.EncodeToString(b[:])
}

// Adopt returns the lease on the lock at key that its caller took with
// token itself (SET key token NX PX expiry in a script of its own), the
// attempt having been sent at sent: the lease counts its validity from
// then, as TryAcquire does from its own attempt, so a slow reply shortens
// it and never lengthens it.
func (l *Locker) Adopt(key, token string, sent time.Time) *Lease {
	m := l.rs.NewMutex(key, redsync.WithExpiry(l.expiry), redsync.WithTries(1),
		redsync.WithTimeoutFactor(acquireTimeoutFactor), redsync.WithValue(token))
	return &Lease{m: m, expiry: l.expiry, grace: l.grace, adopted: sent.Add(l.expiry - drift(l.expiry))}
}

// drift is redsync's allowance for clock drift (its default factor, 0.01,
// of the expiry), kept the same for adopted leases.
func drift(expiry time.Duration) time.Duration {
	return time.Duration(float64(expiry) * 0.01)
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
//
// A kept lease runs no goroutine of its own while it waits: its heartbeat is
// a timer whose function extends the lock, so a holder that finishes within a
// third of the expiry (most runs) never starts one. The lock's validity is
// watched by a second timer only while an extension is in flight or after a
// failed one, and the grace by a third only after the caller's context ended.
type Lease struct {
	m      *redsync.Mutex
	expiry time.Duration
	grace  time.Duration
	// adopted is the validity of a lease taken by its caller's own script
	// (Adopt), whose mutex has never locked: until its first extension the
	// mutex's Until is zero.
	adopted time.Time
	// lost is set before the lease's context is cancelled for a loss: once
	// the caller's own context has ended, the cancellation cause is the
	// caller's, and the flag is what still tells a loss apart.
	lost atomic.Bool
	// beating counts the heartbeat's extensions in flight (0 or 1: the
	// beat timer is re-armed only when one ends). Stop waits for it: the
	// mutex is not safe for concurrent use.
	beating sync.WaitGroup

	mu      sync.Mutex
	cancel  context.CancelCauseFunc
	detach  context.Context // the caller's values without its cancellation, for extensions
	until   time.Time       // the lock's validity as of the last acquisition or extension
	beat    *time.Timer     // the next extension
	expired *time.Timer     // the validity's end, armed while it is not known extended
	graceT  *time.Timer     // the grace's end, armed once the caller's context ended
	unwatch func() bool     // stops watching the caller's context
	started bool
	stopped bool
	ended   bool // stopped or lost: no timer may act any more
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
//
// Keep is called at most once per lease.
func (l *Lease) Keep(parent context.Context) context.Context {
	ctx, cancel := context.WithCancelCause(parent)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancel, l.detach, l.started = cancel, context.WithoutCancel(parent), true
	l.until = l.m.Until()
	if l.until.IsZero() {
		l.until = l.adopted
	}
	l.unwatch = context.AfterFunc(parent, l.parentEnded)
	if left := time.Until(l.until); left >= l.expiry/3 {
		// The first extension is due a third of the expiry from now.
		l.beat = time.AfterFunc(l.expiry/3, l.extend)
		return context.WithValue(ctx, leaseKey{}, l)
	}
	// Less than a beat of validity left before the holder has done
	// anything: the acquisition's reply was slow (go-redis retried it
	// through a Redis Cluster slot migration, a stalled connection), and
	// the validity counts from the first send. The lock may well still be
	// held: extend it now, before the caller's code runs, rather than let
	// that code start on a lease about to be declared lost. An extension
	// proves the key still holds this lease's token, so nobody else can
	// have held the lock since it was taken.
	l.beat = time.AfterFunc(time.Hour, l.extend)
	l.beat.Stop()
	l.mu.Unlock()
	l.beatOnce(true)
	l.mu.Lock()
	return context.WithValue(ctx, leaseKey{}, l)
}

type leaseKey struct{}

// extend is the heartbeat's beat: one extension, then the next beat armed.
func (l *Lease) extend() { l.beatOnce(false) }

// beatOnce extends the lock once and arms the next beat. Past the
// validity the lease is lost without trying, unless first: Keep's
// extension of a lease nothing has run under yet, which may try late.
func (l *Lease) beatOnce(first bool) {
	interval := l.expiry / 3
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return
	}
	late := first && !time.Now().Before(l.until)
	if late {
		// Watched from now for one interval, the extension's own bound;
		// only a successful extension makes the lease valid (below).
		l.until = time.Now().Add(interval)
	}
	if !time.Now().Before(l.until) {
		// Not extended in time (the process stalled, or failed extensions
		// used the validity up): another process may hold the lock now.
		l.loseLocked()
		l.mu.Unlock()
		return
	}
	// The validity ends while the extension is in flight too: go-redis
	// bounds a call by its ReadTimeout and retries, not by the context's
	// deadline, so an extension over a stalled connection can outlast the
	// lock by seconds, and the holder must hear of the loss before another
	// process can take the lock.
	if l.expired == nil {
		l.expired = time.AfterFunc(time.Until(l.until), l.validityEnded)
	} else {
		l.expired.Reset(time.Until(l.until))
	}
	l.beating.Add(1)
	detach := l.detach
	l.mu.Unlock()
	defer l.beating.Done()

	began := time.Now()
	// Detached from the caller's cancellation, so that a caller cancelling
	// its work does not look like a lost lock.
	ectx, ecancel := context.WithTimeout(detach, interval)
	ok, err := l.m.ExtendContext(ectx)
	ecancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	var taken *redsync.ErrTaken
	switch {
	case ok:
		l.until = l.m.Until()
		l.expired.Stop() // the next beat comes well before the new validity ends
	case late, errors.As(err, &taken) || !time.Now().Before(l.until):
		l.loseLocked()
		return
	}
	// A transport error is tolerated until the validity ends (the expired
	// timer stays armed): the next beat tries again.
	l.beat.Reset(max(0, interval-time.Since(began)))
}

// validityEnded is the expired timer's function.
func (l *Lease) validityEnded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended || time.Now().Before(l.until) {
		return // stopped, or a stale firing: an extension landed meanwhile
	}
	l.loseLocked()
}

// parentEnded starts the grace when the caller's context ends.
func (l *Lease) parentEnded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.graceT = time.AfterFunc(l.grace, l.graceEnded)
}

func (l *Lease) graceEnded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.loseLocked()
	}
}

// loseLocked ends the lease as lost. l.mu is held.
func (l *Lease) loseLocked() {
	l.lost.Store(true) // before the cancellation: see lost
	l.endLocked()
	l.cancel(ErrLost)
}

// endLocked stops every timer: nothing acts on the lease any more. An
// extension in flight finishes (Stop waits for it) and re-arms nothing.
func (l *Lease) endLocked() {
	l.ended = true
	l.beat.Stop()
	if l.expired != nil {
		l.expired.Stop()
	}
	if l.graceT != nil {
		l.graceT.Stop()
	}
	l.unwatch()
}

// Stop ends the heartbeat (it does not release the lock) and waits for an
// extension in flight to end. It is idempotent.
func (l *Lease) Stop() {
	l.mu.Lock()
	if !l.started || l.stopped {
		l.stopped = true
		l.mu.Unlock()
		l.beating.Wait() // a concurrent Stop's extension in flight
		return
	}
	l.stopped = true
	if !l.ended {
		l.endLocked()
	}
	cancel := l.cancel
	l.mu.Unlock()
	cancel(context.Canceled) // a no-op after a loss: the cause stays ErrLost
	l.beating.Wait()
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

//go:embed release.lua
var releaseSrc string

var releaseScript = redis.NewScript(releaseSrc)

// QueueRelease stops the heartbeat and queues the lock's deletion (if the
// lease still holds it) on pipeline p, for a holder whose last writes share
// a round trip with the release. Commands queued on p before it run before
// it on a single node; a Redis Cluster client sends each node's share of a
// pipeline separately, so there a caller that needs that order releases
// with Release after its pipeline instead. The caller checks the returned
// command's error: NOSCRIPT (a server that lost its script cache) is
// followed by Release.
func (l *Lease) QueueRelease(ctx context.Context, p redis.Pipeliner) *redis.Cmd {
	l.Stop()
	return releaseScript.EvalSha(ctx, p, []string{l.m.Name()}, l.m.Value())
}

// LoadScripts loads the scripts QueueRelease sends by hash.
func LoadScripts(ctx context.Context, rdb redis.UniversalClient) error {
	if err := releaseScript.Load(ctx, rdb).Err(); err != nil {
		return fmt.Errorf("lock: load script: %w", err)
	}
	return nil
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
