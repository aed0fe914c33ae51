package mapcore

import (
	"context"
	"errors"
	"fmt"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
)

// Element is one element's outcome, as Read returns it.
type Element[T any] struct {
	Index int
	// Value is the element reactor's return value (zero unless OK).
	Value T
	// OK is true when the element completed.
	OK bool
	// Failure is set when the element failed.
	Failure *engine.Failure
	// Skipped is true for an element that never ran.
	Skipped bool
	// Halted is true for an element that halted; Reason says why.
	Halted bool
	Reason string
}

// Reader reads a map's outcomes in index order, a chunk at a time, so a map
// of any size never sits in one process.
type Reader[T any] struct {
	ms    mapStore
	r     Result
	next  int
	buf   []Element[T]
	chunk int
}

// Read returns a reader over r's elements. Call it inside a step (it finds
// the engine in ctx) or use ReadWith.
func Read[T any](ctx context.Context, r Result) (*Reader[T], error) {
	e := engine.EngineFrom(ctx)
	if e == nil {
		return nil, errors.New("mapstep: Read needs a step's context; use ReadWith outside steps")
	}
	return ReadWith[T](e, r), nil
}

// ReadWith returns a reader over r's elements using engine e.
func ReadWith[T any](e *engine.Engine, r Result) *Reader[T] {
	return &Reader[T]{ms: storeOf(e), r: r, chunk: 100}
}

// Next returns the next element; ok is false after the last one.
func (rd *Reader[T]) Next(ctx context.Context) (el Element[T], ok bool, err error) {
	if len(rd.buf) == 0 {
		if rd.next >= rd.r.Total {
			return el, false, nil
		}
		to := min(rd.next+rd.chunk, rd.r.Total) - 1
		outs, err := rd.ms.results(ctx, rd.r.MapID, rd.next, to)
		if err != nil {
			return el, false, err
		}
		for k, o := range outs {
			x := Element[T]{Index: rd.next + k}
			switch {
			case o == nil:
				return el, false, fmt.Errorf("mapstep: map %s has no outcome for element %d", rd.r.MapID, x.Index)
			case o.Status == outcomeOK:
				x.OK = true
				if len(o.Value) > 0 {
					if err := codec.Unmarshal(o.Value, &x.Value); err != nil {
						return el, false, fmt.Errorf("mapstep: decode element %d: %w", x.Index, err)
					}
				}
			case o.Status == outcomeFailed:
				x.Failure = o.Failure
			case o.Status == outcomeSkipped, o.Status == outcomeStopped:
				x.Skipped = true
			case o.Status == outcomeHalted:
				x.Halted, x.Reason = true, o.Reason
			}
			rd.buf = append(rd.buf, x)
		}
		rd.next = to + 1
	}
	el, rd.buf = rd.buf[0], rd.buf[1:]
	return el, true, nil
}

// All reads every element (convenient for small maps).
func (rd *Reader[T]) All(ctx context.Context) ([]Element[T], error) {
	var out []Element[T]
	for {
		el, ok, err := rd.Next(ctx)
		if err != nil || !ok {
			return out, err
		}
		out = append(out, el)
	}
}

// Progress is where a map stands.
type Progress struct {
	// Total is the number of elements.
	Total int
	// Claimed is how many positions have been dispatched (fan-out) or are
	// due to run (inline).
	Claimed int
	// Settled is how many elements have an outcome.
	Settled int
	// Failed is how many elements failed.
	Failed int
	// Done is true once the map has settled.
	Done bool
}

// ProgressOf reads the progress of map mapID (see MapID) in one round trip.
// A map that has not started (or whose keys expired) reports ok false.
func ProgressOf(ctx context.Context, e *engine.Engine, mapID string) (p Progress, ok bool, err error) {
	md, err := storeOf(e).readMeta(ctx, mapID)
	if err != nil || !md.exists {
		return p, false, err
	}
	return Progress{Total: md.Total, Claimed: md.Offset, Settled: md.Settled, Failed: md.Failures, Done: md.settled()}, true, nil
}

// RollbackProgress is where a map's rollback stands: what a dashboard shows
// while the owner run is rolling_back.
type RollbackProgress struct {
	Total, Settled, Outstanding, Failed int
	// Dispatched is how many rollback positions have been claimed.
	Dispatched int
	// Done is true once every position has an outcome.
	Done bool
}

// RollbackProgressOf reads the progress of map mapID's rollback. ok is
// false when the map has no rollback (yet).
func RollbackProgressOf(ctx context.Context, e *engine.Engine, mapID string) (p RollbackProgress, ok bool, err error) {
	rb, err := storeOf(e).currentRb(ctx, mapID)
	if err != nil || !rb.exists {
		return p, false, err
	}
	return RollbackProgress{Total: rb.Total, Settled: rb.Settled, Outstanding: rb.Total - rb.Settled,
		Failed: rb.Failed, Dispatched: rb.Offset, Done: rb.settled()}, true, nil
}
