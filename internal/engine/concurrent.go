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
// in one checkpoint and their Run functions are called at once. Each
// success is recorded as it lands, through the same path a step takes
// alone (runStep), and the steps it freed start at once beside those still
// running, their intents on its checkpoint: the wave rolls on. The first
// failure stops new starts; when the steps in flight have returned, what
// was not recorded is, the successes first, so that a failure's rollback
// finds every step that completed on the stack. A later attempt (a retry)
// runs alone. A crash leaves the steps in flight in Inflight: the next
// execution runs each of them again as a step cut short (its interruption
// counted), and a rollback from there compensates them as interrupted, as
// it does a single intent.
//
// Which steps join a wave: plain steps with no limits, no guard and no
// hand-off (the others run alone, in order, as before). A consumer starts
// only once what it reads is recorded, so the undo stack keeps every step
// above what it consumed.

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

// runWave runs wave w and the steps that become ready while it runs: it
// saves the wave's intents (Inflight) and calls its steps' Run functions
// at once; each success is recorded as it lands, and the ready steps it
// freed (up to the bound, with what still runs) have their intents saved
// in that same checkpoint and start at once. The first failure (a Halt
// too) stops new starts: the steps in flight end (or are cancelled, with
// CancelWave), and what has not been recorded is then recorded in
// waveOrder, through the path a step takes alone. started is false when
// the wave did not start (a step's arguments could not be resolved, or the
// first checkpoint found a cancel request): its steps then run one at a
// time. res, stop and err are stepInFrame's, for the step that ended the
// frame.
func (x *execution) runWave(ctx context.Context, f *frame, w []*stepDef, pending *int) (res *frameResult, started, stop bool, err error) {
	args := make([]Raw, len(w))
	for i, s := range w {
		a, err := resolveArgs(f.def, s, f.st)
		if err != nil {
			return nil, false, false, nil // runStep fails it, alone
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
		return nil, false, true, err
	}
	if x.cancel {
		// Nothing was called: the cancel's rollback has nothing of the
		// wave to compensate.
		f.st.Inflight = nil
		return nil, false, false, nil
	}
	if f.prefetch == nil {
		f.prefetch = map[string]*prefetched{}
	}
	type landed struct {
		s *stepDef
		p *prefetched
	}
	results := make(chan landed, len(f.def.order))
	wctx, cancelWave := ctx, context.CancelFunc(func() {})
	if f.def.wavePolicy == CancelWave {
		wctx, cancelWave = context.WithCancel(ctx)
	}
	defer cancelWave()
	var mu sync.Mutex
	failed := false
	var wg sync.WaitGroup
	defer wg.Wait() // an early return (Redis trouble) leaves nothing running
	inflight := map[string]bool{}
	launch := func(batch []*stepDef, args []Raw) {
		for i, s := range batch {
			path := f.path + s.name
			if hook := failpoints.beforeStepRun; hook != nil {
				hook(x.st.ID, path, 1)
			}
			x.emit(ctx, Event{Kind: EventStepStarted, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: 1})
			p := &prefetched{began: time.Now(), startedAt: x.e.now()}
			inflight[s.name] = true
			a := args[i]
			wg.Go(func() {
				defer func() { results <- landed{s, p} }()
				p.err = x.call(wctx, Call{Kind: CallRun, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: 1}, s.timeout, func(cctx context.Context) error {
					var rerr error
					p.val, rerr = s.run(cctx, a)
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
	}
	launch(w, args)
	var held []*stepDef // landed, to be recorded in waveOrder
	stopping := false
	for len(inflight) > 0 {
		// What has landed by now, recorded together: one checkpoint for
		// the completions that land at the same moment.
		batch := []landed{<-results}
		for more := true; more; {
			select {
			case l := <-results:
				batch = append(batch, l)
			default:
				more = false
			}
		}
		recorded := false
		for _, l := range batch {
			delete(inflight, l.s.name)
			f.prefetch[l.s.name] = l.p
			var skip *skipError
			if stopping || (l.p.err != nil && !errors.As(l.p.err, &skip)) {
				stopping = true
				held = append(held, l.s)
				continue
			}
			// A success (or a skip): recorded now.
			f.st.takeInflight(l.s.name)
			f.st.Intent, f.notStarted = &intentRec{Step: l.s.name, Attempt: 1}, true
			res, stop, err := x.stepInFrame(ctx, f, l.s, pending, true)
			if stop || err != nil {
				cancelWave()
				return res, true, true, err
			}
			recorded = true
		}
		if !recorded {
			continue
		}
		// The steps the completions freed start, their intents on the
		// completions' checkpoint (none once a failure stopped starts).
		var next []*stepDef
		var nextArgs []Raw
		if !stopping {
			next, nextArgs = x.freed(f, inflight)
		}
		if len(inflight)+len(next) > 0 {
			// What runs is in Inflight; no single next intent rides.
			f.st.Intent = nil
		}
		now := x.e.now()
		for _, t := range next {
			f.st.Inflight = append(f.st.Inflight, &intentRec{Step: t.name, Attempt: 1})
			f.st.stepStarted(t.name, now)
		}
		if *pending > 0 || !f.root {
			if err := x.checkpoint(ctx); err != nil {
				cancelWave()
				return nil, true, true, err
			}
		}
		if x.cancel {
			// Found by that checkpoint: nothing more starts; the steps
			// freed were never called.
			for _, t := range next {
				f.st.takeInflight(t.name)
			}
			stopping = true
			continue
		}
		launch(next, nextArgs)
	}
	wg.Wait()
	order := waveOrder(f, held)
	for i, t := range order {
		f.st.takeInflight(t.name)
		f.st.Intent, f.notStarted = &intentRec{Step: t.name, Attempt: 1}, true
		// The successes that landed after a failure share one
		// checkpoint, the last one's: a crash before it leaves them in
		// Inflight, run again (at least once, as any step cut short).
		batch := i+1 < len(order) && f.prefetch[t.name].err == nil && f.prefetch[order[i+1].name].err == nil
		res, stop, err := x.stepInFrame(ctx, f, t, pending, batch)
		if stop || err != nil {
			f.prefetch = nil
			return res, true, true, err
		}
	}
	return nil, true, false, nil
}

// freed returns the steps that may start now beside those in flight: ready
// (their dependencies done), waveable, not done, not in flight, in the
// definition's order, up to the bound with those in flight; with their
// arguments. A step whose arguments cannot be resolved is left to run
// alone (runStep fails it).
func (x *execution) freed(f *frame, inflight map[string]bool) ([]*stepDef, []Raw) {
	var next []*stepDef
	var args []Raw
	for _, t := range f.def.order {
		if len(inflight)+len(next) >= f.def.maxConc {
			break
		}
		if _, done := f.st.Steps[t.name]; done || inflight[t.name] || !waveable(t) || !f.depsDone(t) {
			continue
		}
		a, err := resolveArgs(f.def, t, f.st)
		if err != nil {
			continue
		}
		next, args = append(next, t), append(args, a)
	}
	return next, args
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
