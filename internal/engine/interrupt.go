package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/store"
)

// Interrupts: a step that waits for the outside world. The run saves itself
// paused and leaves its worker; a payload given to Continue (by run id and
// step) or ContinueByCorrelation (by the id the step computed) is recorded
// with the run, compare-and-set, and wakes the run on a worker, which
// validates it and makes it the step's result. A timeout is a scheduled
// wake-up that fires once; the deadline is the Redis server's time.
//
// The record of the interrupt lives in the run's state hash beside the
// fenced write's fields (store/lua/interrupt.lua), so a continue needs no
// lock and expires with the run. A correlation id is a claim of its own,
// in its own slot (keys.Corr), kept consistent with the run by a protocol:
// claim it, record the interrupt with the run, release it on failure; a
// claim whose interrupt no longer waits is stale and may be taken over.

// InterruptConfig describes an interrupt step: its arguments decode into In
// (they feed Correlation and Default), and its payloads into P.
type InterruptConfig[In, P any] struct {
	// Args binds the step's arguments.
	Args Bindings
	// After lists steps that must complete first, beyond those Args refer to.
	After []string
	// Correlation computes the id an outside party continues the run by
	// (ContinueByCorrelation): an order number, a payment intent. Two live
	// interrupts cannot hold one id: the second fails its step with a
	// *CorrelationTakenError. Default: none (Continue by run id only).
	Correlation func(in In) (string, error)
	// Validate checks a payload after it decoded into P (JSON, unknown
	// fields ignored). A refused payload is not taken: the run stays
	// paused and the sender is told why (Continue's *PayloadError when the
	// caller's engine has the definition, else the run records it, see
	// Engine.Interrupt). Default: decoding is the only check.
	Validate func(p P) error
	// Timeout bounds the wait, from the pause on the Redis server's clock.
	// When it passes with payloads missing, the step fails with an
	// *InterruptTimeoutError (the run rolls back) or, with Default, takes
	// Default's payload instead. Default: no timeout.
	Timeout time.Duration
	// Default is the payload a timed-out interrupt takes in place of each
	// one missing: the declared path for "no answer in time". Default:
	// none (a timeout fails the step).
	Default func(in In) (P, error)
	// Accepts is how many payloads the interrupt takes before the run goes
	// on (several approvers). The step's result is the payload, a P, when
	// it takes one, and a []P in arrival order when it takes more.
	// Default 1.
	Accepts int
	// Undo reverses what taking the payloads meant, when the run rolls
	// back after this step: it receives the step's arguments and the
	// payloads it took (one for Accepts 1). Default: none; an interrupt
	// changes nothing by itself, and is not on the undo stack.
	Undo func(ctx context.Context, in In, payloads []P) error
}

// interruptDef is an interrupt step's declaration, encoded.
type interruptDef struct {
	corr    func(args Raw) (string, error)
	check   func(payload []byte) (P Raw, err error) // decode, validate, encode
	deflt   func(args Raw) (Raw, error)             // nil: a timeout fails
	many    func(ps []Raw) (Raw, error)             // the []P result of Accepts > 1
	accepts int
	timeout time.Duration
	// payloadType names P, and example is P's zero value as JSON: what the
	// dashboard shows as the expected payload.
	payloadType string
	example     json.RawMessage
}

