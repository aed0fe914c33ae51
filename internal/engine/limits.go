package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"strings"
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
	// Fair makes Concurrency the limit's total across all its keys, shared
	// fairly among the keys that want it: each key's share is Concurrency
	// divided among the keys holding or waiting (at least one each). A key
	// below its share gets the next free slot; a key at or above it gets
	// one only while no waiting key lacks its share, so one tenant's
	// 100,000 queued elements cannot starve another tenant's ten, and a
	// key alone may use every slot. Requires Concurrency; not with
	// Ordered.
	Fair bool
	// OnFull is what an attempt that finds the limit's Concurrency full
	// does: wait for a slot (WaitForSlot, the default), cancel its own run
	// (CancelNewest), or cancel the oldest run holding a slot and wait
	// for that slot (CancelOldest). Not with Fair or Ordered; an undo
	// always waits.
	OnFull FullPolicy
	// OncePer lets one run per key run the step in each period of this
	// length (periods aligned to the Unix epoch, on the Redis server's
	// clock): a second run in the same period halts at the step, with a
	// reason naming the run that holds the period. The holder's own
	// retries and resumes run. 0: none.
	OncePer time.Duration
}

// FullPolicy is what an attempt that finds a concurrency limit full does
// (Limit.OnFull).
type FullPolicy int

const (
	// WaitForSlot waits for a slot: in-process for a moment, then at the
	// run's checkpoint (a worker snoozes the task).
	WaitForSlot FullPolicy = iota
	// CancelNewest cancels the run that finds the key full, at once: it
	// rolls back what it completed and ends cancelled, its failure naming
	// the limit, the key and a holder. For work where the run in
	// progress covers the newcomers (a sync already running). A fan-out
	// element cancelled this way fails its map.
	CancelNewest
	// CancelOldest cancels the oldest run holding a slot of the key
	// (created before this one) and waits for the slot: for work where
	// only the latest request matters (a newer price, a newer deploy). The
	// cancelled run stops at its next checkpoint, after the step it is in
	// returns, and rolls back what it completed; the undo of this step
	// waits for the slot like any undo. Holders that are fan-out elements,
	// or newer than this run, are waited for, never cancelled.
	CancelOldest
)

func (p FullPolicy) String() string {
	switch p {
	case WaitForSlot:
		return "wait"
	case CancelNewest:
		return "cancel-newest"
	case CancelOldest:
		return "cancel-oldest"
	}
	return "FullPolicy(" + strconv.Itoa(int(p)) + ")"
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
	case l.Fair && l.Concurrency == 0:
		return fmt.Errorf("limit %q: Fair shares Concurrency slots among keys, and it has none", l.Name)
	case l.Fair && l.Ordered:
		return fmt.Errorf("limit %q: Fair and Ordered are two ways to hand out slots; choose one", l.Name)
	case l.OnFull < WaitForSlot || l.OnFull > CancelOldest:
		return fmt.Errorf("limit %q: OnFull %s is not a policy", l.Name, l.OnFull)
	case l.OnFull != WaitForSlot && l.Concurrency == 0:
		return fmt.Errorf("limit %q: OnFull %s acts when Concurrency is full, and it has none", l.Name, l.OnFull)
	case l.OnFull != WaitForSlot && (l.Fair || l.Ordered):
		return fmt.Errorf("limit %q: OnFull %s cancels runs, and Fair or Ordered hands slots to waiters; choose one", l.Name, l.OnFull)
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

	want    limitWant // what was full
	slotKey string    // its semaphore (concurrency)
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
	fair        bool // of a fair-shared semaphore (fair.lua)
}

func (s heldSlot) release(ctx context.Context, st *store.Store) error {
	if s.fair {
		return st.ReleaseFair(ctx, s.key, s.holder)
	}
	return st.ReleaseSlot(ctx, s.key, s.holder)
}

func (s heldSlot) renew(ctx context.Context, st *store.Store) (bool, error) {
	if s.fair {
		return st.RenewFair(ctx, s.key, s.holder, s.lease)
	}
	return st.RenewSlot(ctx, s.key, s.holder, s.lease)
}

// limitHolds are the slots one attempt holds, renewed until released.
type limitHolds struct {
	st    *store.Store
	waits *slotWaits
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
		if s.release(context.WithoutCancel(ctx), h.st) == nil {
			h.waits.wake(s.key)
		}
	}
}

// newHolder is a holder's tag: the holder's run's creation time (ms,
// base 36: CancelOldest compares it) and random bytes.
func newHolder(createdAt int64) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return strconv.FormatInt(createdAt, 36) + "." + hex.EncodeToString(b[:])
}

