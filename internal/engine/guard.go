package engine

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/goreactor/goreactor/internal/codec"
)

// Guarded undo. A blind undo writes the old value back whatever is there
// now: if someone changed the record after the step, the undo destroys that
// change and reports success. A guarded step instead records the effect it
// had, {resource, before, after}, from its Run (RecordEffect), and its
// definition says how to read the resource (Probe) and how to put before
// back (Restore). The rollback then compares before it writes: it probes
// and fingerprints the resource (package fingerprint); at after, it
// restores and probes again to confirm; already at before, there is nothing
// to do; anything else is a conflict. A conflict is terminal: somebody else
// wrote, and no retry can make the comparison pass without clobbering them.
// The entry needs a person (needs_human), and every older entry on the same
// resource is blocked, not attempted, until the person resolves it
// (Engine.Resolve). The effect and its fingerprints are stored with the
// run's ledger, so a guarded undo survives restarts.

// Effect is a change a guarded step made to something outside the run.
type Effect struct {
	// Resource names what changed ("user:42/email"). Required. It is the
	// entry's resource (StepConfig.Resource): blocking and UndoSteps's
	// ordering rule go by it, within the run (a map element run is its own
	// scope).
	Resource string
	// Before is the resource's state before the step, as the step's
	// Guard's Probe would read it; Restore gets it back (encoded and
	// decoded into the guard's state type).
	Before any
	// After is the state the step left, as Probe would read it.
	After any
	// Label says what the change was, for the person who reads a report.
	Label string
}

// RestoreResult is what a Restore reports.
type RestoreResult string

// Restore results.
const (
	// RestoreWritten: Restore wrote before back unconditionally; the
	// rollback probes again to confirm.
	RestoreWritten RestoreResult = ""
	// RestoreApplied: the store compared and wrote atomically (compare
	// with after, then set before), and the write happened.
	RestoreApplied RestoreResult = "applied"
	// RestorePreconditionFailed: the store compared atomically and found
	// the resource no longer at after: nothing was written (a conflict).
	RestorePreconditionFailed RestoreResult = "precondition_failed"
)

// GuardConfig describes how a guarded step's resource is read and restored.
// S is the resource's state type: what Probe returns and Restore writes.
type GuardConfig[S any] struct {
	// Probe reads the resource's current state. Required.
	Probe func(ctx context.Context, resource string) (S, error)
	// Restore writes before back. Required. It is only ever called on a
	// resource Probe has just read at the effect's after state, and gets
	// that after state too, so that a store that can compare and write
	// atomically (compare with after, then set before) does, and reports
	// RestoreApplied or RestorePreconditionFailed. (after is S's zero
	// value for an effect recorded before Restore received it.)
	Restore func(ctx context.Context, resource string, before, after S) (RestoreResult, error)
	// Retry bounds the attempts of Probe and Restore that fail with a
	// Transient error (a dropped connection, a 503). Any other error
	// fails the undo (compensation_failed); a conflict is never retried,
	// whatever this says. Default: one attempt.
	Retry Retry
}

// Guard is a step's guarded undo (StepConfig.Guard), built by Guarded.
type Guard struct {
	stateType reflect.Type
	probe     func(ctx context.Context, resource string) (any, error)
	restore   func(ctx context.Context, resource string, before, after Raw) (RestoreResult, error)
	retry     Retry
}

// Guarded builds a step's Guard from its config.
func Guarded[S any](cfg GuardConfig[S]) *Guard {
	g := &Guard{stateType: reflect.TypeFor[S](), retry: cfg.Retry}
	if cfg.Probe != nil {
		g.probe = func(ctx context.Context, resource string) (any, error) { return cfg.Probe(ctx, resource) }
	}
	if cfg.Restore != nil {
		g.restore = func(ctx context.Context, resource string, before, after Raw) (RestoreResult, error) {
			var b, a S
			if err := codec.Unmarshal(before, &b); err != nil {
				return "", fmt.Errorf("reactor: decode the effect's before state into %s: %w", reflect.TypeFor[S](), err)
			}
			if len(after) > 0 {
				if err := codec.Unmarshal(after, &a); err != nil {
					return "", fmt.Errorf("reactor: decode the effect's after state into %s: %w", reflect.TypeFor[S](), err)
				}
			}
			return cfg.Restore(ctx, resource, b, a)
		}
	}
	return g
}

func (g *Guard) validate() error {
	switch {
	case g == nil:
		return nil
	case g.probe == nil:
		return errors.New("Guard needs a Probe")
	case g.restore == nil:
		return errors.New("Guard needs a Restore")
	}
	return nil
}

// Transient marks err as a passing failure of a Probe or Restore (the store
// was unreachable), which the guard's Retry retries. Transient(nil) is nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err: err}
}

// IsTransient reports whether err was marked with Transient.
func IsTransient(err error) bool {
	var t *transientError
	return errors.As(err, &t)
}

type transientError struct{ err error }

