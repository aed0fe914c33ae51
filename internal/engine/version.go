package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/goreactor/goreactor/internal/typename"
)

// Versioned definitions.
//
// A run is executed, resumed and rolled back only by the definition it
// started with. Every Definition has a fingerprint: a hash of its shape
// (its name and Version, its inputs and their types, its steps in
// declaration order with their kinds, arguments, dependencies, argument
// and result types, whether they have Undo, Compensate or a Guard, and the
// fingerprints of the children and element reactors they run). A run
// stores the fingerprint of the definition that created it; an engine that
// has no definition with that fingerprint under the run's name refuses the
// run with a *DefinitionMismatchError and never calls a step of it. A
// worker answers that error by snoozing the task for a worker that has the
// definition.
//
// What a fingerprint leaves out can change freely between deploys: the
// bodies of step functions, retry policies, timeouts, hand-off points,
// undo windows. To change the shape (rename, add, remove or reorder a
// step, change a type), give the new definition the next Version and keep
// the old one registered beside it until its runs have finished (or rolled
// back): new runs start under the definition passed to Run or Enqueue,
// and old runs keep their own. docs/deploys.md walks through a deploy.

// Version numbers a definition's shape (default 1). Two definitions may be
// registered under one name when their versions differ: the stored runs of
// each execute under their own, and Engine.Definition(name) returns the
// highest. Bump it whenever the shape changes (see the fingerprint above).
func Version(n int) Part {
	return partFunc(func(d *Definition) error {
		if n < 1 {
			return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("Version must be 1 or more, got %d", n)}
		}
		if d.version != 0 {
			return &DefinitionError{Reactor: d.name, Reason: "Version declared twice"}
		}
		d.version = n
		return nil
	})
}

// Compatible declares a change you have checked: the definition also
// executes and rolls back the runs stored under the fingerprints given (an
// earlier shape of it, Definition.Fingerprint), as if they had started
// under it. Use it for a change whose stored state still means the same
// (a step gained a Compensate, a result type gained an optional field);
// renaming, removing or reordering steps needs a new Version instead. A
// field the stored state has and the new types lack is still caught at
// undo time (reactor.fields_dropped).
func Compatible(fingerprints ...string) Part {
	return partFunc(func(d *Definition) error {
		for _, fp := range fingerprints {
			if len(fp) != 16 {
				return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("Compatible: %q is not a definition fingerprint (16 hex digits)", fp)}
			}
			d.compatible = append(d.compatible, fp)
		}
		return nil
	})
}

// Version returns the definition's version (Version; default 1).
func (d *Definition) Version() int {
	if d.version == 0 {
		return 1
	}
	return d.version
}

// Fingerprint returns the hash of the definition's shape (16 hex digits):
// what a stored run must match to be executed by this definition.
func (d *Definition) Fingerprint() string { return d.fp }

func versionLabel(v int, fp string) string {
	if v == 0 {
		return fmt.Sprintf("fingerprint %s", fp)
	}
	return fmt.Sprintf("v%d (%s)", v, fp)
}

// ShapedConstruct is implemented by a construct whose configuration changes
// what its stored state means (a map's mode and failure policy): Shape
// describes it, and goes into the owner definition's fingerprint.
type ShapedConstruct interface {
	Shape() string
}

// fingerprint computes d.fp; it runs once, at the end of Define.
func (d *Definition) fingerprint() string {
	h := sha256.New()
	d.writeShape(h)
	return hex.EncodeToString(h.Sum(nil)[:8])
}