// Interrupt declares an interrupt step (see InterruptConfig).
func Interrupt[In, P any](name string, cfg InterruptConfig[In, P]) Part {
	return partFunc(func(d *Definition) error {
		if err := checkBindings(d.name, name, reflect.TypeFor[In](), cfg.Args); err != nil {
			return err
		}
		switch {
		case cfg.Accepts < 0:
			return &DefinitionError{Reactor: d.name, Step: name, Reason: fmt.Sprintf("Accepts is %d; an interrupt takes at least one payload", cfg.Accepts)}
		case cfg.Timeout < 0:
			return &DefinitionError{Reactor: d.name, Step: name, Reason: "Timeout is negative"}
		case cfg.Default != nil && cfg.Timeout == 0:
			return &DefinitionError{Reactor: d.name, Step: name, Reason: "Default is the payload of a timed-out interrupt, and the interrupt has no Timeout"}
		case cfg.Accepts > maxAccepts:
			return &DefinitionError{Reactor: d.name, Step: name, Reason: fmt.Sprintf("Accepts is %d, over %d", cfg.Accepts, maxAccepts)}
		}
		accepts := max(1, cfg.Accepts)
		pt := reflect.TypeFor[P]()
		example, _ := json.Marshal(*new(P))
		id := &interruptDef{accepts: accepts, timeout: cfg.Timeout, payloadType: typeName(pt), example: example}
		id.check = func(data []byte) (Raw, error) {
			var p P
			if err := json.Unmarshal(data, &p); err != nil {
				return nil, fmt.Errorf("the payload does not decode into %s: %w", typeName(pt), err)
			}
			if cfg.Validate != nil {
				if err := cfg.Validate(p); err != nil {
					return nil, err
				}
			}
			return codec.Marshal(p)
		}
		if cfg.Correlation != nil {
			id.corr = func(raw Raw) (string, error) {
				in, err := decodeIn[In](raw)
				if err != nil {
					return "", argsError(name, raw, reflect.TypeFor[In](), err)
				}
				return cfg.Correlation(in)
			}
		}
		if cfg.Default != nil {
			id.deflt = func(raw Raw) (Raw, error) {
				in, err := decodeIn[In](raw)
				if err != nil {
					return nil, argsError(name, raw, reflect.TypeFor[In](), err)
				}
				p, err := cfg.Default(in)
				if err != nil {
					return nil, err
				}
				return codec.Marshal(p)
			}
		}
		outType := pt
		if accepts > 1 {
			outType = reflect.SliceOf(pt)
			id.many = func(ps []Raw) (Raw, error) {
				out := make([]P, len(ps))
				for i, raw := range ps {
					if err := codec.Unmarshal(raw, &out[i]); err != nil {
						return nil, err
					}
				}
				return codec.Marshal(out)
			}
		}
		s := &stepDef{name: name, kind: kindInterrupt, args: cfg.Args, after: cfg.After, intr: id,
			inType: reflect.TypeFor[In](), outType: outType}
		if cfg.Undo != nil {
			s.undo = func(ctx context.Context, raw, result Raw) error {
				in, err := decodeIn[In](raw)
				if err != nil {
					return argsError(name, raw, reflect.TypeFor[In](), err)
				}
				var ps []P
				if accepts > 1 {
					err = codec.Unmarshal(result, &ps)
				} else {
					ps = make([]P, 1)
					err = codec.Unmarshal(result, &ps[0])
				}
				if err != nil {
					return fmt.Errorf("reactor: decode the payloads of step %q: %w", name, err)
				}
				return cfg.Undo(ctx, in, ps)
			}
		}
		return d.addStep(s)
	})
}

// maxAccepts bounds Accepts: every payload is a field of the run's hash.
const maxAccepts = 1000

// pauseRec is the interrupt a run waits on, saved with the paused state.
type pauseRec struct {
	// Path is the interrupt step's path ("approve", "book/approve").
	Path string `msgpack:"p"`
	// N is the pause's number within the run (runState.Pauses).
	N        int    `msgpack:"n"`
	Corr     string `msgpack:"c,omitempty"`
	Accepts  int    `msgpack:"a"`
	Since    int64  `msgpack:"s"`            // server time of the pause, ms
	Deadline int64  `msgpack:"d,omitempty"`  // server time, ms; 0: none
	Timers   int    `msgpack:"tm,omitempty"` // timer wake-ups enqueued
}

func (p *pauseRec) key() store.Interrupt { return store.Interrupt{Path: p.Path, Instance: p.N} }

// corrHolder is what a correlation claim names.
func corrHolder(runID string, p *pauseRec) string {
	return runID + "\t" + p.Path + "\t" + strconv.Itoa(p.N)
}

func parseHolder(v string) (runID, path string, n int, ok bool) {
	parts := strings.Split(v, "\t")
	if len(parts) != 3 {
		return "", "", 0, false
	}
	n, err := strconv.Atoi(parts[2])
	return parts[0], parts[1], n, err == nil
}

// errPause unwinds an execution that paused at an interrupt: everything is
// saved; conclude releases the lock and schedules the timer, if any.
type errPause struct {
	timer *Wake // nil: none to enqueue
}

func (e *errPause) Error() string { return "reactor: run paused at an interrupt" }

// timerWake is the wake-up that fires when p's deadline passes (now is the
// server's time, ms).
func (x *execution) timerWake(p *pauseRec, now int64) *Wake {
	if p.Deadline == 0 || x.e.cfg.Enqueuer == nil {
		return nil
	}
	p.Timers++
	w := &Wake{ID: wakeID(x.st.ID, fmt.Sprintf("timeout:%s:%d:%d", p.Path, p.N, p.Timers)), RunID: x.st.ID,
		Reactor: x.st.Reactor, Queue: x.st.Queue, Delay: time.Duration(max(0, p.Deadline-now)) * time.Millisecond,
		Element: x.element}
	x.st.Wake = w.ID
	return w
}

// corrGrace is how long a correlation claim outlives its interrupt's
// deadline, and the least a retired claim is kept.
const corrGrace = time.Hour

