package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/runctx"
	"github.com/goreactor/goreactor/internal/store"
)

// An element run (a map element "<mapID>.<i>") starts and ends in its map's
// keys: its keys share its map's slot (keys.ElemState), so the construct
// that executes it can check the map in the element's create
// (runctx.Element.Create) and record the element's outcome in its terminal
// write (runctx.Element.Finish), one script each instead of a separate read
// and settle. Without them (an inline map, an element of a map started
// before that layout) the element is created and written like any run.

// elemTarget returns the keys of element run id: the layout of its map
// (runctx.Element.Legacy), the current one by default.
func (e *Engine) elemTarget(ctx context.Context, id string) store.Target {
	if el, ok := runctx.ElementFrom(ctx); ok && el.Legacy {
		return e.store.LegacyElemTarget(id)
	}
	return e.store.ElemTarget(id)
}

// startElement creates or resumes element run id and executes it: Engine.start
// for an element (no index entries, no inputs check against a stored run,
// the lock tried once).
func (e *Engine) startElement(ctx context.Context, def *Definition, id string, inputs map[string]Raw) (*Result, error) {
	target := e.elemTarget(ctx, id)
	el, _ := runctx.ElementFrom(ctx)
	if el.Create != nil {
		return e.startElementIn(ctx, def, id, inputs, target, el)
	}
	lease, err := e.locks.TryAcquire(ctx, target.Lock)
	if errors.Is(err, lock.ErrHeld) {
		// Someone executes this element. A finished one answers with its
		// result.
		if snap, lerr := e.store.Load(ctx, target); lerr == nil {
			if st, derr := decodeState(snap.Data); derr == nil && st.Status.Terminal() {
				return st.result(), nil
			}
		}
		return nil, fmt.Errorf("%w (run %s)", ErrRunLocked, id)
	}
	if err != nil {
		return nil, err
	}
	data, st, err := e.newElementState(ctx, def, id, inputs)
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	snap, created, err := e.store.Create(ctx, target, lease.Token(), data)
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	return e.executeElementRun(ctx, def, id, target, lease, st, snap, created)
}

// newElementState is an element run's first state, its first step's intent
// riding on the create.
func (e *Engine) newElementState(ctx context.Context, def *Definition, id string, inputs map[string]Raw) ([]byte, *runState, error) {
	now := e.now()
	st := newState(id, def, inputs, now)
	adoptElement(ctx, st)
	st.Intent = nextIntent(&frame{def: def, st: st})
	if st.Intent != nil {
		st.stepStarted(st.Intent.Step, now)
	}
	data, err := codec.Marshal(st)
	if err != nil {
		return nil, nil, fmt.Errorf("reactor: encode run: %w", err)
	}
	return data, st, nil
}

// startElementIn is startElement when the element's construct creates it
// (runctx.Element.Create): the lock is taken in the construct's create
// script, which saves the element a round trip.
func (e *Engine) startElementIn(ctx context.Context, def *Definition, id string, inputs map[string]Raw, target store.Target, el runctx.Element) (*Result, error) {
	data, st, err := e.newElementState(ctx, def, id, inputs)
	if err != nil {
		return nil, err
	}
	token, sent := lock.NewToken(), time.Now()
	snap, created, err := el.Create(ctx, target, token, e.cfg.LockExpiry, data)
	if errors.Is(err, store.ErrLockNotHeld) {
		// Someone executes this element. A finished one answers with its
		// result.
		if snap, lerr := e.store.Load(ctx, target); lerr == nil {
			if st, derr := decodeState(snap.Data); derr == nil && st.Status.Terminal() {
				return st.result(), nil
			}
		}
		return nil, fmt.Errorf("%w (run %s)", ErrRunLocked, id)
	}
	lease := e.locks.Adopt(target.Lock, token, sent)
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	return e.executeElementRun(ctx, def, id, target, lease, st, snap, created)
}

// lockAndLoadElement is lockAndLoad when the element's construct loads it
// (runctx.Element.Load, a map's rollback job): one try at the lock, taken
// in the construct's load script.
func (e *Engine) lockAndLoadElement(ctx context.Context, target store.Target, what string, el runctx.Element) (*execution, error) {
	token, sent := lock.NewToken(), time.Now()
	snap, err := el.Load(ctx, target, token, e.cfg.LockExpiry)
	if errors.Is(err, store.ErrLockNotHeld) {
		return nil, fmt.Errorf("%w (%s; waited 0s)", ErrRunLocked, what)
	}
	lease := e.locks.Adopt(target.Lock, token, sent)
	if errors.Is(err, store.ErrNotFound) {
		err = fmt.Errorf("%w: %s", ErrNotFound, what)
	}
	var st *runState
	if err == nil {
		st, err = decodeState(snap.Data)
	}
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	return &execution{e: e, st: st, target: target, lease: lease, version: snap.Version, indexed: st.Status}, nil
}

// executeElementRun executes element run id once its state is created
// (st) or found (snap), holding lease.
func (e *Engine) executeElementRun(ctx context.Context, def *Definition, id string, target store.Target, lease *lock.Lease,
	st *runState, snap store.Snapshot, created bool) (*Result, error) {
	bg := context.WithoutCancel(ctx)
	x := &execution{e: e, def: def, target: target, lease: lease, version: snap.Version, indexed: StatusRunning,
		element: true, inWorker: true}
	if created {
		x.st, x.created = st, true
		return x.execute(ctx, EventRunStarted)
	}
	existing, err := decodeState(snap.Data)
	if err != nil {
		_ = lease.Release(bg)
		return nil, err
	}
	if existing.Reactor != def.name {
		_ = lease.Release(bg)
		return nil, errIDTaken(id, existing.Reactor)
	}
	if existing.Def != "" && existing.Def != def.fp && !existing.Status.Terminal() {
		// The element started under another version: it goes on under
		// that one, or not at all here.
		d, err := e.lookupRun(existing)
		if err != nil {
			_ = lease.Release(bg)
			return nil, err
		}
		x.def = d
	}
	if existing.Status.Terminal() {
		_ = lease.Release(bg)
		return existing.result(), nil
	}
	x.st = existing
	adoptElement(ctx, existing) // an element created before it was recorded
	return x.execute(ctx, EventRunResumed)
}

// write is the fenced write of save: an element's terminal write goes
// through its construct's Finish when it gave one (the map settles in the
// same script).
func (x *execution) write(ctx context.Context, data []byte, terminal bool, o store.WriteOptions) (store.WriteResult, error) {
	if el, ok := runctx.ElementFrom(ctx); ok && terminal && x.element && el.Finish != nil {
		return el.Finish(ctx, x.target, x.lease.Token(), x.version, data, o, x.st.result())
	}
	return x.e.store.Write(ctx, x.target, x.lease.Token(), x.version, data, o)
}

// storedElemTarget returns the keys of element run id as they are stored:
// its map's layout, or (a map started before element runs moved into their
// map's slot) the legacy one when only that holds a state. Callers that
// have only the id (an operator's resolve, a report) use it.
func (e *Engine) storedElemTarget(ctx context.Context, id string) (store.Target, error) {
	cur, old := e.store.ElemTarget(id), e.store.LegacyElemTarget(id)
	if cur.State == old.State {
		return cur, nil
	}
	n, err := e.store.Client().Exists(ctx, cur.State).Result()
	if err != nil || n == 1 {
		return cur, err
	}
	if n, err = e.store.Client().Exists(ctx, old.State).Result(); err == nil && n == 1 {
		return old, nil
	}
	return cur, err
}
