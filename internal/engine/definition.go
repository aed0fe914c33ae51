package engine

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
)

// Definition is a named reactor: typed inputs, steps that form a DAG, and
// what the run returns. Build one with Define; it is immutable afterwards.
type Definition struct {
	name    string
	inputs  []*inputDef
	steps   []*stepDef
	byName  map[string]*stepDef
	order   []*stepDef // dependency order, ties broken by declaration order
	returns *Ref
	// undoWindow bounds how long after completing a step may be undone
	// (UndoWindow; 0: no bound).
	undoWindow time.Duration
	// sensitive: its runs are sensitive runs (hasSensitive, sensitive.go).
	sensitive bool
	// version is Version's (0: not declared, which is 1); fp is the
	// fingerprint of the shape (version.go), fixed by Define.
	version int
	fp      string
	// compatible lists the fingerprints of the earlier shapes whose runs
	// this definition also executes (Compatible).
	compatible []string
	// runLimits are the limits its runs take as a whole (RunLimits).
	runLimits []Limit
	// maxConc is how many independent steps may run at once
	// (MaxConcurrency; 0: one at a time).
	maxConc int
	// wavePolicy is what a wave's steps do when one fails (OnWaveFailure).
	wavePolicy WavePolicy
}

// Name returns the definition's name.
func (d *Definition) Name() string { return d.name }

// Steps returns the step names in execution order.
func (d *Definition) Steps() []string {
	out := make([]string, len(d.order))
	for i, s := range d.order {
		out[i] = s.name
	}
	return out
}

// Inputs returns the declared input names, in declaration order. A
// construct's Validate can check its bindings into an element reactor
// against them.
func (d *Definition) Inputs() []string {
	out := make([]string, len(d.inputs))
	for i, in := range d.inputs {
		out[i] = in.name
	}
	return out
}

// Part is one element of a definition: an input, a step, a compose, or the
// return value.
type Part interface {
	apply(d *Definition) error
}

type partFunc func(d *Definition) error

func (f partFunc) apply(d *Definition) error { return f(d) }

// Define builds and validates a definition. It fails, naming the step at
// fault, on duplicate names, references to unknown inputs or steps,
// dependency cycles, bindings that name no field of the step's In type (or
// no input of a composed child), and FromStep paths that name a field the
// step's result type does not have (see FromStep).
func Define(name string, parts ...Part) (*Definition, error) {
	d := &Definition{name: name, byName: map[string]*stepDef{}}
	if name == "" {
		return nil, &DefinitionError{Reason: "name is empty"}
	}
	for _, p := range parts {
		if err := p.apply(d); err != nil {
			return nil, err
		}
	}
	if err := d.validate(); err != nil {
		return nil, err
	}
	if err := d.validateRunLimits(); err != nil {
		return nil, err
	}
	d.sensitive = d.hasSensitive()
	d.fp = d.fingerprint()
	return d, nil
}

// MustDefine is Define for package-level definitions: it panics on error.
func MustDefine(name string, parts ...Part) *Definition {
	d, err := Define(name, parts...)
	if err != nil {
		panic(err)
	}
	return d
}

// ---- inputs

type inputDef struct {
	name     string
	typ      reflect.Type
	required bool
	def      Raw
	defType  reflect.Type
	check    func(Raw) error // decodes into the input's type and validates
	// sensitive: declared Sensitive (sensitive.go).
	sensitive bool
}

// InputOption configures an input.
type InputOption interface {
	applyInput(in *inputDef) error
}

type inputOptionFunc func(in *inputDef) error

func (f inputOptionFunc) applyInput(in *inputDef) error { return f(in) }

