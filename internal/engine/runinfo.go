package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/goreactor/goreactor/internal/runctx"
)

// RunInfo is where a step runs, as the context of its Run, Undo and
// Compensate (and of every Middleware around them) tells it: see
// RunInfoFrom.
type RunInfo struct {
	// RunID is the run's id: the top-level run for the steps of a composed
	// child as well, and "<mapID>.<i>" for the steps of a map element.
	RunID string
	// Reactor is the name of the definition the step belongs to (the
	// composed child's for a child's step, the element reactor's in a map
	// element).
	Reactor string
	// Step is the step's path in the run: "reserve", or "book/reserve" for
	// step reserve of the child composed as step book.
	Step string
	// Kind is the function being called: CallRun, CallUndo or
	// CallCompensate.
	Kind CallKind
	// Attempt is the attempt of a Run, from 1; it counts across processes
	// (a resumed run goes on from the attempt it was on). It is 0 for Undo
	// and Compensate.
	Attempt int
	// Element is set when the run is an element of a map step.
	Element *ElementInfo
	// TraceID identifies the run tree in traces and logs: 32 lowercase hex
	// digits (a W3C trace id). It is the one the starting call's context
	// carried (WithTraceID, the RunInfo of the step that started the run,
	// or its OpenTelemetry span), else generated when the run was created; it is stored with the
	// run, so every worker that executes the run sees the same one. A map's
	// element runs inherit their owner's.
	TraceID string
	// Deadline is the run's deadline (WithDeadline, WithTimeout), zero when
	// it has none. The context of a Run carries it too.
	Deadline time.Time
}

// ElementInfo says which element of which map a run is.
type ElementInfo struct {
	// Owner is the id of the run whose map step this is: the top-level
	// run, or the element run of an outer map for a map nested in an
	// element.
	Owner string
	// Step is the map step's path in the owner ("items", "book/items").
	Step string
	// Index is the element's position in the map's source, from 0.
	Index int
}

type runInfoKey struct{}

// RunInfoFrom returns where the step whose context ctx is runs. ok is false
// outside a step's Run, Undo or Compensate (and their middleware).
func RunInfoFrom(ctx context.Context) (info RunInfo, ok bool) {
	p, ok := ctx.Value(runInfoKey{}).(*RunInfo)
	if !ok {
		return RunInfo{}, false
	}
	info = *p
	if p.Element != nil {
		el := *p.Element
		info.Element = &el
	}
	return info, true
}

type traceKey struct{}

// WithTraceID returns ctx carrying trace id for the runs it starts: Run and
// Enqueue store it with a run they create, instead of generating one. Pass
// the OpenTelemetry trace id of the current span
// (span.SpanContext().TraceID().String()) to find a run's steps in its
// trace. id must be 32 lowercase hex digits, not all zero; otherwise the
// call that starts the run fails.
func WithTraceID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, traceKey{}, id)
}

// traceFor is the trace id of a run created under ctx: WithTraceID's, else
// that of the step starting the run, else that of ctx's OpenTelemetry span,
// else a new one.
func traceFor(ctx context.Context) (string, error) {
	if id, ok := ctx.Value(traceKey{}).(string); ok {
		if !validTraceID(id) {
			return "", fmt.Errorf("reactor: WithTraceID: %q is not a trace id (32 lowercase hex digits, not all zero)", id)
		}
		return id, nil
	}
	if info, ok := RunInfoFrom(ctx); ok && info.TraceID != "" {
		return info.TraceID, nil
	}
	if id := otelTraceID(ctx); id != "" {
		return id, nil
	}
	return newTraceID(), nil
}

func newTraceID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validTraceID(id string) bool {
	if len(id) != 32 {
		return false
	}
	zero := true
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		default:
			return false
		}
		zero = zero && c == '0'
	}
	return !zero
}

// elementRec is where an element run belongs, stored with it when it is
// created.
type elementRec struct {
	Owner string `msgpack:"o"`
	Step  string `msgpack:"s"`
	Index int    `msgpack:"i"`
}

// adoptElement records what the construct executing element run st said of
// it (through ctx), when st does not know yet.
func adoptElement(ctx context.Context, st *runState) {
	el, ok := runctx.ElementFrom(ctx)
	if !ok {
		if st.Trace == "" {
			st.Trace = newTraceID()
		}
		return
	}
	if st.Elem == nil {
		st.Elem = &elementRec{Owner: el.Owner, Step: el.Step, Index: el.Index}
	}
	st.Sensitive = st.Sensitive || el.Sensitive
	if st.Trace == "" {
		st.Trace = el.Trace
		if st.Trace == "" {
			st.Trace = newTraceID()
		}
	}
}

// runInfo is what call puts in the context of the call c.
func (x *execution) runInfo(c Call) *RunInfo {
	info := &RunInfo{RunID: c.RunID, Reactor: c.Reactor, Step: c.Step, Kind: c.Kind, Attempt: c.Attempt,
		TraceID: x.st.Trace, Deadline: x.deadline()}
	if c.Kind != CallRun {
		info.Attempt = 0
	}
	if el := x.st.Elem; el != nil {
		info.Element = &ElementInfo{Owner: el.Owner, Step: el.Step, Index: el.Index}
	}
	return info
}