// runInterrupt runs interrupt step s of frame f: it pauses the run the
// first time, and on a resume takes the payloads, times out, or pauses on.
func (x *execution) runInterrupt(ctx context.Context, f *frame, s *stepDef, args Raw) (stepOutcome, error) {
	path := f.path + s.name
	p := x.st.Pause
	if p == nil || p.Path != path {
		return x.pause(ctx, f, s, args)
	}
	in := p.key()
	rec, err := x.e.store.ReadInterrupt(ctx, x.target, x.lease.Token(), in)
	if errors.Is(err, store.ErrLockNotHeld) {
		return stepOutcome{}, ErrLockLost
	}
	if errors.Is(err, store.ErrInterruptMoved) {
		// The record names another interrupt (a state written by a
		// process that paused again after this one read it cannot be:
		// the lock fences it). Pause afresh.
		x.st.Pause = nil
		return x.pause(ctx, f, s, args)
	}
	if err != nil {
		return stepOutcome{}, err
	}
	x.observeClock(rec.Now)
	switch rec.State {
	case store.InterruptClosed:
		return stepOutcome{kind: outCancel, failure: newCancelFailure("cancelled on request")}, nil
	case store.InterruptTimedOut:
		return x.interruptTimedOut(ctx, f, s, args, p, rec)
	}
	if rec.Received < rec.Accepts {
		// Still waiting (a sweep, a refused payload's wake-up, a timer
		// that came early: asynq schedules at whole seconds). A cancel
		// requested while this process held the run is acted on now: no
		// write of this execution would see it (Cancel wakes the run
		// again for one that lands after this read).
		if cancel, err := x.cancelRequested(ctx); err != nil {
			return stepOutcome{}, err
		} else if cancel {
			return stepOutcome{kind: outCancel, failure: newCancelFailure("cancelled on request")}, nil
		}
		var timer *Wake
		if p.Deadline > 0 && p.Deadline-rec.Now <= timerSlack.Milliseconds() {
			timer = x.timerWake(p, rec.Now)
			if err := x.checkpoint(ctx); err != nil {
				return stepOutcome{}, err
			}
		}
		return stepOutcome{}, &errPause{timer: timer}
	}
	// Every payload is in: take them, each checked against the step's
	// payload type as this process's definition has it.
	vals := make([]Raw, 0, len(rec.Payloads))
	for k := len(rec.Payloads); k >= 1; k-- {
		v, cerr := s.intr.check(rec.Payloads[k-1].Data)
		if cerr == nil {
			vals = append(vals, v)
			continue
		}
		why := cerr.Error()
		if _, err := x.e.store.RefusePayload(ctx, x.target, x.lease.Token(), in, k, why); err != nil {
			if errors.Is(err, store.ErrLockNotHeld) {
				return stepOutcome{}, ErrLockLost
			}
			return stepOutcome{}, err
		}
		x.audit(auditRec{kind: AuditPayloadRefused, step: path, attempt: k, message: why})
		x.emit(ctx, Event{Kind: EventPayloadRefused, RunID: x.st.ID, Reactor: f.def.name, Step: path, Err: &PayloadError{RunID: x.st.ID, Step: path, Err: cerr}})
	}
	if len(vals) < rec.Accepts {
		// Refused ones went: the run waits on for their replacements (the
		// timer, if any, is still scheduled). The refusals' audit entries
		// ride on this write.
		if err := x.checkpoint(ctx); err != nil {
			return stepOutcome{}, err
		}
		return stepOutcome{}, &errPause{}
	}
	for i, j := 0, len(vals)-1; i < j; i, j = i+1, j-1 {
		vals[i], vals[j] = vals[j], vals[i] // arrival order
	}
	if err := x.e.store.AdoptInterrupt(ctx, x.target, x.lease.Token(), in); err != nil {
		if errors.Is(err, store.ErrLockNotHeld) {
			return stepOutcome{}, ErrLockLost
		}
		return stepOutcome{}, err
	}
	val := vals[0]
	if s.intr.many != nil {
		if val, err = s.intr.many(vals); err != nil {
			err = Permanent(fmt.Errorf("reactor: step %q: encode its payloads: %w", path, err))
			return stepOutcome{kind: outFail, failure: newFailure(path, err), err: err}, nil
		}
	}
	x.emit(ctx, Event{Kind: EventRunContinued, RunID: x.st.ID, Reactor: f.def.name, Step: path,
		Duration: time.Duration(max(0, rec.Now-p.Since)) * time.Millisecond})
	return x.interruptTook(ctx, f, s, args, p, val), nil
}

// timerSlack is how early a timer may fire and still be taken for its
// deadline's: asynq schedules to the whole second, goreactor rounds up.
const timerSlack = 2 * time.Second

// interruptTook records that interrupt s took val as its result.
func (x *execution) interruptTook(ctx context.Context, f *frame, s *stepDef, args Raw, p *pauseRec, val Raw) stepOutcome {
	x.endPause(ctx, p, true)
	f.st.Steps[s.name] = &stepRec{State: stepDone, Value: val, Attempts: 1}
	if s.undo != nil {
		f.st.Seq++
		f.st.Ledger = append(f.st.Ledger, &LedgerEntry{Ordinal: f.st.Seq, Step: s.name, Args: args, Result: val, Status: RollbackPending,
			At: x.stamp(ctx, f.def)})
	}
	x.emit(ctx, Event{Kind: EventStepCompleted, RunID: x.st.ID, Reactor: f.def.name, Step: f.path + s.name, Attempt: 1})
	return stepOutcome{kind: outOK}
}