func (e *transientError) Error() string { return "transient: " + e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// Errors of RecordEffect.
var (
	// ErrNoOpEffect: the effect's before and after fingerprint alike. The
	// rollback could never tell an effect waiting to be reverted from one
	// already reverted, so it is refused when recorded.
	ErrNoOpEffect = errors.New("reactor: the effect's before and after states are the same; there is nothing to undo")
	// ErrNotGuarded: RecordEffect was called outside the Run of a step
	// with a Guard.
	ErrNotGuarded = errors.New("reactor: RecordEffect must be called from the Run of a step with a Guard")
	// ErrEffectRecorded: a step records one effect; split a step that
	// changes several resources into several steps.
	ErrEffectRecorded = errors.New("reactor: the step already recorded an effect (one per step: split the step)")
)

// EffectMismatchError refuses a verified effect (RecordVerifiedEffect)
// whose resource, read back at once, does not fingerprint as its After:
// Probe reads something other than what the effect describes (one field
// of a record described whole), and every rollback would conflict.
type EffectMismatchError struct {
	Resource string
	// After is the effect's after fingerprint; Probed the probe's.
	After, Probed string
}

func (e *EffectMismatchError) Error() string {
	return fmt.Sprintf("reactor: effect on %q refused: the resource reads back as %s, not as the effect's after state %s; "+
		"Probe must read exactly what Before and After describe", e.Resource, e.Probed, e.After)
}

// effectRec is a recorded effect as the ledger stores it.
type effectRec struct {
	Label string `msgpack:"l,omitempty"`
	// Before and After are the states, encoded, for Restore (After is nil
	// in effects recorded before Restore received it).
	Before Raw `msgpack:"b"`
	After  Raw `msgpack:"a,omitempty"`
	// BeforeFP and AfterFP are the fingerprints computed on the Go values
	// when the effect was recorded (a value decoded back could encode
	// otherwise: msgpack decodes integers by width).
	BeforeFP string `msgpack:"bf"`
	AfterFP  string `msgpack:"af"`
	// BeforeEnc and AfterEnc are the states' fingerprint encodings
	// (fingerprint.Encode), kept so that a report can show a person the
	// values, not only their fingerprints; nil in effects recorded before
	// they were kept, or whose encoding is over maxShownValue.
	BeforeEnc []byte `msgpack:"be,omitempty"`
	AfterEnc  []byte `msgpack:"ae,omitempty"`
}

// effectRecorder collects the effect a guarded step's Run records.
type effectRecorder struct {
	guard    *Guard
	mu       sync.Mutex
	resource string
	rec      *effectRec
}

type effectKey struct{}

// RecordEffect records the effect the step is having, from a guarded
// step's Run, usually just after making the change. It fingerprints Before
// and After at once and refuses, with an error the Run should return:
// values that cannot be fingerprinted unambiguously (*fingerprint.Error), a
// no-op effect (ErrNoOpEffect), a second effect (ErrEffectRecorded), and a
// call outside a guarded step's Run (ErrNotGuarded). The effect is stored
// with the step's ledger entry when the step completes.
func RecordEffect(ctx context.Context, e Effect) error {
	return recordEffect(ctx, e, false)
}

// RecordVerifiedEffect is RecordEffect that reads the resource back at once
// with the guard's Probe and refuses the effect (*EffectMismatchError) when
// the reading does not fingerprint as After: the mistake surfaces when it
// is made, not at the first rollback.
func RecordVerifiedEffect(ctx context.Context, e Effect) error {
	return recordEffect(ctx, e, true)
}

func recordEffect(ctx context.Context, e Effect, verify bool) error {
	r, _ := ctx.Value(effectKey{}).(*effectRecorder)
	if r == nil {
		return ErrNotGuarded
	}
	if e.Resource == "" {
		return errors.New("reactor: RecordEffect: the effect's Resource is empty")
	}
	before, beforeEnc, err := fingerprintOf(e.Before)
	if err != nil {
		return fmt.Errorf("reactor: RecordEffect on %q: before: %w", e.Resource, err)
	}
	after, afterEnc, err := fingerprintOf(e.After)
	if err != nil {
		return fmt.Errorf("reactor: RecordEffect on %q: after: %w", e.Resource, err)
	}
	if before == after {
		return fmt.Errorf("%w (resource %q, %s)", ErrNoOpEffect, e.Resource, before)
	}
	raw, err := codec.Marshal(e.Before)
	if err != nil {
		return fmt.Errorf("reactor: RecordEffect on %q: encode before: %w", e.Resource, err)
	}
	rawAfter, err := codec.Marshal(e.After)
	if err != nil {
		return fmt.Errorf("reactor: RecordEffect on %q: encode after: %w", e.Resource, err)
	}
	if verify {
		got, err := r.guard.probe(ctx, e.Resource)
		if err != nil {
			return fmt.Errorf("reactor: RecordVerifiedEffect on %q: probe: %w", e.Resource, err)
		}
		probed, _, err := fingerprintOf(got)
		if err != nil {
			return fmt.Errorf("reactor: RecordVerifiedEffect on %q: probe: %w", e.Resource, err)
		}
		if probed != after {
			return &EffectMismatchError{Resource: e.Resource, After: after, Probed: probed}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rec != nil {
		return ErrEffectRecorded
	}
	r.resource = e.Resource
	r.rec = &effectRec{Label: e.Label, Before: raw, After: rawAfter, BeforeFP: before, AfterFP: after,
		BeforeEnc: shownEncoding(beforeEnc), AfterEnc: shownEncoding(afterEnc)}
	return nil
}

// taken returns the recorded effect and forgets it (an attempt that failed
// records anew on the next).
func (r *effectRecorder) taken() (string, *effectRec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, rec := r.resource, r.rec
	r.resource, r.rec = "", nil
	return res, rec
}
