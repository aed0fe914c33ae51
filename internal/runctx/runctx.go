// Package runctx carries what a construct tells the engine about an element
// run it executes, through the context, so that reactor's public API needs
// no parameter that only mapstep would ever pass.
package runctx

import "context"

// Element is where an element run belongs: the top-level run that owns its
// map, the map step's path in that run, the element's index, and the
// owner's trace id (the element run inherits it).
type Element struct {
	Owner string
	Step  string
	Index int
	Trace string
	// WindowAt is the Redis server time (Unix ms) at which the owner's
	// rollback judges undo windows (0: none): an element's rollback judges
	// its own entries' windows at that time, not when its job runs.
	WindowAt int64
	// Sensitive: the owner is a sensitive run, so the element run is one
	// too (its inputs come from the owner).
	Sensitive bool
}

type elementKey struct{}

// WithElement returns ctx telling ExecuteElement and UndoElement where the
// element run belongs.
func WithElement(ctx context.Context, e Element) context.Context {
	return context.WithValue(ctx, elementKey{}, e)
}

// ElementFrom returns what WithElement put in ctx.
func ElementFrom(ctx context.Context) (Element, bool) {
	e, ok := ctx.Value(elementKey{}).(Element)
	return e, ok
}