// interruptTimedOut ends interrupt s whose deadline passed short of
// payloads: with the declared default, or failing the step.
func (x *execution) interruptTimedOut(ctx context.Context, f *frame, s *stepDef, args Raw, p *pauseRec, rec store.InterruptRecord) (stepOutcome, error) {
	path := f.path + s.name
	x.audit(auditRec{kind: AuditInterruptTimedOut, step: path, attempt: rec.Received})
	x.emit(ctx, Event{Kind: EventInterruptTimedOut, RunID: x.st.ID, Reactor: f.def.name, Step: path, Status: x.st.Status})
	if s.intr.deflt != nil {
		d, err := s.intr.deflt(args)
		if err == nil {
			vals := make([]Raw, 0, rec.Accepts)
			for _, pl := range rec.Payloads {
				if v, cerr := s.intr.check(pl.Data); cerr == nil {
					vals = append(vals, v)
				}
			}
			for len(vals) < rec.Accepts {
				vals = append(vals, d)
			}
			val := vals[0]
			if s.intr.many != nil {
				val, err = s.intr.many(vals)
			}
			if err == nil {
				return x.interruptTook(ctx, f, s, args, p, val), nil
			}
		}
		x.endPause(ctx, p, false)
		err = Permanent(fmt.Errorf("reactor: step %q: its timeout's Default: %w", path, err))
		return stepOutcome{kind: outFail, failure: newFailure(path, err), err: err}, nil
	}
	x.endPause(ctx, p, false)
	err := Permanent(&InterruptTimeoutError{Step: path, Timeout: time.Duration(p.Deadline-p.Since) * time.Millisecond,
		Received: rec.Received, Accepts: rec.Accepts})
	return stepOutcome{kind: outFail, failure: newFailure(path, err), err: err}, nil
}

// endPause clears the run's pause and lets its correlation claim go: kept
// a while (retired) when the interrupt took its payloads, so that a late
// duplicate is told so, else released. A failure only leaves a claim that
// the next claimant finds stale.
func (x *execution) endPause(ctx context.Context, p *pauseRec, took bool) {
	x.st.Pause = nil
	if x.st.Status == StatusPaused {
		x.st.Status = StatusRunning
	}
	if p.Corr == "" {
		return
	}
	bg := context.WithoutCancel(ctx)
	var err error
	if took {
		err = x.e.store.RetireCorrelation(bg, p.Corr, corrHolder(x.st.ID, p), max(corrGrace, x.e.cfg.Retention))
	} else {
		err = x.e.store.ReleaseCorrelation(bg, p.Corr, corrHolder(x.st.ID, p))
	}
	if err != nil {
		x.e.log.Debug("correlation claim not released; the next claimant finds it stale", "event", "reactor.interrupt.corr_release",
			"run", x.st.ID, "correlation", p.Corr, "error", err)
	}
}

// closePause ends the run's pause when it rolls back or is cancelled: a
// continue that comes later is told the run no longer waits.
func (x *execution) closePause(ctx context.Context) error {
	p := x.st.Pause
	if p == nil {
		return nil
	}
	if err := x.e.store.CloseInterrupt(ctx, x.target, x.lease.Token(), p.key()); err != nil {
		if errors.Is(err, store.ErrLockNotHeld) {
			return ErrLockLost
		}
		return err
	}
	x.endPause(ctx, p, false)
	return nil
}

// pause opens interrupt s: claims its correlation id, records the
// interrupt with the run, and saves the run paused.
func (x *execution) pause(ctx context.Context, f *frame, s *stepDef, args Raw) (stepOutcome, error) {
	path := f.path + s.name
	fail := func(err error) (stepOutcome, error) {
		err = Permanent(err)
		x.emit(ctx, Event{Kind: EventStepFailed, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: 1, Err: err})
		return stepOutcome{kind: outFail, failure: newFailure(path, err), err: err}, nil
	}
	x.st.Pauses++
	p := &pauseRec{Path: path, N: x.st.Pauses, Accepts: s.intr.accepts}
	if s.intr.corr != nil {
		id, err := s.intr.corr(args)
		if err == nil && id == "" {
			err = errors.New("it is empty")
		}
		if err == nil {
			err = keys.ValidateID(id)
		}
		if err != nil {
			return fail(fmt.Errorf("reactor: step %q: correlation id: %w", path, err))
		}
		p.Corr = id
		if err := x.claimCorrelation(ctx, p, s.intr.timeout); err != nil {
			var taken *CorrelationTakenError
			if errors.As(err, &taken) {
				return fail(err)
			}
			return stepOutcome{}, err
		}
	}
	deadline, now, err := x.e.store.OpenInterrupt(ctx, x.target, x.lease.Token(), p.key(), p.Accepts, s.intr.timeout)
	if err != nil {
		x.releaseClaim(ctx, p)
		if errors.Is(err, store.ErrLockNotHeld) {
			return stepOutcome{}, ErrLockLost
		}
		return stepOutcome{}, err
	}
	x.observeClock(now)
	p.Since, p.Deadline = now, deadline
	x.st.Pause = p
	x.st.Status = StatusPaused
	timer := x.timerWake(p, now)
	x.audit(auditRec{kind: AuditPaused, step: path, attempt: p.Accepts})
	if err := x.checkpoint(ctx); err != nil {
		// Not saved paused: the claim goes, the record stays for the
		// process that owns the run now (it opens the same interrupt, or
		// another, which replaces it).
		x.releaseClaim(ctx, p)
		return stepOutcome{}, err
	}
	if x.cancel {
		if err := x.closePause(ctx); err != nil {
			return stepOutcome{}, err
		}
		return stepOutcome{kind: outCancel, failure: newCancelFailure("cancelled on request")}, nil
	}
	x.emit(ctx, Event{Kind: EventRunPaused, RunID: x.st.ID, Reactor: f.def.name, Step: path, Status: StatusPaused})
	return stepOutcome{}, &errPause{timer: timer}
}