func (d *Definition) writeShape(h hash.Hash) {
	w := func(format string, args ...any) { _, _ = fmt.Fprintf(h, format+"\n", args...) }
	w("reactor %q version %d", d.name, d.Version())
	for _, in := range d.inputs {
		w("input %q %s required=%t default=%t", in.name, typeName(in.typ), in.required, in.def != nil)
	}
	for _, s := range d.steps {
		w("step %q kind=%d", s.name, s.kind)
		for _, name := range s.argNames {
			w("  arg %q %s", name, refShape(s.args[name]))
		}
		after := slices.Clone(s.after)
		slices.Sort(after)
		w("  after %q", after)
		w("  in=%s out=%s undo=%t compensate=%t guard=%t", typeName(s.inType), typeName(s.outType),
			s.undo != nil, s.compensate != nil, s.guard != nil)
		if s.intr != nil {
			w("  interrupt accepts=%d correlation=%t", s.intr.accepts, s.intr.corr != nil)
		}
		if s.child != nil {
			w("  child %q %s", s.child.name, s.child.fp)
		}
		if s.spawn != nil {
			// The spawned run runs under its own definition: only whom it
			// starts is this definition's shape.
			w("  spawns %q", s.spawn.name)
		}
		if s.construct != nil {
			w("  construct %s", typename.Of(reflect.TypeOf(s.construct)))
			if sc, ok := s.construct.(ShapedConstruct); ok {
				w("  shape %q", sc.Shape())
			}
			if n, ok := s.construct.(interface{ Definitions() []*Definition }); ok {
				for _, c := range n.Definitions() {
					if c != nil {
						w("  runs %q %s", c.name, c.fp)
					}
				}
			}
		}
	}
	if d.returns != nil {
		w("returns %s", refShape(*d.returns))
	}
}

func typeName(t reflect.Type) string {
	if t == nil {
		return "-"
	}
	return typename.Of(t)
}

// refShape describes a binding without a constant's value: a constant
// changed between deploys does not change what stored state means.
func refShape(r Ref) string {
	switch r.kind {
	case refInput:
		return fmt.Sprintf("input %q %q", r.name, r.path)
	case refStep:
		return fmt.Sprintf("step %q %q", r.name, r.path)
	}
	return "constant"
}

// ErrDefinitionMismatch is what a *DefinitionMismatchError matches with
// errors.Is.
var ErrDefinitionMismatch = errors.New("reactor: the run's definition is not registered here")

// DefinitionVersion names one registered definition of a reactor.
type DefinitionVersion struct {
	Version     int    `json:"version"`
	Fingerprint string `json:"fingerprint"`
}

func (v DefinitionVersion) String() string { return versionLabel(v.Version, v.Fingerprint) }

// DefinitionMismatchError is returned for a stored run whose definition
// (the one that created it) is not among those this engine registered
// under its reactor's name: a rolling deploy changed the reactor's shape,
// or a process runs an older build. Nothing of the run was executed.
type DefinitionMismatchError struct {
	// Run is the run that needs the definition: the run itself, or the
	// owner of the map whose element or rollback needed it.
	Run string
	// Reactor is the definition's name; Want is the definition the run
	// started with (Version 0 when only the fingerprint is known).
	Reactor string
	Want    DefinitionVersion
	// Have lists what this engine registered under Reactor.
	Have []DefinitionVersion
}

func (e *DefinitionMismatchError) Error() string {
	have := make([]string, len(e.Have))
	for i, v := range e.Have {
		have[i] = v.String()
	}
	return fmt.Sprintf("reactor: run %s started under reactor %q %s, which is not registered here (this engine has %s): "+
		"register that definition (keep the old Version registered beside the new one until its runs finish)",
		e.Run, e.Reactor, e.Want, strings.Join(have, ", "))
}

func (e *DefinitionMismatchError) Is(target error) bool { return target == ErrDefinitionMismatch }

// registered lists the definitions registered under name, lowest version
// first. e.mu is held.
func (e *Engine) registeredLocked(name string) []DefinitionVersion {
	out := make([]DefinitionVersion, 0, len(e.versions[name]))
	for _, d := range e.versions[name] {
		out = append(out, DefinitionVersion{Version: d.Version(), Fingerprint: d.fp})
	}
	return out
}

// Versions returns the definitions registered under name, lowest version
// first (nil when the name is unknown).
func (e *Engine) Versions(name string) []DefinitionVersion {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if len(e.versions[name]) == 0 {
		return nil
	}
	return e.registeredLocked(name)
}

