package engine

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/goreactor/goreactor/internal/codec"
)

// Errors returned by the Engine's API.
var (
	// ErrNotFound: no run is stored under the id.
	ErrNotFound = errors.New("reactor: run not found")
	// ErrRunLocked: another process holds the run's lock (it is executing or
	// rolling back the run). Retry later, or Wait for its result.
	ErrRunLocked = errors.New("reactor: run is locked by another process")
	// ErrLockLost: this process lost the run's lock while executing it; it
	// stopped without writing, and whoever holds the lock now carries on.
	ErrLockLost = errors.New("reactor: lost the run lock; another process owns the run now")
	// ErrRollbackInProgress: undo or cancel of a run that is rolling back.
	ErrRollbackInProgress = errors.New("reactor: rollback already in progress; wait for the run to reach failed or cancelled")
	// ErrAlreadyFinished: cancel of a run that already reached a terminal status.
	ErrAlreadyFinished = errors.New("reactor: run already finished; use Undo to roll back a completed run")
	// ErrNotUndoable: undo of a run whose status has nothing to undo.
	ErrNotUndoable = errors.New("reactor: run cannot be undone in its status")
	// ErrUnknownReactor: no definition is registered under the name.
	ErrUnknownReactor = errors.New("reactor: unknown reactor")
	// ErrCancelled is what the Failure of a cancelled (or undone) run
	// unwraps to.
	ErrCancelled = errors.New("reactor: run cancelled")
	// ErrAborted is what Result.Err returns for an aborted run: its
	// caller's context ended mid-run. Its completed steps are kept; Undo
	// rolls them back, Resume carries on.
	ErrAborted = errors.New("reactor: run aborted because its context ended; Resume it or Undo it")
)

const codeCancelled = "reactor.cancelled"

// InputError reports an input that is missing, of the wrong type, or invalid.
// Nothing is stored for a run whose inputs are rejected.
type InputError struct {
	Reactor, Input, Reason string
}

func (e *InputError) Error() string {
	return fmt.Sprintf("reactor: %s: input %q: %s", e.Reactor, e.Input, e.Reason)
}

// DefinitionError reports an invalid definition, naming the step at fault.
type DefinitionError struct {
	Reactor, Step, Reason string
	// Binding is the binding at fault, when one is: a name that matches no
	// field of the step's In type (or no input of a composed child), or a
	// binding whose FromStep path the step's result cannot have.
	Binding string
	// Fields are the names that binding could have used: the In type's
	// fields as the codec decodes them, the child's inputs, or the fields
	// of the result's type where its FromStep path went wrong.
	Fields []string
}

func (e *DefinitionError) Error() string {
	if e.Step == "" {
		return fmt.Sprintf("reactor: definition %q: %s", e.Reactor, e.Reason)
	}
	return fmt.Sprintf("reactor: definition %q: step %q: %s", e.Reactor, e.Step, e.Reason)
}

// StatusError reports an API call made on a run in the wrong status.
type StatusError struct {
	RunID  string
	Status Status
	Op     string
	Err    error // one of the sentinels above
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%v (run %s is %s; %s refused)", e.Err, e.RunID, e.Status, e.Op)
}

func (e *StatusError) Unwrap() error { return e.Err }

// haltError asks the run to stop without rolling back.
type haltError struct{ reason string }

func (e *haltError) Error() string { return "reactor: halt: " + e.reason }

// Halt returns an error that, returned from a step's Run, stops the run with
// status halted. Completed steps are kept (not rolled back).
func Halt(reason string) error { return &haltError{reason: reason} }

// skipError marks a step as skipped.
type skipError struct{ reason string }

func (e *skipError) Error() string { return "reactor: skip: " + e.reason }

// Skip returns an error that, returned from a step's Run, records the step as
// skipped: the run goes on, the step is never undone, and steps that read its
// result see the zero value.
func Skip(reason string) error { return &skipError{reason: reason} }

// permanentError marks an error as not retryable.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so that the step is not retried, whatever its retry
// policy says, and the run's Failure is marked not retryable.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// PanicError is the error of a step whose function panicked.
type PanicError struct {
	Value string `msgpack:"value"`
	Stack string `msgpack:"stack"`
}

func (e *PanicError) Error() string { return "reactor: step panicked: " + e.Value }

// TimeoutError is the error of a step that ran past its Timeout.
type TimeoutError struct {
	Step    string `msgpack:"step"`
	Timeout string `msgpack:"timeout"`
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("reactor: step %q timed out after %s", e.Step, e.Timeout)
}

// DroppedFieldsError is the rollback failure of an Undo or Compensate whose
// step's stored arguments or result hold fields that its current In or Out
// type does not have, usually because a deploy renamed or removed a field
// after the step ran: decoding would drop them and the function would see
// zero values (an empty id to release). The function is not called. Keep
// the old name readable (`msgpack:"new,alias:old"`) in the type, or undo the
// entry by hand; the stored value is on the run's ledger.
type DroppedFieldsError struct {
	Step string `msgpack:"step"`
	// What is "arguments" or "result".
	What string `msgpack:"what"`
	// Type is the Go type the value no longer fits.
	Type string `msgpack:"type"`
	// Fields are the stored fields Type has no field for.
	Fields []string `msgpack:"fields"`
	// Accepted are the fields Type decodes.
	Accepted []string `msgpack:"accepted"`
}

