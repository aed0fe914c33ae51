package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Concurrent steps: a definition may let independent steps run at once
// (MaxConcurrency). When the step the run is at is ready and others are
// ready beside it (every step they depend on completed), up to the bound of
// them form a wave: their intents are saved together (runState.Inflight)
// in one checkpoint, their Run functions are called at once, and their
// first attempts' outcomes are then recorded one at a time through the
// same path a step takes alone (runStep), the successes first, so that a
// failure's rollback finds every step of the wave that completed on the
// stack. A later attempt (a retry) runs alone. A crash mid-wave leaves the
// wave's steps in Inflight: the next execution runs each of them again as
// a step cut short (its interruption counted), and a rollback from there
// compensates them as interrupted, as it does a single intent.
//
// Which steps join a wave: plain steps with no limits, no guard and no
// hand-off (the others run alone, in order, as before). The order they
// are recorded in is the definition's order, so the undo stack keeps every
// step above what it consumed: a consumer starts only after its producers
// completed, in a later wave.

// MaxConcurrency lets up to n independent steps of a run execute at once
// (default 1: one after another, in dependency order). Only plain steps
// join: no limits, no guard, no hand-off; composed children, fan-out maps
// and interrupts run alone. A step's retries run alone too.
func MaxConcurrency(n int) Part {
	return partFunc(func(d *Definition) error {
		if n < 1 {
			return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("MaxConcurrency must be at least 1, got %d", n)}
		}
		if d.maxConc != 0 {
			return &DefinitionError{Reactor: d.name, Reason: "MaxConcurrency declared twice"}
		}
		d.maxConc = n
		return nil
	})
}

// MaxConcurrency returns how many of d's steps may run at once (1 unless
// declared).
func (d *Definition) MaxConcurrency() int { return max(1, d.maxConc) }

// WavePolicy is what the other steps of a wave do when one of them fails
// for good (a permanent error, or its last attempt).
type WavePolicy int

const (
	// WaitForWave lets them run to their end (the default): those that
	// complete are undone with the rest of the run.
	WaitForWave WavePolicy = iota
	// CancelWave cancels their contexts: a step that returns, cut short,
	// is compensated as a step cut short (its Compensate, if it has one);
	// one that completes anyway is undone.
	CancelWave
)

// OnWaveFailure sets what the steps of a wave do when one of them fails
// for good (see WavePolicy). It needs MaxConcurrency above 1.
func OnWaveFailure(p WavePolicy) Part {
	return partFunc(func(d *Definition) error {
		if p != WaitForWave && p != CancelWave {
			return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("OnWaveFailure: %d is not a WavePolicy", p)}
		}
		d.wavePolicy = p
		return nil
	})
}

// waveable reports whether s may run in a wave.
func waveable(s *stepDef) bool {
	return s.kind == kindPlain && len(s.limits) == 0 && s.guard == nil && s.handoff == NoHandOff
}

// prefetched is the first attempt of a step called in a wave.
type prefetched struct {
	val       Raw
	err       error
	began     time.Time // wall clock, for durations
	startedAt time.Time // the engine's clock, for the attempt log
	// cut: it returned an error after a failed sibling cancelled the wave
	// (CancelWave); its outcome is not recorded as an attempt.
	cut bool
}

// wave returns the steps that may run at once from s: s and the steps
// after it in order that are ready (their dependencies done), waveable and
// not done, up to the definition's bound; nil when that is s alone.
func (x *execution) wave(f *frame, s *stepDef) []*stepDef {
	if f.def.maxConc <= 1 || len(f.st.Inflight) > 0 || !waveable(s) {
		return nil
	}
	if in := f.st.Intent; in != nil && (in.Step != s.name || in.Attempt > 1 || in.Scheduled || !f.notStarted) {
		return nil // a retry, a scheduled wake-up, or a step cut short: alone
	}
	ready := func(t *stepDef) bool {
		for _, dep := range t.deps {
			if _, done := f.st.Steps[dep]; !done {
				return false
			}
		}
		return true
	}
	if !ready(s) {
		return nil
	}
	w := []*stepDef{s}
	for _, t := range f.def.order {
		if len(w) >= f.def.maxConc {
			break
		}
		if t == s || !waveable(t) {
			continue
		}
		if _, done := f.st.Steps[t.name]; done || !ready(t) {
			continue
		}
		w = append(w, t)
	}
	if len(w) < 2 {
		return nil
	}
	return w
}

