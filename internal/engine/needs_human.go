package engine

import (
	"context"

	"github.com/goreactor/goreactor/internal/store"
)

// waitingForPerson reports, for each of ids (root or map element runs, as
// the needs-human index lists them), whether its stored run waits for a
// person (runState.waitsForPerson). An id is resolved as openForResolve
// does: the root run's state if it exists, else the element run's. An id
// with no state under either, or no valid id at all, does not wait. A state
// that cannot be decoded counts as waiting (and is logged): nobody drops an
// entry whose run it cannot read. Two pipelined round trips at most.
func (e *Engine) waitingForPerson(ctx context.Context, ids []string) ([]bool, error) {
	out := make([]bool, len(ids))
	roots := make([]store.Target, 0, len(ids))
	valid := make([]int, 0, len(ids))
	for i, id := range ids {
		if validateRunID(id) == nil {
			roots = append(roots, e.store.RunTarget(id))
			valid = append(valid, i)
		}
	}
	snaps, err := e.store.LoadMany(ctx, roots)
	if err != nil {
		return nil, err
	}
	var elems []store.Target
	var missing []int
	for j, snap := range snaps {
		if snap.Data == nil {
			elems = append(elems, e.store.ElemTarget(ids[valid[j]]))
			missing = append(missing, valid[j])
			continue
		}
		out[valid[j]] = e.decodeWaiting(ctx, ids[valid[j]], snap.Data)
	}
	if len(elems) == 0 {
		return out, nil
	}
	snaps, err = e.store.LoadMany(ctx, elems)
	if err != nil {
		return nil, err
	}
	var legacy []store.Target
	var still []int
	for j, snap := range snaps {
		if snap.Data != nil {
			out[missing[j]] = e.decodeWaiting(ctx, ids[missing[j]], snap.Data)
			continue
		}
		// An element of a map started before element runs moved into
		// their map's slot.
		legacy = append(legacy, e.store.LegacyElemTarget(ids[missing[j]]))
		still = append(still, missing[j])
	}
	if len(legacy) == 0 {
		return out, nil
	}
	if snaps, err = e.store.LoadMany(ctx, legacy); err != nil {
		return nil, err
	}
	for j, snap := range snaps {
		if snap.Data != nil {
			out[still[j]] = e.decodeWaiting(ctx, ids[still[j]], snap.Data)
		}
	}
	return out, nil
}

// decodeWaiting decodes the stored state of run id and reports whether it
// waits for a person; an undecodable state counts as waiting.
func (e *Engine) decodeWaiting(ctx context.Context, id string, data []byte) bool {
	st, err := decodeState(data)
	if err != nil {
		e.log.WarnContext(ctx, "a stored run state cannot be decoded; kept in the needs-human index",
			"event", "reactor.state.undecodable", "run", id, "error", err)
		return true
	}
	return st.waitsForPerson()
}