// definitionFor returns the definition registered under name with
// fingerprint fp, for run id. An empty fp (a run stored before runs
// recorded their definition) takes the highest version. A name that is
// not registered at all is ErrUnknownReactor; a name registered with
// other fingerprints only is a *DefinitionMismatchError.
func (e *Engine) definitionFor(id, name, fp string, version int) (*Definition, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	vs := e.versions[name]
	if len(vs) == 0 {
		return nil, fmt.Errorf("%w %q: register its definition with Engine.Register", ErrUnknownReactor, name)
	}
	if fp == "" {
		return e.defs[name], nil
	}
	for _, d := range vs {
		if d.fp == fp {
			return d, nil
		}
	}
	for i := len(vs) - 1; i >= 0; i-- {
		if slices.Contains(vs[i].compatible, fp) {
			return vs[i], nil
		}
	}
	return nil, &DefinitionMismatchError{Run: id, Reactor: name,
		Want: DefinitionVersion{Version: version, Fingerprint: fp}, Have: e.registeredLocked(name)}
}

// lookupRun is the definition stored run st started with.
func (e *Engine) lookupRun(st *runState) (*Definition, error) {
	return e.definitionFor(st.ID, st.Reactor, st.Def, st.DefVersion)
}

// viewDef is the definition a view of st is drawn with: the run's own, or
// nil when this engine does not have it (the view then lists what the run
// recorded, without the steps it has not reached).
func (e *Engine) viewDef(st *runState) *Definition {
	d, err := e.lookupRun(st)
	if err != nil {
		return nil
	}
	return d
}

// DefinitionWait says that a run waits for a process that has its
// definition: the last process that received it refused it (Engine
// workers record it on every refusal).
type DefinitionWait struct {
	// Reactor and Want name the definition the run needs.
	Reactor string            `json:"reactor"`
	Want    DefinitionVersion `json:"want"`
	// Have is what the refusing process registered under Reactor (empty:
	// nothing at all).
	Have []DefinitionVersion `json:"have,omitempty"`
	// By names the refusing process (host:pid), At when it refused.
	By string    `json:"by,omitempty"`
	At time.Time `json:"at"`
}

// String is the one line a dashboard or a log shows.
func (w *DefinitionWait) String() string {
	if w.Want.Fingerprint == "" {
		return fmt.Sprintf("waiting for a worker that has reactor %q registered", w.Reactor)
	}
	return fmt.Sprintf("waiting for definition %s of reactor %q", w.Want, w.Reactor)
}

// definitionWaitTTL is how long a refusal's note lasts: workers snooze a
// refused task for a few seconds and note it again on every delivery, so
// the note lapses within this once a worker that has the definition took
// the run.
const definitionWaitTTL = 30 * time.Second

var processName = func() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", h, os.Getpid())
}()

// noteDefinitionWait records that this process refused a run for want of
// its definition (err is a *DefinitionMismatchError, or an ErrUnknownReactor
// error for run id of reactor name): Wait's error and the dashboard then
// say what the run waits for. The note lapses 30 s after the last refusal.
// Workers call it (NoteDefinitionWait in plumbing.go); an err that says nothing of a definition is
// ignored.
func (e *Engine) noteDefinitionWait(ctx context.Context, id, name string, err error) error {
	w := &DefinitionWait{Reactor: name, By: processName, At: e.now()}
	var mm *DefinitionMismatchError
	switch {
	case errors.As(err, &mm):
		id, w.Reactor, w.Want, w.Have = mm.Run, mm.Reactor, mm.Want, mm.Have
	case errors.Is(err, ErrUnknownReactor):
	default:
		return nil
	}
	if err := validateRunID(id); err != nil {
		return err
	}
	b, jerr := json.Marshal(w)
	if jerr != nil {
		return jerr
	}
	return e.store.SetWaiting(ctx, id, b, definitionWaitTTL)
}

// DefinitionWait returns what run id waits for when the last process that
// received it refused it for want of its definition within the last 30 s,
// nil otherwise. A worker that has the definition may have taken the run
// over since: read the run's status beside it.
func (e *Engine) DefinitionWait(ctx context.Context, id string) (*DefinitionWait, error) {
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	b, err := e.store.Waiting(ctx, id)
	if err != nil || b == nil {
		return nil, err
	}
	var w DefinitionWait
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("reactor: decode the definition wait of run %s: %w", id, err)
	}
	return &w, nil
}