// Input declares an input of type T. A value given for it must decode into
// T, with one conversion: numbers as encoding/json decodes them into a map
// (float64, or json.Number with UseNumber) convert to an integer T, or an
// integer field, element or map value inside T, when they are whole numbers
// in range (a float64 below 2^53 in magnitude), and a json.Number to a
// float; other numbers are refused with an *InputError saying why.
func Input[T any](name string, opts ...InputOption) Part {
	return partFunc(func(d *Definition) error {
		in := &inputDef{name: name, typ: reflect.TypeFor[T]()}
		var validators []func(Raw) error
		in.check = func(raw Raw) error {
			var v T
			if err := codec.Unmarshal(raw, &v); err != nil {
				m := explainDecode(raw, in.typ)
				if in.sensitive {
					m.got = redactKind(m.got)
				}
				return errors.New(m.String())
			}
			for _, f := range validators {
				if err := f(raw); err != nil {
					return err
				}
			}
			return nil
		}
		for _, o := range opts {
			if tv, ok := o.(interface{ valueType() reflect.Type }); ok && tv.valueType() != in.typ {
				return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("input %q: Validate takes a %s, input is a %s", name, tv.valueType(), in.typ)}
			}
			if vo, ok := o.(validateOption[T]); ok {
				validators = append(validators, func(raw Raw) error {
					var v T
					_ = codec.Unmarshal(raw, &v)
					return vo.fn(v)
				})
				continue
			}
			if err := o.applyInput(in); err != nil {
				return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("input %q: %v", name, err)}
			}
		}
		if in.defType != nil && in.defType != in.typ {
			return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("input %q: default is a %s, input is a %s", name, in.defType, in.typ)}
		}
		for _, o := range d.inputs {
			if o.name == name {
				return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("input %q declared twice", name)}
			}
		}
		d.inputs = append(d.inputs, in)
		return nil
	})
}

// Required makes the input mandatory.
func Required() InputOption {
	return inputOptionFunc(func(in *inputDef) error { in.required = true; return nil })
}

// Default gives the input a value used when the caller passes none.
func Default[T any](v T) InputOption {
	return inputOptionFunc(func(in *inputDef) error {
		b, err := codec.Marshal(v)
		if err != nil {
			return err
		}
		in.def, in.defType = b, reflect.TypeFor[T]()
		return nil
	})
}

type validateOption[T any] struct{ fn func(T) error }

func (validateOption[T]) applyInput(*inputDef) error { return nil }

func (validateOption[T]) valueType() reflect.Type { return reflect.TypeFor[T]() }

// Validate checks the input's value before anything is stored; an error
// rejects the run with an *InputError. T must be the input's type.
func Validate[T any](fn func(T) error) InputOption { return validateOption[T]{fn: fn} }

// ---- references

type refKind uint8

const (
	refInput refKind = iota + 1
	refStep
	refConst
)

// Ref says where a step argument comes from.
type Ref struct {
	kind  refKind
	name  string
	path  []string
	value Raw
	err   error
}

// FromInput refers to the run's input name, optionally to a field inside it
// (path of map keys or struct field names, as encoded).
func FromInput(name string, path ...string) Ref { return Ref{kind: refInput, name: name, path: path} }

// FromStep refers to the result of an earlier step, optionally to a field
// inside it (a path of field names as encoded, map keys and list indexes).
// The reference makes the step depend on it. When the step's result type is
// known (a plain step's Out; a compose or construct that reports it), Define
// follows the path through its structs, pointers and lists and refuses a
// name the type has no field for, listing the fields it has; past a map, an
// interface, Raw or a type that encodes itself the path is checked only
// when the run reads it.
func FromStep(step string, path ...string) Ref { return Ref{kind: refStep, name: step, path: path} }

// Const is a constant argument.
func Const(v any) Ref {
	b, err := codec.Marshal(v)
	return Ref{kind: refConst, value: b, err: err}
}

// IsZero reports whether r was never set.
func (r Ref) IsZero() bool { return r.kind == 0 }

func (r Ref) String() string {
	switch r.kind {
	case refInput:
		return fmt.Sprintf("input %q%s", r.name, pathString(r.path))
	case refStep:
		return fmt.Sprintf("step %q%s", r.name, pathString(r.path))
	}
	return "constant"
}

func pathString(p []string) string {
	if len(p) == 0 {
		return ""
	}
	return fmt.Sprintf(" at %v", p)
}

// Bindings name a step's arguments and where each comes from. The arguments
// are decoded into the step's In type by name, matched exactly as the codec
// decodes (the msgpack tag, else the json tag, else the Go field name; case
// counts), or handed over as they are when In is Args. Define refuses a
// binding that names no field of a struct In; a map or interface In takes
// any name.
type Bindings map[string]Ref