// holderRun parses a holder "<run>|<step>|<created>.<random>" into its run
// id and its run's creation time (ok false for a holder of another form).
// A run id is read up to the first "|".
func holderRun(holder string) (run string, created int64, ok bool) {
	i := strings.LastIndexByte(holder, '|')
	if i < 0 {
		return "", 0, false
	}
	ts, _, ok := strings.Cut(holder[i+1:], ".")
	if !ok {
		return "", 0, false
	}
	created, err := strconv.ParseInt(ts, 36, 64)
	if err != nil {
		return "", 0, false
	}
	run, _, ok = strings.Cut(holder[:i], "|")
	return run, created, ok
}

// limitCancel ends a run whose limit, full, says CancelNewest.
type limitCancel struct{ reason string }

func (e *limitCancel) Error() string { return e.reason }

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
	wants, err := limitWants(s.limits, a)
	if err != nil {
		return nil, Permanent(fmt.Errorf("reactor: step %q: %w", f.path+s.name, err))
	}
	if !undo {
		if err := x.claimPeriods(ctx, f, s, wants); err != nil {
			return nil, err
		}
	}
	return x.waitLimits(ctx, limitCall{reactor: f.def.name, path: f.path + s.name, undo: undo, rates: true}, wants)
}

// limitCall is who takes limits: a step's attempt (path the step's), or a
// run (path "(run)", with a holder of its own that every execution of the
// run shares, fixed).
type limitCall struct {
	reactor, path string
	undo          bool   // an undo: never cancels anybody
	rates         bool   // take the rate limits' admissions
	fixed         string // the holder's tag ("": a fresh one per try)
}

// waitLimits takes wants for c, waiting in-process up to limitSpin.
func (x *execution) waitLimits(ctx context.Context, c limitCall, wants []limitWant) (*limitHolds, error) {
	deadline := time.Now().Add(limitSpin)
	delay := 5 * time.Millisecond
	cancelled := false // CancelOldest cancels one holder per attempt
	for {
		// Registered before the try, so that a release in this process
		// between a refusal and the wait is not missed.
		ws := x.watchSlots(wants)
		h, lerr, err := x.tryLimits(ctx, c, wants)
		if err != nil || lerr == nil {
			ws.done()
			return h, err
		}
		if !c.undo && lerr.Kind == "concurrency" {
			if w := lerr.want; w.l.OnFull == CancelNewest {
				ws.done()
				x.emit(ctx, Event{Kind: EventLimitCancelled, RunID: x.st.ID, Reactor: c.reactor, Step: c.path, Err: lerr})
				return nil, &limitCancel{reason: fmt.Sprintf("cancelled: limit %q is full for key %q, and it cancels the newest run (CancelNewest)", w.l.Name, w.key)}
			} else if w.l.OnFull == CancelOldest && !cancelled {
				cancelled = true
				x.cancelOldest(ctx, c, lerr)
			}
		}
		x.emit(ctx, Event{Kind: EventLimitWaited, RunID: x.st.ID, Reactor: c.reactor, Step: c.path, Err: lerr, Delay: lerr.RetryAfter})
		if time.Now().Add(delay).After(deadline) {
			ws.done()
			x.emit(ctx, Event{Kind: EventLimitRefused, RunID: x.st.ID, Reactor: c.reactor, Step: c.path, Err: lerr, Delay: lerr.RetryAfter})
			return nil, lerr
		}
		woken, err := ws.await(ctx, x.e, delay+mrand.N(delay), lerr.Kind == "concurrency")
		ws.done()
		if err != nil {
			return nil, err
		}
		if !woken {
			delay = min(delay*2, 100*time.Millisecond)
		}
	}
}

// slotWatch is an attempt's registration as a waiter for the semaphores
// of its concurrency limits in this process: a release of any of them
// here sends on ch.
type slotWatch struct {
	waits *slotWaits
	keys  []string
	ws    []*slotWaiter
	ch    chan struct{}
}

func (x *execution) watchSlots(wants []limitWant) *slotWatch {
	w := &slotWatch{waits: &x.e.slotWaits, ch: make(chan struct{}, 1)}
	k := x.e.store.Keys()
	for _, want := range wants {
		if want.l.Concurrency == 0 {
			continue
		}
		key, tenant := k.Slots(want.l.Name, want.key), ""
		if want.l.Fair {
			key, tenant = k.Fair(want.l.Name), want.key
		}
		w.keys = append(w.keys, key)
		w.ws = append(w.ws, w.waits.wait(key, tenant, w.ch))
	}
	return w
}

