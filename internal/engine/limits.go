package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/store"
)

// Limits: a step may declare limits that hold across every worker: at most
// N holders per key at once (a lock is one), and rate limits per key over
// sliding windows. Each attempt of the step takes its limits before its Run
// is called and gives the slots back when it returns; a slot is a lease in
// Redis (store/lua/slot.lua), renewed while the attempt runs, so a holder
// that dies frees it when the lease ends. A step that finds a limit full
// waits a little in-process (limitSpin), then leaves the run at its
// checkpoint with a *LimitError: a worker snoozes the task (never spending
// its retry budget), an in-process Run returns the error. A fan-out map's
// elements are runs of their own, so a step limit holds per element task
// across all workers.

// Limit declares a limit on a step (StepConfig.Limits). Steps (of any
// reactor) that declare the same Name share it, key by key.
type Limit struct {
	// Name names the limit; required. Keys of different limits never meet.
	Name string
	// Key computes the key from the step's arguments: a tenant, an account,
	// a partner. Default: one key for the whole limit.
	Key func(args Args) (string, error)
	// Concurrency is how many attempts may run at once per key, across
	// every worker (1: a lock). 0: none.
	Concurrency int
	// Rates bound how many attempts may start per key in any window of
	// their Per (several at once: 100 a second and 2,000 a minute).
	Rates []Rate
	// Lease is how long a slot outlives a holder that stopped renewing it
	// (a dead process). Default 30 s; the holder renews it every third.
	Lease time.Duration
	// Ordered makes the concurrency slots go to the waiting runs in the
	// order they were created (enqueued), among the runs that reached the
	// step: with Concurrency 1, runs for a key execute the step in enqueue
	// order. A waiter keeps its place by trying again; a run that died
	// loses its place a Lease after its last try, so it never blocks the
	// key for ever. Requires Concurrency.
	Ordered bool
	// OncePer lets one run per key run the step in each period of this
	// length (periods aligned to the Unix epoch, on the Redis server's
	// clock): a second run in the same period halts at the step, with a
	// reason naming the run that holds the period. The holder's own
	// retries and resumes run. 0: none.
	OncePer time.Duration
}

// Rate is a rate limit: at most N starts in any window of Per.
type Rate struct {
	N   int
	Per time.Duration
}

// Lock is the limit of one holder per key at a time.
func Lock(name string, key func(args Args) (string, error)) Limit {
	return Limit{Name: name, Key: key, Concurrency: 1}
}

const defaultLease = 30 * time.Second

// limitSpin bounds how long an attempt waits in-process for a full limit
// before it leaves the run and its worker snoozes.
var limitSpin = time.Second

func (l Limit) validate() error {
	switch {
	case l.Name == "":
		return errors.New("a limit needs a Name")
	case keys.ValidateID(l.Name) != nil:
		return fmt.Errorf("limit name %q: %v", l.Name, keys.ValidateID(l.Name))
	case l.Concurrency < 0:
		return fmt.Errorf("limit %q: Concurrency is negative", l.Name)
	case l.Concurrency == 0 && len(l.Rates) == 0 && l.OncePer == 0:
		return fmt.Errorf("limit %q limits nothing: set Concurrency, Rates or OncePer", l.Name)
	case l.Lease < 0:
		return fmt.Errorf("limit %q: Lease is negative", l.Name)
	case l.Ordered && l.Concurrency == 0:
		return fmt.Errorf("limit %q: Ordered orders the holders of Concurrency slots, and it has none", l.Name)
	case l.OncePer < 0:
		return fmt.Errorf("limit %q: OncePer is negative", l.Name)
	case l.OncePer > 0 && l.OncePer < time.Millisecond:
		return fmt.Errorf("limit %q: OncePer %s is under a millisecond", l.Name, l.OncePer)
	}
	for _, r := range l.Rates {
		if r.N < 1 || r.Per <= 0 {
			return fmt.Errorf("limit %q: rate %d per %s: both must be positive", l.Name, r.N, r.Per)
		}
	}
	return nil
}

func (l Limit) lease() time.Duration {
	if l.Lease > 0 {
		return l.Lease
	}
	return defaultLease
}