// Returns sets what the run returns: usually a step's result.
func Returns(r Ref) Part {
	return partFunc(func(d *Definition) error {
		if d.returns != nil {
			return &DefinitionError{Reactor: d.name, Reason: "Returns declared twice"}
		}
		d.returns = &r
		return nil
	})
}

// ---- steps

type stepKind uint8

const (
	kindPlain stepKind = iota
	kindCompose
	kindConstruct
	kindInterrupt
)

type stepDef struct {
	name     string
	kind     stepKind
	args     Bindings
	argNames []string // sorted, for a stable snapshot encoding
	after    []string
	deps     []string
	retry    Retry
	timeout  time.Duration
	undoTO   time.Duration
	handoff  HandOff

	run        func(ctx context.Context, args Raw) (Raw, error)
	undo       func(ctx context.Context, args, result Raw) error // nil: no ledger entry
	compensate func(ctx context.Context, args Raw, err error) error
	// resource names what a completed step changed (StepConfig.Resource;
	// nil: nothing named).
	resource  func(args, result Raw) string
	guard     *Guard      // guarded undo (nil: none)
	child     *Definition // compose
	spawn     *Definition // Spawn: the reactor a spawn step starts
	construct Construct
	intr      *interruptDef // an interrupt step's declaration
	limits    []Limit       // StepConfig.Limits
	// inType and outType are a plain step's In and Out (nil otherwise):
	// what Define checks bindings and result types against.
	inType, outType reflect.Type
}

// StepConfig describes a step whose arguments decode into In and whose
// result is an Out.
type StepConfig[In, Out any] struct {
	// Args binds the step's arguments.
	Args Bindings
	// After lists steps that must complete first, beyond those Args refer to.
	After []string
	// Run does the step's work. Required. Return Halt or Skip to stop the
	// run or skip the step, Permanent to fail without retry.
	Run func(ctx context.Context, in In) (Out, error)
	// Undo reverses a completed step when a later step fails or the run is
	// undone. It receives the arguments the step ran with and its result.
	// A step without Undo is not recorded in the ledger.
	Undo func(ctx context.Context, in In, out Out) error
	// Compensate cleans up after this step's own failure (its Run returned
	// an error after all retries).
	Compensate func(ctx context.Context, in In, err error) error
	// Retry is the retry policy. Default: one attempt.
	Retry Retry
	// Timeout bounds each attempt of Run. Default: none.
	Timeout time.Duration
	// UndoTimeout bounds Undo and Compensate; a hung undo becomes a rollback
	// failure. Default: the engine's UndoTimeout (30 s).
	UndoTimeout time.Duration
	// Resource names the resource the step changes, computed from its
	// arguments and result when it completes (an account id, "order:42"),
	// and stored on its ledger entry. UndoSteps refuses to undo a step
	// while a newer step that changed the same resource stays applied:
	// undoing the older change first would write over the newer one.
	// Default: the step names none, and is never refused on that ground.
	Resource func(in In, out Out) string
	// Guard makes the step's undo a guarded one (Guarded): its Run records
	// the effect it has with RecordEffect, and the rollback undoes it by
	// compare-and-set through the guard's Probe and Restore, never
	// writing over a change somebody else made. A guarded step has no
	// Undo and no Resource (the effect names it). Default: none.
	Guard *Guard
	// HandOff makes an in-process run hand the rest of the run to workers
	// before or after this step. Ignored where the run already executes in
	// a worker, and when the engine has no Enqueuer. Default NoHandOff.
	HandOff HandOff
	// Task runs the step as an asynq task of its own on a worker, with its
	// own Timeout and Retry (each retry a new task after its Backoff): the
	// run saves, leaves its worker and waits, parked, holding no worker
	// slot, and goes on when the step has its outcome. Its Undo and
	// Compensate run as tasks too; a rollback (a cancel included) stops the
	// step first: no attempt begins after it, and an attempt in flight has
	// its context cancelled. Where the run has no workers (an engine with
	// no Enqueuer) or is a map element (already a task of its own), the
	// step runs in place. Not with Guard, Resource, Limits or HandOff.
	// Default false.
	Task bool
	// TaskQueue is the asynq queue of a Task step's tasks. Default: the
	// queue of the engine's Enqueuer.
	TaskQueue string
	// Limits bound the step across every worker: how many attempts run at
	// once per key (a Lock is one), how many start per key in a window.
	// Each attempt takes them before its Run and gives them back after. A
	// full limit makes the run wait at its checkpoint: its worker snoozes
	// the task (an in-process Run returns a *LimitError). Default none.
	Limits []Limit
}