// await waits d, or less when a release in this process wakes the watch
// (only after a concurrency refusal: a rate limit's room comes with time).
func (w *slotWatch) await(ctx context.Context, e *Engine, d time.Duration, concurrency bool) (woken bool, err error) {
	if !concurrency || len(w.ws) == 0 {
		return false, e.sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ch:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// done unregisters the watch. A wake-up it took but did not use is passed
// on to the next waiter, so that no release's hint is lost.
func (w *slotWatch) done() {
	for i, sw := range w.ws {
		w.waits.done(w.keys[i], sw)
	}
	select {
	case <-w.ch:
		for _, key := range w.keys {
			w.waits.wake(key)
		}
	default:
	}
}

// cancelOldest cancels the oldest root run holding a slot of the limit le
// found full, if it was created before this run.
func (x *execution) cancelOldest(ctx context.Context, c limitCall, le *LimitError) {
	holders, err := x.e.store.SlotHolders(ctx, le.slotKey)
	if err != nil {
		return // waited for instead
	}
	victim, oldest := "", int64(0)
	for _, h := range holders {
		run, created, ok := holderRun(h.Holder)
		if !ok || run == x.st.ID || created > x.st.CreatedAt || (created == x.st.CreatedAt && run >= x.st.ID) {
			continue
		}
		if victim == "" || created < oldest {
			victim, oldest = run, created
		}
	}
	if victim == "" {
		return
	}
	if err := x.e.Cancel(ctx, victim); err != nil {
		// An element (not a root run), or one that finished or is rolling
		// back already: its slot comes back as it ends.
		return
	}
	x.emit(ctx, Event{Kind: EventLimitCancelled, RunID: victim, Reactor: c.reactor, Step: c.path,
		Err: fmt.Errorf("cancelled by run %s, which found the limit full and cancels the oldest run (CancelOldest): %w", x.st.ID, le)})
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

// limitWants computes each limit's key from a (a step's arguments, or a
// run's inputs).
func limitWants(limits []Limit, a Args) ([]limitWant, error) {
	wants := make([]limitWant, 0, len(limits))
	for _, l := range limits {
		key := ""
		if l.Key != nil {
			k, err := l.Key(a)
			if err != nil {
				return nil, fmt.Errorf("key of limit %q: %w", l.Name, err)
			}
			key = k
		}
		wants = append(wants, limitWant{l, key})
	}
	return wants, nil
}

func (x *execution) tryLimits(ctx context.Context, c limitCall, wants []limitWant) (*limitHolds, *LimitError, error) {
	k := x.e.store.Keys()
	h := &limitHolds{st: x.e.store, waits: &x.e.slotWaits, stop: make(chan struct{})}
	giveBack := func() {
		for _, sl := range h.slots {
			if sl.release(context.WithoutCancel(ctx), x.e.store) == nil {
				x.e.slotWaits.wake(sl.key)
			}
		}
	}
	path := c.path
	tag := func() string {
		if c.fixed != "" {
			return c.fixed
		}
		return newHolder(x.st.CreatedAt)
	}
	for _, w := range wants {
		if w.l.Concurrency == 0 {
			continue
		}
		key := k.Slots(w.l.Name, w.key)
		waiter := x.st.ID + "|" + path
		holder := waiter + "|" + tag()
		var g store.SlotGrant
		var err error
		switch {
		case w.l.Fair:
			key = k.Fair(w.l.Name)
			g, err = x.e.store.AcquireFair(ctx, key, holder, w.key, waiter, w.l.Concurrency, w.l.lease())
		case w.l.Ordered:
			g, err = x.e.store.AcquireOrdered(ctx, key, holder, waiter, x.st.CreatedAt, w.l.Concurrency, w.l.lease())
		default:
			g, err = x.e.store.AcquireSlot(ctx, key, holder, waiter, w.l.Concurrency, w.l.lease())
		}
		if err != nil {
			giveBack()
			return nil, nil, err
		}
		if !g.Held {
			giveBack()
			return nil, &LimitError{RunID: x.st.ID, Step: path, Limit: w.l.Name, Key: w.key, Kind: "concurrency", RetryAfter: g.Wait,
				want: w, slotKey: key}, nil
		}
		h.slots = append(h.slots, heldSlot{key: key, holder: holder, lease: w.l.lease(), fair: w.l.Fair})
	}
	// Rates last: an admission is spent once taken, so it is taken only
	// when every slot is held. Two rate limits where the second refuses
	// leave the first's admission spent (the window over-counts; never
	// under-counts).
	for _, w := range wants {
		if len(w.l.Rates) == 0 || !c.rates {
			continue
		}
		ws := make([]store.Window, len(w.l.Rates))
		for i, r := range w.l.Rates {
			ws[i] = store.Window{N: r.N, Per: r.Per}
		}
		ok, wait, err := x.e.store.Admit(ctx, k.Rate(w.l.Name, w.key), x.st.ID+"|"+path+"|"+newHolder(x.st.CreatedAt), ws)
		if err != nil {
			giveBack()
			return nil, nil, err
		}
		if !ok {
			giveBack()
			return nil, &LimitError{RunID: x.st.ID, Step: path, Limit: w.l.Name, Key: w.key, Kind: "rate", RetryAfter: wait, want: w}, nil
		}
	}
	if len(h.slots) > 0 {
		h.done.Add(1)
		go h.renew(context.WithoutCancel(ctx), x.e)
	}
	x.emit(ctx, Event{Kind: EventLimitTaken, RunID: x.st.ID, Reactor: c.reactor, Step: path})
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
				if ok, err := s.renew(ctx, h.st); err == nil && !ok {
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