// LimitError is an attempt that found a limit full: the run waits at its
// checkpoint for room (a worker snoozes its task; Resume goes on later).
type LimitError struct {
	RunID, Step string
	// Limit and Key name what was full; Kind is "concurrency" or "rate".
	Limit, Key, Kind string
	// RetryAfter is when room may come: the earliest lease's end
	// (concurrency; a holder that finishes frees it sooner), or when the
	// fullest window has room (rate).
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("reactor: run %s, step %s: %s limit %q is full for key %q (room in %s at the latest)",
		e.RunID, e.Step, e.Kind, e.Limit, e.Key, e.RetryAfter)
}

// Is makes errors.Is(err, ErrLimited) hold.
func (e *LimitError) Is(target error) bool { return target == ErrLimited }

// ErrLimited: a step's limit was full (see *LimitError).
var ErrLimited = errors.New("reactor: a limit is full")

// errLimited unwinds an execution whose step found a limit full: saved at
// its checkpoint; conclude releases the lock and returns the *LimitError.
type errLimited struct{ le *LimitError }

func (e *errLimited) Error() string { return e.le.Error() }

// heldSlot is a semaphore slot an attempt holds.
type heldSlot struct {
	key, holder string
	lease       time.Duration
}

// limitHolds are the slots one attempt holds, renewed until released.
type limitHolds struct {
	st    *store.Store
	slots []heldSlot
	stop  chan struct{}
	done  sync.WaitGroup
}

// release gives every slot back (after the attempt returned).
func (h *limitHolds) release(ctx context.Context) {
	if h == nil {
		return
	}
	close(h.stop)
	h.done.Wait()
	for _, s := range h.slots {
		_ = h.st.ReleaseSlot(context.WithoutCancel(ctx), s.key, s.holder)
	}
}