var argsType = reflect.TypeFor[Args]()

// ArgumentError reports step arguments that do not decode into the step's
// In type: which argument, what the type wants and what arrived.
type ArgumentError struct {
	Step string
	// Argument is the argument (In field) at fault; empty when the
	// arguments as a whole do not fit.
	Argument  string
	Want, Got string
	// Err is the codec's error.
	Err error
}

func (e *ArgumentError) Error() string {
	if e.Argument == "" {
		return fmt.Sprintf("reactor: step %q: arguments: want %s, got %s", e.Step, e.Want, e.Got)
	}
	return fmt.Sprintf("reactor: step %q: argument %q: want %s, got %s", e.Step, e.Argument, e.Want, e.Got)
}

func (e *ArgumentError) Unwrap() error { return e.Err }

func argsError(step string, raw Raw, t reflect.Type, err error) error {
	m := explainDecode(raw, t)
	return &ArgumentError{Step: step, Argument: m.field, Want: m.want, Got: m.got, Err: err}
}

func decodeIn[In any](raw Raw) (In, error) {
	var in In
	if reflect.TypeFor[In]() == argsType {
		var a Args
		if err := codec.Unmarshal(raw, &a); err != nil {
			return in, err
		}
		return any(a).(In), nil
	}
	err := codec.Unmarshal(raw, &in)
	return in, err
}

// Step declares a step. In and Out are inferred from cfg.
func Step[In, Out any](name string, cfg StepConfig[In, Out]) Part {
	return partFunc(func(d *Definition) error {
		if cfg.Run == nil {
			return &DefinitionError{Reactor: d.name, Step: name, Reason: "Run is required"}
		}
		if err := checkBindings(d.name, name, reflect.TypeFor[In](), cfg.Args); err != nil {
			return err
		}
		if cfg.Guard != nil {
			switch err := cfg.Guard.validate(); {
			case err != nil:
				return &DefinitionError{Reactor: d.name, Step: name, Reason: err.Error()}
			case cfg.Undo != nil:
				return &DefinitionError{Reactor: d.name, Step: name, Reason: "a guarded step has no Undo: its Guard restores the effect it records"}
			case cfg.Resource != nil:
				return &DefinitionError{Reactor: d.name, Step: name, Reason: "a guarded step has no Resource: the effect it records names it"}
			}
		} else if cfg.Resource != nil && cfg.Undo == nil {
			return &DefinitionError{Reactor: d.name, Step: name, Reason: "Resource names what the step's Undo reverses, and the step has no Undo"}
		}
		for _, l := range cfg.Limits {
			if err := l.validate(); err != nil {
				return &DefinitionError{Reactor: d.name, Step: name, Reason: err.Error()}
			}
		}
		s := &stepDef{name: name, kind: kindPlain, args: cfg.Args, after: cfg.After,
			retry: cfg.Retry, timeout: cfg.Timeout, undoTO: cfg.UndoTimeout, handoff: cfg.HandOff,
			inType: reflect.TypeFor[In](), outType: reflect.TypeFor[Out](), guard: cfg.Guard, limits: cfg.Limits}
		s.run = func(ctx context.Context, raw Raw) (Raw, error) {
			in, err := decodeIn[In](raw)
			if err != nil {
				return nil, Permanent(argsError(name, raw, reflect.TypeFor[In](), err))
			}
			out, err := cfg.Run(ctx, in)
			if err != nil {
				return nil, err
			}
			return codec.Marshal(out)
		}
		if cfg.Undo != nil {
			s.undo = func(ctx context.Context, raw, result Raw) error {
				if err := checkStored(name, "arguments", raw, reflect.TypeFor[In]()); err != nil {
					return err
				}
				if err := checkStored(name, "result", result, reflect.TypeFor[Out]()); err != nil {
					return err
				}
				in, err := decodeIn[In](raw)
				if err != nil {
					return argsError(name, raw, reflect.TypeFor[In](), err)
				}
				var out Out
				if len(result) > 0 {
					if err := codec.Unmarshal(result, &out); err != nil {
						return fmt.Errorf("reactor: decode result of step %q: %w", name, err)
					}
				}
				return cfg.Undo(ctx, in, out)
			}
		}
		if cfg.Resource != nil {
			s.resource = func(raw, result Raw) string {
				in, err := decodeIn[In](raw)
				if err != nil {
					return ""
				}
				var out Out
				if len(result) > 0 && codec.Unmarshal(result, &out) != nil {
					return ""
				}
				return cfg.Resource(in, out)
			}
		}
		if cfg.Compensate != nil {
			s.compensate = func(ctx context.Context, raw Raw, cause error) error {
				if err := checkStored(name, "arguments", raw, reflect.TypeFor[In]()); err != nil {
					return err
				}
				in, err := decodeIn[In](raw)
				if err != nil {
					return argsError(name, raw, reflect.TypeFor[In](), err)
				}
				return cfg.Compensate(ctx, in, cause)
			}
		}
		if cfg.Task {
			return d.addTaskStep(s, cfg.TaskQueue, cfg.Resource != nil)
		}
		return d.addStep(s)
	})
}