func (x *execution) releaseClaim(ctx context.Context, p *pauseRec) {
	if p.Corr != "" {
		_ = x.e.store.ReleaseCorrelation(context.WithoutCancel(ctx), p.Corr, corrHolder(x.st.ID, p))
	}
}

// claimCorrelation takes p's correlation id for this run, taking over a
// claim whose interrupt no longer waits.
func (x *execution) claimCorrelation(ctx context.Context, p *pauseRec, timeout time.Duration) error {
	var ttl time.Duration
	if timeout > 0 {
		ttl = timeout + corrGrace
	}
	me := corrHolder(x.st.ID, p)
	stale := ""
	for range 3 {
		holder, err := x.e.store.ClaimCorrelation(ctx, p.Corr, me, stale, ttl)
		if err != nil || holder == "" {
			return err
		}
		live, err := x.e.holderWaits(ctx, holder)
		if err != nil {
			return err
		}
		if live {
			run, step, _, _ := parseHolder(holder)
			return &CorrelationTakenError{ID: p.Corr, RunID: run, Step: step}
		}
		stale = holder
	}
	return fmt.Errorf("reactor: correlation id %q: its claim kept changing hands; try again", p.Corr)
}

// holderWaits reports whether the interrupt a correlation claim names still
// waits (or holds payloads its run has not taken yet).
func (e *Engine) holderWaits(ctx context.Context, holder string) (bool, error) {
	run, path, n, ok := parseHolder(holder)
	if !ok || validateRunID(run) != nil {
		return false, nil
	}
	t, err := e.interruptTarget(ctx, run)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	r, err := e.cfg.Client.HMGet(ctx, t.State, "iw", "ii", "is", "fin").Result()
	if err != nil {
		return false, fmt.Errorf("reactor: read the holder of a correlation id: %w", err)
	}
	str := func(v any) string { s, _ := v.(string); return s }
	return str(r[0]) == path && str(r[1]) == strconv.Itoa(n) && str(r[2]) == store.InterruptWaiting && str(r[3]) != "1", nil
}

// ---- continuing

// Continuation is what Continue recorded.
type Continuation struct {
	RunID string
	// Step is the interrupt step's path.
	Step string
	// At is the Redis server's time the payload was recorded.
	At time.Time
	// Received and Accepts count the interrupt's payloads, this one
	// included, and how many it takes.
	Received, Accepts int
	// Woken is true when this payload was the last one the interrupt
	// waited for and the run was handed to a worker to go on. Without an
	// Enqueuer nothing is woken: call Resume.
	Woken bool
	// Checked is true when this process validated the payload against
	// the run's definition before recording it. An engine without the
	// definition (a script, the dashboard) records it unchecked; the
	// worker checks it and, if it refuses it, the run stays paused with
	// the refusal on record (Engine.Interrupt).
	Checked bool
}

// ContinueOption configures a Continue.
type ContinueOption func(*continueOptions)

type continueOptions struct{ by string }

// ContinueBy names who sent the payload (an operator, a partner's webhook):
// recorded with it and on the run's audit stream.
func ContinueBy(sender string) ContinueOption {
	return func(o *continueOptions) { o.by = sender }
}

// Continue gives the run paused at interrupt step (its path: "approve", or
// "book/approve" inside a composed child) a payload. It is taken exactly
// once: the interrupt's payloads are counted by compare-and-set, a payload
// past the last it accepts returns an *AlreadyContinuedError (with when the
// first came), and one after its timeout or cancel is refused. It needs no
// lock: a payload for a run another process holds is recorded, and the run
// goes on when its worker gets it. The payload is JSON-encoded (a
// json.RawMessage or []byte is taken as JSON already) and, when this engine
// has the run's definition, checked against the step's payload type first:
// a *PayloadError then says why, and nothing is recorded.
func (e *Engine) Continue(ctx context.Context, runID, step string, payload any, opts ...ContinueOption) (*Continuation, error) {
	if err := validateRunID(runID); err != nil {
		return nil, err
	}
	if step == "" {
		return nil, errors.New("reactor: continue: name the interrupt step")
	}
	return e.continueAt(ctx, runID, step, 0, payload, opts)
}