func newHolder() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// takeLimits takes step s's limits for one attempt: every concurrency slot,
// then every rate admission. It returns the holds to release after the
// attempt, or a *LimitError when one stayed full for limitSpin (nothing is
// held then).
func (x *execution) takeLimits(ctx context.Context, f *frame, s *stepDef, args Raw, undo bool) (*limitHolds, error) {
	if len(s.limits) == 0 {
		return nil, nil
	}
	var a Args
	if err := codec.Unmarshal(args, &a); err != nil {
		return nil, Permanent(fmt.Errorf("reactor: step %q: limits: %w", f.path+s.name, err))
	}
	wants := make([]limitWant, 0, len(s.limits))
	for _, l := range s.limits {
		key := ""
		if l.Key != nil {
			k, err := l.Key(a)
			if err != nil {
				return nil, Permanent(fmt.Errorf("reactor: step %q: key of limit %q: %w", f.path+s.name, l.Name, err))
			}
			key = k
		}
		wants = append(wants, limitWant{l, key})
	}
	if !undo {
		if err := x.claimPeriods(ctx, f, s, wants); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(limitSpin)
	delay := 5 * time.Millisecond
	for {
		h, lerr, err := x.tryLimits(ctx, f, s, wants)
		if err != nil || lerr == nil {
			return h, err
		}
		x.emit(ctx, Event{Kind: EventLimitWaited, RunID: x.st.ID, Reactor: f.def.name, Step: f.path + s.name, Err: lerr, Delay: lerr.RetryAfter})
		if time.Now().Add(delay).After(deadline) {
			x.emit(ctx, Event{Kind: EventLimitRefused, RunID: x.st.ID, Reactor: f.def.name, Step: f.path + s.name, Err: lerr, Delay: lerr.RetryAfter})
			return nil, lerr
		}
		if err := x.e.sleep(ctx, delay+mrand.N(delay)); err != nil {
			return nil, err
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
}

// onceHeld halts a run at a once-per-period step another run holds.
type onceHeld struct{ reason string }

func (e *onceHeld) Error() string { return e.reason }

// claimPeriods claims the current period of each once-per-period limit for
// this run, or returns why the run halts.
func (x *execution) claimPeriods(ctx context.Context, f *frame, s *stepDef, wants []limitWant) error {
	for _, w := range wants {
		if w.l.OncePer == 0 {
			continue
		}
		holder, left, err := x.e.store.ClaimPeriod(ctx, x.e.store.Keys().Once(w.l.Name, w.key), x.st.ID, w.l.OncePer)
		if err != nil {
			return err
		}
		if holder != "" {
			return &onceHeld{reason: fmt.Sprintf("step %s runs once per %s for key %q (limit %q), and run %s ran it in this period (it ends in %s)",
				f.path+s.name, w.l.OncePer, w.key, w.l.Name, holder, left.Round(time.Millisecond))}
		}
	}
	return nil
}

// limitWant is a limit and the key an attempt takes it for.
type limitWant struct {
	l   Limit
	key string
}

func (x *execution) tryLimits(ctx context.Context, f *frame, s *stepDef, wants []limitWant) (*limitHolds, *LimitError, error) {
	k := x.e.store.Keys()
	h := &limitHolds{st: x.e.store, stop: make(chan struct{})}
	giveBack := func() {
		for _, sl := range h.slots {
			_ = x.e.store.ReleaseSlot(context.WithoutCancel(ctx), sl.key, sl.holder)
		}
	}
	path := f.path + s.name
	for _, w := range wants {
		if w.l.Concurrency == 0 {
			continue
		}
		key := k.Slots(w.l.Name, w.key)
		waiter := x.st.ID + "|" + path
		holder := waiter + "|" + newHolder()
		var g store.SlotGrant
		var err error
		if w.l.Ordered {
			g, err = x.e.store.AcquireOrdered(ctx, key, holder, waiter, x.st.CreatedAt, w.l.Concurrency, w.l.lease())
		} else {
			g, err = x.e.store.AcquireSlot(ctx, key, holder, waiter, w.l.Concurrency, w.l.lease())
		}
		if err != nil {
			giveBack()
			return nil, nil, err
		}
		if !g.Held {
			giveBack()
			return nil, &LimitError{RunID: x.st.ID, Step: path, Limit: w.l.Name, Key: w.key, Kind: "concurrency", RetryAfter: g.Wait}, nil
		}
		h.slots = append(h.slots, heldSlot{key: key, holder: holder, lease: w.l.lease()})
	}
	// Rates last: an admission is spent once taken, so it is taken only
	// when every slot is held. Two rate limits where the second refuses
	// leave the first's admission spent (the window over-counts; never
	// under-counts).
	for _, w := range wants {
		if len(w.l.Rates) == 0 {
			continue
		}
		ws := make([]store.Window, len(w.l.Rates))
		for i, r := range w.l.Rates {
			ws[i] = store.Window{N: r.N, Per: r.Per}
		}
		ok, wait, err := x.e.store.Admit(ctx, k.Rate(w.l.Name, w.key), x.st.ID+"|"+path+"|"+newHolder(), ws)
		if err != nil {
			giveBack()
			return nil, nil, err
		}
		if !ok {
			giveBack()
			return nil, &LimitError{RunID: x.st.ID, Step: path, Limit: w.l.Name, Key: w.key, Kind: "rate", RetryAfter: wait}, nil
		}
	}
	if len(h.slots) > 0 {
		h.done.Add(1)
		go h.renew(context.WithoutCancel(ctx), x.e)
	}
	x.emit(ctx, Event{Kind: EventLimitTaken, RunID: x.st.ID, Reactor: f.def.name, Step: path})
	return h, nil, nil
}

// renew keeps the slots' leases while the attempt runs: every third of the
// shortest lease.
func (h *limitHolds) renew(ctx context.Context, e *Engine) {
	defer h.done.Done()
	every := h.slots[0].lease
	for _, s := range h.slots {
		every = min(every, s.lease)
	}
	t := time.NewTicker(max(every/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			for _, s := range h.slots {
				if ok, err := h.st.RenewSlot(ctx, s.key, s.holder, s.lease); err == nil && !ok {
					e.log.Warn("a step's limit slot was lost while the step ran (its lease ended before it was renewed); the limit may be exceeded once",
						"event", "reactor.limit.lost", "limit_key", s.key, "holder", s.holder)
				}
			}
		}
	}
}

// StepLimits are the limits one step declares.
type StepLimits struct {
	// Step is the step's path ("post", "book/post" inside a composed child).
	Step   string
	Limits []Limit
}

// StepLimits lists the limits d's steps declare, and those of the children
// it composes, in execution order: what a dashboard offers to look at.
func (d *Definition) StepLimits() []StepLimits {
	var out []StepLimits
	var walk func(d *Definition, prefix string)
	walk = func(d *Definition, prefix string) {
		for _, s := range d.order {
			if len(s.limits) > 0 {
				out = append(out, StepLimits{Step: prefix + s.name, Limits: s.limits})
			}
			if s.child != nil {
				walk(s.child, prefix+s.name+"/")
			}
		}
	}
	walk(d, "")
	return out
}