// addTaskStep adds plain step s as a step that runs as its own task
// (StepConfig.Task).
func (d *Definition) addTaskStep(s *stepDef, queue string, resource bool) error {
	refuse := func(what string) error {
		return &DefinitionError{Reactor: d.name, Step: s.name, Reason: "a Task step cannot have " + what}
	}
	switch {
	case s.guard != nil:
		return refuse("a Guard (a guarded undo records its effect inside the run)")
	case resource:
		return refuse("a Resource (targeted undos of a task step are not supported)")
	case len(s.limits) > 0:
		return refuse("Limits (a task step's attempts do not take limits yet)")
	case s.handoff != NoHandOff:
		return refuse("a HandOff: it already runs on a worker")
	}
	return d.addStep(&stepDef{name: s.name, kind: kindConstruct, args: s.args, after: s.after,
		construct: &taskStep{s: s, queue: queue}})
}

// ComposeConfig describes a step that runs a child reactor.
type ComposeConfig struct {
	// Args binds the child's inputs.
	Args Bindings
	// After lists steps that must complete first.
	After []string
}

// Compose declares a step that runs child as part of this run. The child's
// completed undoable steps fold into this step's ledger entry, so undoing the
// parent undoes them, newest first. Its result is the child's return value.
func Compose(name string, child *Definition, cfg ComposeConfig) Part {
	return partFunc(func(d *Definition) error {
		if child == nil {
			return &DefinitionError{Reactor: d.name, Step: name, Reason: "compose of a nil definition"}
		}
		if len(child.runLimits) > 0 {
			return &DefinitionError{Reactor: d.name, Step: name, Reason: fmt.Sprintf("composes %q, which declares run limits (RunLimits): a composed child runs inside its parent's run; declare them on the parent, or on the child's steps", child.name)}
		}
		s := &stepDef{name: name, kind: kindCompose, args: cfg.Args, after: cfg.After, child: child}
		return d.addStep(s)
	})
}

func (d *Definition) addStep(s *stepDef) error {
	if s.name == "" {
		return &DefinitionError{Reactor: d.name, Reason: "a step has an empty name"}
	}
	if _, dup := d.byName[s.name]; dup {
		return &DefinitionError{Reactor: d.name, Step: s.name, Reason: "declared twice"}
	}
	for name := range s.args {
		s.argNames = append(s.argNames, name)
	}
	sort.Strings(s.argNames)
	d.steps = append(d.steps, s)
	d.byName[s.name] = s
	return nil
}