// ContinueByCorrelation is Continue for the interrupt that claimed
// correlation id id (InterruptConfig.Correlation). No interrupt holding it
// is ErrNoCorrelation; a duplicate after the run took its payload is an
// *AlreadyContinuedError for a while (the longer of an hour and
// Config.Retention).
func (e *Engine) ContinueByCorrelation(ctx context.Context, id string, payload any, opts ...ContinueOption) (*Continuation, error) {
	if err := keys.ValidateID(id); err != nil {
		return nil, fmt.Errorf("reactor: correlation id: %w", err)
	}
	holder, err := e.store.CorrelationHolder(ctx, id)
	if err != nil {
		return nil, err
	}
	run, path, n, ok := parseHolder(holder)
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNoCorrelation, id)
	}
	c, err := e.continueAt(ctx, run, path, n, payload, opts)
	var ce *ContinueError
	if errors.As(err, &ce) && errors.Is(ce.Err, ErrNotPaused) {
		// A claim left by a run that no longer waits there.
		return nil, fmt.Errorf("%w: %q (its claim names run %s, which no longer waits at %s)", ErrNoCorrelation, id, run, path)
	}
	return c, err
}

func encodePayload(payload any) ([]byte, error) {
	var data []byte
	switch p := payload.(type) {
	case json.RawMessage:
		data = p
	case []byte:
		data = p
	default:
		b, err := json.Marshal(payload)
		if err != nil {
			return nil, fmt.Errorf("reactor: continue: encode the payload: %w", err)
		}
		return b, nil
	}
	if !json.Valid(data) {
		return nil, errors.New("reactor: continue: the payload is not valid JSON")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return nil, fmt.Errorf("reactor: continue: %w", err)
	}
	return buf.Bytes(), nil
}

// maxPayload bounds a payload's encoding.
const maxPayload = 1 << 20

func (e *Engine) continueAt(ctx context.Context, runID, path string, instance int, payload any, opts []ContinueOption) (*Continuation, error) {
	var o continueOptions
	for _, opt := range opts {
		opt(&o)
	}
	data, err := encodePayload(payload)
	if err != nil {
		return nil, err
	}
	if len(data) > maxPayload {
		return nil, fmt.Errorf("reactor: continue: the payload is %d bytes, over %d", len(data), maxPayload)
	}
	st, t, err := e.loadInterrupted(ctx, runID)
	if err != nil {
		return nil, err
	}
	cerr := func(why string, sentinel error) error {
		return &ContinueError{RunID: runID, Step: path, Status: st.Status, Reason: why, Err: sentinel}
	}
	checked := false
	reactor := st.Reactor // the reactor whose step it is: a composed child's, inside one
	if def, derr := e.lookupRun(st); derr == nil {
		reactor = def.ownerOf(path).name
		s := def.stepAt(path)
		if s == nil || s.intr == nil {
			return nil, cerr("its definition has no interrupt step by that path", ErrNotPaused)
		}
		if _, verr := s.intr.check(data); verr != nil {
			return nil, &PayloadError{RunID: runID, Step: path, Err: verr}
		}
		checked = true
	}
	rep, err := e.store.ContinueInterrupt(ctx, t, path, instance, data, o.by, HashMessage(string(data)), st.Trace)
	if err != nil {
		return nil, err
	}
	switch rep.Outcome {
	case store.ContinueGone:
		return nil, fmt.Errorf("%w: %s", ErrNotFound, runID)
	case store.ContinueFinished:
		return nil, cerr("the run has finished", ErrAlreadyFinished)
	case store.ContinueNotPaused:
		if st.Pause != nil && st.Pause.Path != path {
			return nil, cerr("it waits at step "+st.Pause.Path, ErrNotPaused)
		}
		return nil, cerr("it waits at no interrupt", ErrNotPaused)
	case store.ContinueAlready:
		return nil, &AlreadyContinuedError{RunID: runID, Step: path, At: msTime(rep.At)}
	case store.ContinueTimedOut:
		return nil, cerr(fmt.Sprintf("its interrupt timed out at %s", msTime(rep.At).UTC().Format(time.RFC3339)), ErrInterruptTimedOut)
	case store.ContinueClosed:
		return nil, cerr("its interrupt was closed: the run is cancelled or rolling back", ErrNotPaused)
	case store.ContinueOK:
	default:
		return nil, fmt.Errorf("reactor: continue: unexpected reply %q", rep.Outcome)
	}
	c := &Continuation{RunID: runID, Step: path, At: msTime(rep.At), Received: rep.Received, Accepts: rep.Accepts, Checked: checked}
	e.emit(ctx, Event{Kind: EventPayloadReceived, RunID: runID, Reactor: reactor, Step: path, TraceID: st.Trace, Element: st.Elem != nil})
	if rep.Received < rep.Accepts || e.cfg.Enqueuer == nil {
		return c, nil
	}
	// One id per fill: after a refusal the interrupt fills again, and its
	// wake-up must not share an id with a delivery that may still be active.
	w := Wake{ID: wakeID(runID, fmt.Sprintf("continue:%s:%d:%d", path, rep.Instance, rep.Fills)), RunID: runID, Reactor: st.Reactor, Queue: st.Queue,
		Element: st.Elem != nil}
	if err := e.cfg.Enqueuer.Enqueue(ctx, w); err != nil {
		// Recorded: the run sweeper wakes a paused run whose interrupt
		// holds every payload it waits for.
		return c, fmt.Errorf("reactor: continue run %s: the payload is recorded, but waking the run failed (the run sweeper will): %w", runID, err)
	}
	c.Woken = true
	return c, nil
}

