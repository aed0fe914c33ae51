package engine

import (
	"context"
	"time"
)

// A run's retention covers its whole tree: the run, and everything its
// constructs keep in keys of their own (a map's keys and element runs,
// listed in the run's tree set by the construct before it writes them).
// Nothing of it expires while the run is live. The run's terminal write
// expires its state; the tree walk (internal/store) gives the rest the same
// retention, before the run leaves the active index, so a crash in between
// leaves a finished run the sweeper completes.

// expireTree gives run id's tree the retention ttl (0: no expiry, for a run
// made live again). A definition without constructs has no tree and costs
// nothing.
func (e *Engine) expireTree(ctx context.Context, def *Definition, id string, ttl time.Duration) error {
	if def != nil && !def.hasConstructs() {
		return nil
	}
	return e.store.RetainTree(ctx, id, ttl)
}

// hasConstructs reports whether d, or a child it composes, has a construct
// step.
func (d *Definition) hasConstructs() bool {
	for _, s := range d.steps {
		switch {
		case s.construct != nil:
			return true
		case s.child != nil && s.child.hasConstructs():
			return true
		}
	}
	return false
}