// runWave saves the wave's intents and calls its steps' Run functions at
// once, leaving their outcomes in f.prefetch. It returns false when the
// wave did not start (a step's arguments could not be resolved, or the
// checkpoint found a cancel request): the steps then run one at a time.
func (x *execution) runWave(ctx context.Context, f *frame, w []*stepDef) (bool, error) {
	args := make([]Raw, len(w))
	for i, s := range w {
		a, err := resolveArgs(f.def, s, f.st)
		if err != nil {
			return false, nil // runStep fails it, alone
		}
		args[i] = a
	}
	now := x.e.now()
	f.st.Intent, f.notStarted = nil, false
	f.st.Inflight = make([]*intentRec, len(w))
	for i, s := range w {
		f.st.Inflight[i] = &intentRec{Step: s.name, Attempt: 1}
		f.st.stepStarted(s.name, now)
	}
	if err := x.checkpoint(ctx); err != nil {
		return false, err
	}
	if x.cancel {
		// Nothing was called: the cancel's rollback has nothing of the
		// wave to compensate.
		f.st.Inflight = nil
		return false, nil
	}
	if f.prefetch == nil {
		f.prefetch = map[string]*prefetched{}
	}
	out := make([]*prefetched, len(w))
	wctx, cancelWave := ctx, context.CancelFunc(func() {})
	if f.def.wavePolicy == CancelWave {
		wctx, cancelWave = context.WithCancel(ctx)
	}
	defer cancelWave()
	var mu sync.Mutex
	failed := false
	var wg sync.WaitGroup
	for i, s := range w {
		path := f.path + s.name
		if hook := failpoints.beforeStepRun; hook != nil {
			hook(x.st.ID, path, 1)
		}
		x.emit(ctx, Event{Kind: EventStepStarted, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: 1})
		p := &prefetched{began: time.Now(), startedAt: x.e.now()}
		out[i] = p
		wg.Go(func() {
			p.err = x.call(wctx, Call{Kind: CallRun, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: 1}, s.timeout, func(cctx context.Context) error {
				var rerr error
				p.val, rerr = s.run(cctx, args[i])
				return rerr
			})
			if p.err == nil {
				return
			}
			var halt *haltError
			var skip *skipError
			if errors.As(p.err, &halt) || errors.As(p.err, &skip) {
				return // not a failure
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case failed && wctx.Err() != nil && ctx.Err() == nil:
				p.cut = true // cancelled by a sibling's failure
			case IsPermanent(p.err) || s.retry.attempts() <= 1:
				failed = true
				cancelWave()
			}
		})
	}
	wg.Wait()
	for i, s := range w {
		f.prefetch[s.name] = out[i]
	}
	return true, nil
}

// waveOrder is the order a wave's outcomes are recorded in: the successes
// first (in the definition's order), then the rest.
func waveOrder(f *frame, w []*stepDef) []*stepDef {
	out := slices.Clone(w)
	// 0: completed, 1: failed, 2: cut short by a sibling's failure (never
	// recorded: the failure before it rolls back, and it is compensated
	// as cut short).
	rank := func(s *stepDef) int {
		switch p := f.prefetch[s.name]; {
		case p == nil || p.err == nil:
			return 0
		case p.cut:
			return 2
		}
		return 1
	}
	slices.SortStableFunc(out, func(a, b *stepDef) int { return rank(a) - rank(b) })
	return out
}

// takeInflight takes step name off the wave's saved intents: its outcome
// is about to be recorded.
func (st *runState) takeInflight(name string) *intentRec {
	for i, in := range st.Inflight {
		if in.Step == name {
			st.Inflight = slices.Delete(st.Inflight, i, i+1)
			if len(st.Inflight) == 0 {
				st.Inflight = nil
			}
			return in
		}
	}
	return nil
}

// Concurrent undo: a rollback of a definition with MaxConcurrency > 1
// undoes the top entries of its stack at once when they are independent:
// plain steps of the frame's definition with an Undo, no guard, no limits,
// no resource, not cut short, pending, none of them depending (through
// their arguments or After, transitively) on another of the group. Their
// Undo functions are called at once; the outcomes are then recorded entry
// by entry, newest first, through the path an entry takes alone
// (undoEntry), and the pops share one checkpoint. A crash before it leaves
// every entry of the group on the stack: each is undone again, at least
// once, as any entry in flight is.

// undone is the outcome of an Undo called in a group.
type undone struct {
	err       error
	began     time.Time
	startedAt int64
}

// dependsOn reports whether step a of d depends on step b, directly or
// through other steps.
func (d *Definition) dependsOn(a, b string) bool {
	seen := map[string]bool{}
	var walk func(name string) bool
	walk = func(name string) bool {
		s := d.byName[name]
		if s == nil || seen[name] {
			return false
		}
		seen[name] = true
		for _, dep := range s.deps {
			if dep == b || walk(dep) {
				return true
			}
		}
		return false
	}
	return walk(a)
}

// undoWave calls the Undo functions of the independent entries on top of
// f's stack at once, leaving their outcomes in f.undoPre; it does nothing
// for fewer than two.
func (x *execution) undoWave(ctx context.Context, f *frame) {
	if f.def.maxConc <= 1 {
		return
	}
	var g []*LedgerEntry
	var steps []*stepDef
	for i := len(f.st.Ledger) - 1; i >= 0 && len(g) < f.def.maxConc; i-- {
		e := f.st.Ledger[i]
		s := f.def.byName[e.Step]
		if s == nil || !waveable(s) || s.undo == nil || e.Interrupted || e.Resource != "" || e.Effect != nil || e.Status != RollbackPending {
			break
		}
		if slices.ContainsFunc(g, func(m *LedgerEntry) bool { return f.def.dependsOn(m.Step, e.Step) }) {
			break // a newer entry of the group consumed it: undone after it
		}
		g, steps = append(g, e), append(steps, s)
	}
	if len(g) < 2 {
		return
	}
	if f.undoPre == nil {
		f.undoPre = map[int]*undone{}
	}
	out := make([]*undone, len(g))
	var wg sync.WaitGroup
	for i, e := range g {
		s, path := steps[i], f.path+e.Step
		u := &undone{began: time.Now(), startedAt: x.e.now().UnixMilli()}
		out[i] = u
		wg.Go(func() {
			u.err = x.callUndo(ctx, Call{Kind: CallUndo, RunID: x.st.ID, Reactor: f.def.name, Step: path}, x.undoTimeout(s),
				func(cctx context.Context) error { return s.undo(cctx, e.Args, e.Result) })
		})
	}
	wg.Wait()
	for i, e := range g {
		f.undoPre[e.Ordinal] = out[i]
	}
}