// loadInterrupted reads run id, a root run or a map element's run (which
// lives in its map's keys), and returns it with its keys.
func (e *Engine) loadInterrupted(ctx context.Context, id string) (*runState, store.Target, error) {
	if err := validateRunID(id); err != nil {
		return nil, store.Target{}, err
	}
	t, err := e.interruptTarget(ctx, id)
	if err != nil {
		return nil, t, err
	}
	snap, err := e.store.Load(ctx, t)
	if errors.Is(err, store.ErrNotFound) {
		return nil, t, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, t, err
	}
	st, err := decodeState(snap.Data)
	return st, t, err
}

// interruptTarget is where run id's state lives: its own keys for a root
// run, its map's for an element run ("<map>.<i>", when no root run has
// that id).
func (e *Engine) interruptTarget(ctx context.Context, id string) (store.Target, error) {
	t := e.store.RunTarget(id)
	if _, _, isElem := keys.SplitElementID(id); !isElem {
		return t, nil
	}
	n, err := e.cfg.Client.Exists(ctx, t.State).Result()
	if err != nil {
		return t, fmt.Errorf("reactor: read run %s: %w", id, err)
	}
	if n == 1 {
		return t, nil
	}
	return e.store.ElemTarget(id), nil
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// ownerOf returns the definition that declares the step at path: d, or the
// composed child path goes through.
func (d *Definition) ownerOf(path string) *Definition {
	def := d
	for {
		name, rest, nested := strings.Cut(path, "/")
		s, ok := def.byName[name]
		if !nested || !ok || s.child == nil {
			return def
		}
		def, path = s.child, rest
	}
}

// stepAt returns the step at path ("approve", "book/approve"), or nil.
func (d *Definition) stepAt(path string) *stepDef {
	def := d
	for {
		name, rest, nested := strings.Cut(path, "/")
		s, ok := def.byName[name]
		if !ok {
			return nil
		}
		if !nested {
			return s
		}
		if s.child == nil {
			return nil
		}
		def, path = s.child, rest
	}
}

// ---- reading

// Pause is the interrupt a paused run waits at (Run.Paused).
type Pause struct {
	// Step is the interrupt step's path ("approve", "book/approve").
	Step string
	// Correlation is the id it claimed ("" for none).
	Correlation string
	// Since is when the run paused; Deadline when the interrupt times
	// out (zero: never). Both are the Redis server's times.
	Since, Deadline time.Time
	// Accepts is how many payloads it takes.
	Accepts int
}

// InterruptInfo is a paused run's interrupt, as Engine.Interrupt reads it.
type InterruptInfo struct {
	RunID, Reactor string
	// Step is the interrupt step's path.
	Step string
	// Correlation is the id it claimed ("" for none).
	Correlation string
	// Since is when the run paused; Deadline when it times out (zero:
	// never).
	Since, Deadline time.Time
	// Accepts is how many payloads it takes; Received how many it holds.
	Accepts, Received int
	// Payloads are the payloads it holds, with when and from whom.
	Payloads []ReceivedPayload
	// PayloadType names the payload's Go type, and Example is its zero
	// value as JSON: the shape a sender fills in. Empty when this engine
	// does not have the run's definition.
	PayloadType string
	Example     json.RawMessage
	// Refused is why the last payload the run refused was refused, and
	// RefusedAt when ("" and zero: none).
	Refused   string
	RefusedAt time.Time
}

// ReceivedPayload is one payload an interrupt holds.
type ReceivedPayload struct {
	Payload json.RawMessage
	At      time.Time
	By      string
}

// Interrupt reads the interrupt run id waits at. A run that is not paused
// is a *ContinueError wrapping ErrNotPaused.
func (e *Engine) Interrupt(ctx context.Context, id string) (*InterruptInfo, error) {
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	t, err := e.interruptTarget(ctx, id)
	if err != nil {
		return nil, err
	}
	// The state and the interrupt's record in one read.
	f, err := e.store.InterruptFields(ctx, t)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	st, err := decodeState([]byte(f["d"]))
	if err != nil {
		return nil, err
	}
	p := st.Pause
	if p == nil {
		return nil, &ContinueError{RunID: id, Status: st.Status, Reason: "it waits at no interrupt", Err: ErrNotPaused}
	}
	info := &InterruptInfo{RunID: id, Reactor: st.Reactor, Step: p.Path, Correlation: p.Corr, Since: msTime(p.Since),
		Deadline: msTime(p.Deadline), Accepts: p.Accepts}
	if f["iw"] == p.Path && f["ii"] == strconv.Itoa(p.N) {
		info.Received, _ = strconv.Atoi(f["in"])
		for k := 1; k <= info.Received; k++ {
			ks := strconv.Itoa(k)
			at, _ := strconv.ParseInt(f["it"+ks], 10, 64)
			info.Payloads = append(info.Payloads, ReceivedPayload{Payload: json.RawMessage(f["ip"+ks]), At: msTime(at), By: f["iby"+ks]})
		}
		info.Refused = f["irf"]
		at, _ := strconv.ParseInt(f["irt"], 10, 64)
		info.RefusedAt = msTime(at)
	}
	if def, derr := e.lookupRun(st); derr == nil {
		if s := def.stepAt(p.Path); s != nil && s.intr != nil {
			info.PayloadType, info.Example = s.intr.payloadType, s.intr.example
		}
	}
	return info, nil
}

// ---- errors

var (
	// ErrNotPaused: the run does not wait at the interrupt a Continue
	// named (it is running, waits at another step, or was cancelled).
	ErrNotPaused = errors.New("reactor: the run is not paused at that step")
	// ErrAlreadyContinued: the interrupt took every payload it accepts
	// (see *AlreadyContinuedError).
	ErrAlreadyContinued = errors.New("reactor: already continued")
	// ErrInterruptTimedOut: the interrupt's timeout passed before the
	// payload came.
	ErrInterruptTimedOut = errors.New("reactor: the interrupt timed out")
	// ErrNoCorrelation: no waiting interrupt holds the correlation id.
	ErrNoCorrelation = errors.New("reactor: no paused run waits for correlation id")
	// ErrInterruptUnsupported: an interrupt where a run cannot pause (a
	// map element's run).
	ErrInterruptUnsupported = errors.New("reactor: an interrupt cannot pause here")
	// ErrCorrelationTaken: see *CorrelationTakenError.
	ErrCorrelationTaken = errors.New("reactor: correlation id taken")
)

func init() {
	builtinSentinel("reactor.interrupt_timed_out", ErrInterruptTimedOut)
	builtinSentinel("reactor.correlation_taken", ErrCorrelationTaken)
	builtinSentinel("reactor.interrupt_unsupported", ErrInterruptUnsupported)
}

// ContinueError is a Continue refused because of where the run is.
type ContinueError struct {
	RunID, Step string
	Status      Status
	Reason      string
	// Err is ErrNotPaused, ErrAlreadyFinished or ErrInterruptTimedOut.
	Err error
}

func (e *ContinueError) Error() string {
	at := ""
	if e.Step != "" {
		at = " at step " + e.Step
	}
	return fmt.Sprintf("reactor: continue run %s%s: the run is %s, and %s", e.RunID, at, e.Status, e.Reason)
}

func (e *ContinueError) Unwrap() error { return e.Err }

// AlreadyContinuedError is a Continue that came after the interrupt took
// every payload it accepts: At is when the first of them was recorded.
type AlreadyContinuedError struct {
	RunID, Step string
	At          time.Time
}

func (e *AlreadyContinuedError) Error() string {
	return fmt.Sprintf("reactor: run %s was already continued at step %s (first payload at %s)", e.RunID, e.Step, e.At.UTC().Format(time.RFC3339Nano))
}

func (e *AlreadyContinuedError) Unwrap() error { return ErrAlreadyContinued }

// PayloadError is a payload the interrupt step refused: it does not decode
// into the step's payload type, or its Validate refused it. The run stays
// paused.
type PayloadError struct {
	RunID, Step string
	Err         error
}

func (e *PayloadError) Error() string {
	return fmt.Sprintf("reactor: run %s, step %s: payload refused: %v", e.RunID, e.Step, e.Err)
}

func (e *PayloadError) Unwrap() error { return e.Err }

// CorrelationTakenError fails an interrupt step whose correlation id a live
// interrupt of another run holds.
type CorrelationTakenError struct {
	ID, RunID, Step string
}

func (e *CorrelationTakenError) Error() string {
	return fmt.Sprintf("reactor: correlation id %q is held by run %s, paused at step %s", e.ID, e.RunID, e.Step)
}

func (e *CorrelationTakenError) Unwrap() error { return ErrCorrelationTaken }

// InterruptTimeoutError fails an interrupt step whose timeout passed with
// payloads missing (and no Default).
type InterruptTimeoutError struct {
	Step              string
	Timeout           time.Duration
	Received, Accepts int
}

func (e *InterruptTimeoutError) Error() string {
	return fmt.Sprintf("reactor: step %q: no payload within %s (%d of %d received)", e.Step, e.Timeout, e.Received, e.Accepts)
}

func (e *InterruptTimeoutError) Unwrap() error { return ErrInterruptTimedOut }