func (e *DroppedFieldsError) Error() string {
	return fmt.Sprintf("reactor: step %q: stored %s have fields %v that %s no longer has (it decodes %v); not calling the function with zero values: keep the old names as aliases (msgpack:\"new,alias:old\") or undo this entry by hand",
		e.Step, e.What, e.Fields, e.Type, e.Accepted)
}

// The error registry maps errors to stable codes and back, so that a Failure
// read from Redis still answers errors.Is and errors.As. Registration is
// global, like encoding/gob's, because a Failure can be decoded by any process.

type errorCodec struct {
	code   string
	match  func(error) (any, bool)
	decode func([]byte) (error, error)
}

var registry struct {
	sync.RWMutex
	user    []errorCodec // matched newest first
	builtin []errorCodec
	codes   map[string]errorCodec
}

func register(c errorCodec, builtin bool) {
	registry.Lock()
	defer registry.Unlock()
	if registry.codes == nil {
		registry.codes = map[string]errorCodec{}
	}
	if _, dup := registry.codes[c.code]; dup {
		panic(fmt.Sprintf("reactor: error code %q registered twice", c.code))
	}
	if c.code == "" {
		panic("reactor: error code must not be empty")
	}
	registry.codes[c.code] = c
	if builtin {
		registry.builtin = append(registry.builtin, c)
	} else {
		registry.user = append(registry.user, c)
	}
}

// RegisterError registers the error type E under a stable code. A step error
// that errors.As matches to E is stored with the code and E's exported fields
// (msgpack), and a Failure read back unwraps to an equal E. Register each type
// once, at init, in every process that runs or reads the reactor.
func RegisterError[E error](code string) {
	rt := reflect.TypeFor[E]()
	register(errorCodec{
		code: code,
		match: func(err error) (any, bool) {
			var target E
			if errors.As(err, &target) {
				return target, true
			}
			return nil, false
		},
		decode: func(data []byte) (error, error) {
			if rt.Kind() == reflect.Pointer {
				v := reflect.New(rt.Elem())
				if err := codec.Unmarshal(data, v.Interface()); err != nil {
					return nil, err
				}
				return v.Interface().(E), nil
			}
			var v E
			if err := codec.Unmarshal(data, &v); err != nil {
				return nil, err
			}
			return v, nil
		},
	}, false)
}

// RegisterSentinel registers a sentinel error value under a stable code: a
// Failure read back from Redis answers errors.Is(failure, sentinel).
func RegisterSentinel(code string, sentinel error) {
	register(errorCodec{
		code: code,
		match: func(err error) (any, bool) {
			return nil, errors.Is(err, sentinel)
		},
		decode: func([]byte) (error, error) { return sentinel, nil },
	}, false)
}

func init() {
	builtinType[*PanicError]("reactor.panic")
	builtinType[*TimeoutError]("reactor.timeout")
	builtinType[*DroppedFieldsError]("reactor.fields_dropped")
	builtinSentinel("reactor.deadline_exceeded", context.DeadlineExceeded)
	builtinSentinel("reactor.canceled", context.Canceled)
	builtinSentinel(codeCancelled, ErrCancelled)
}

func builtinType[E error](code string) {
	RegisterError[E](code)
	moveToBuiltin(code)
}

func builtinSentinel(code string, err error) {
	RegisterSentinel(code, err)
	moveToBuiltin(code)
}

func moveToBuiltin(code string) {
	registry.Lock()
	defer registry.Unlock()
	last := registry.user[len(registry.user)-1]
	registry.user = registry.user[:len(registry.user)-1]
	registry.builtin = append(registry.builtin, last)
	_ = code
}

// encodeError finds err's code and data. Unregistered errors get no code and
// keep only their message.
func encodeError(err error) (code string, data []byte) {
	registry.RLock()
	defer registry.RUnlock()
	try := func(list []errorCodec, reverse bool) bool {
		for i := range list {
			c := list[i]
			if reverse {
				c = list[len(list)-1-i]
			}
			v, ok := c.match(err)
			if !ok {
				continue
			}
			code = c.code
			if v != nil {
				b, merr := codec.Marshal(v)
				if merr == nil {
					data = b
				}
			}
			return true
		}
		return false
	}
	if !try(registry.user, true) {
		try(registry.builtin, false)
	}
	return code, data
}

// decodeError rebuilds the registered error for code, or nil if the code is
// unknown in this process.
func decodeError(code string, data []byte) error {
	if code == "" {
		return nil
	}
	registry.RLock()
	c, ok := registry.codes[code]
	registry.RUnlock()
	if !ok {
		return nil
	}
	err, derr := c.decode(data)
	if derr != nil {
		return nil
	}
	return err
}