// validate checks references and orders the steps, rejecting cycles.
func (d *Definition) validate() error {
	inputs := map[string]bool{}
	for _, in := range d.inputs {
		inputs[in.name] = true
	}
	checkRef := func(step string, r Ref) error {
		switch r.kind {
		case refInput:
			if !inputs[r.name] {
				return &DefinitionError{Reactor: d.name, Step: step, Reason: fmt.Sprintf("refers to unknown input %q", r.name)}
			}
		case refStep:
			if _, ok := d.byName[r.name]; !ok {
				return &DefinitionError{Reactor: d.name, Step: step, Reason: fmt.Sprintf("refers to unknown step %q", r.name)}
			}
			if r.name == step {
				return &DefinitionError{Reactor: d.name, Step: step, Reason: "refers to itself"}
			}
		case refConst:
			if r.err != nil {
				return &DefinitionError{Reactor: d.name, Step: step, Reason: fmt.Sprintf("constant cannot be encoded: %v", r.err)}
			}
		default:
			return &DefinitionError{Reactor: d.name, Step: step, Reason: "has an empty Ref; use FromInput, FromStep or Const"}
		}
		return nil
	}
	for _, s := range d.steps {
		deps := map[string]bool{}
		for _, name := range s.argNames {
			r := s.args[name]
			if err := checkRef(s.name, r); err != nil {
				return err
			}
			if err := d.checkStepPath(s.name, name, r); err != nil {
				return err
			}
			if r.kind == refStep {
				deps[r.name] = true
			}
		}
		for _, a := range s.after {
			if _, ok := d.byName[a]; !ok {
				return &DefinitionError{Reactor: d.name, Step: s.name, Reason: fmt.Sprintf("runs after unknown step %q", a)}
			}
			deps[a] = true
		}
		if s.kind == kindCompose {
			if err := checkChildBindings(d.name, s); err != nil {
				return err
			}
			for _, in := range s.child.inputs {
				if _, bound := s.args[in.name]; !bound && in.required && in.def == nil {
					return &DefinitionError{Reactor: d.name, Step: s.name, Reason: fmt.Sprintf("child %q needs input %q, which Args does not bind", s.child.name, in.name)}
				}
			}
		}
		for dep := range deps {
			s.deps = append(s.deps, dep)
		}
		sort.Strings(s.deps)
	}
	if d.returns != nil {
		if err := checkRef("", *d.returns); err != nil {
			return &DefinitionError{Reactor: d.name, Reason: "Returns " + err.(*DefinitionError).Reason}
		}
		if err := d.checkStepPath("", "", *d.returns); err != nil {
			return err
		}
	}
	if err := d.checkConstructBindings(); err != nil {
		return err
	}
	return d.order0()
}

// order0 sorts the steps topologically (Kahn's algorithm, declaration order
// among ready steps) and names a step on a cycle if there is one.
func (d *Definition) order0() error {
	indeg := map[string]int{}
	users := map[string][]*stepDef{}
	for _, s := range d.steps {
		indeg[s.name] = len(s.deps)
		for _, dep := range s.deps {
			users[dep] = append(users[dep], s)
		}
	}
	done := map[string]bool{}
	for len(d.order) < len(d.steps) {
		progressed := false
		for _, s := range d.steps {
			if done[s.name] || indeg[s.name] > 0 {
				continue
			}
			done[s.name] = true
			d.order = append(d.order, s)
			for _, u := range users[s.name] {
				indeg[u.name]--
			}
			progressed = true
			break
		}
		if !progressed {
			var cyc []string
			for _, s := range d.steps {
				if !done[s.name] {
					cyc = append(cyc, s.name)
				}
			}
			slices.Sort(cyc)
			return &DefinitionError{Reactor: d.name, Step: cyc[0],
				Reason: fmt.Sprintf("is on a dependency cycle among steps %v", cyc)}
		}
	}
	return nil
}

// resourceOf is the resource a completed step of s changed ("" for none).
func (s *stepDef) resourceOf(args, result Raw) string {
	if s.resource == nil {
		return ""
	}
	return s.resource(args, result)
}
