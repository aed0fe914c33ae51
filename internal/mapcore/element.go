package mapcore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/runctx"
	"github.com/goreactor/goreactor/internal/store"
)

// A fan-out element's job costs what an asynq task costs, or close: its task
// carries the map's immutable metadata (taskMeta), so the job reads nothing
// of the map before it starts; the element's create checks the map in the
// same script (elem_begin.lua), and its terminal write settles the map in
// the same script (elem_finish.lua). Both are single-slot because the
// element's keys share its map's hash tag (internal/keys.ElemState). A task
// without the metadata (enqueued before it was carried, re-enqueued by the
// map sweeper, or of a map started before that layout) takes the old path:
// read the map, create and write the element like any run, settle apart.

// taskMeta is the part of a map's metadata that never changes once the map
// started, as its element tasks carry it.
type taskMeta struct {
	Total      int       `msgpack:"n"`
	BatchSize  int       `msgpack:"b"`
	Atomic     bool      `msgpack:"a,omitempty"`
	Paged      bool      `msgpack:"p,omitempty"`
	Owner      string    `msgpack:"o"`
	OwnerReact string    `msgpack:"or"`
	Element    string    `msgpack:"e"`
	Step       string    `msgpack:"s"`
	ElementDef string    `msgpack:"ed,omitempty"`
	OwnerDef   string    `msgpack:"od,omitempty"`
	Input      string    `msgpack:"in"`
	With       codec.Raw `msgpack:"w,omitempty"`
	Trace      string    `msgpack:"t,omitempty"`
	Sensitive  bool      `msgpack:"x,omitempty"`
	Inc        string    `msgpack:"inc"`
}

// maxCarriedWith is the largest encoding of the map's shared inputs a task
// carries: past it each task would repeat a large value, and the job reads
// the map instead (the old path).
const maxCarriedWith = 1024

// carried encodes what md's element tasks carry, or nil when they carry
// nothing (a map of the old layout, or large shared inputs).
func (md meta) carried() codec.Raw {
	if md.Layout < 2 || md.Inc == "" || len(md.With) > maxCarriedWith {
		return nil
	}
	enc, err := codec.Marshal(taskMeta{Total: md.Total, BatchSize: md.BatchSize, Atomic: md.Atomic, Paged: md.Paged,
		Owner: md.Owner, OwnerReact: md.OwnerReact, Element: md.Element, Step: md.Step, ElementDef: md.ElementDef,
		OwnerDef: md.OwnerDef, Input: md.Input, With: md.With, Trace: md.Trace, Sensitive: md.Sensitive, Inc: md.Inc})
	if err != nil {
		return nil
	}
	return enc
}

// fromTask is the metadata an element task carries, as a meta (its mutable
// counters unknown).
func fromTask(raw codec.Raw) (meta, error) {
	var t taskMeta
	if err := codec.Unmarshal(raw, &t); err != nil {
		return meta{}, fmt.Errorf("%w: the map metadata it carries: %v", maptask.ErrBadTask, err)
	}
	return meta{Total: t.Total, BatchSize: t.BatchSize, Atomic: t.Atomic, FanOut: true, Paged: t.Paged, Owner: t.Owner,
		OwnerReact: t.OwnerReact, Element: t.Element, Step: t.Step, ElementDef: t.ElementDef, OwnerDef: t.OwnerDef,
		Input: t.Input, With: t.With, Trace: t.Trace, Sensitive: t.Sensitive, Inc: t.Inc, Layout: 2, exists: true}, nil
}

func newIncarnation() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// errElemPaused: the element run paused at an interrupt; its map settles it
// when a later delivery finishes it.
var errElemPaused = errors.New("mapstep: the element paused at an interrupt")

// The refusals of elem_begin.lua.
var (
	errElemMapFailed = errors.New("mapstep: the map failed before the element started")
	errElemOwnerDone = errors.New("mapstep: the map's owner has finished")
)

// elemBegin is the element's create (runctx.Element.Create): elem_begin.lua.
func (s mapStore) elemBegin(mapID string, md meta, index int) func(ctx context.Context, t store.Target, token string, lockTTL time.Duration, data []byte) (store.Snapshot, bool, error) {
	return func(ctx context.Context, t store.Target, token string, lockTTL time.Duration, data []byte) (store.Snapshot, bool, error) {
		k := s.keys
		res, err := s.eval(ctx, elemBeginScript, []string{t.State, t.Lock, k.MapMeta(mapID), k.MapOffset(mapID), k.MapFailed(mapID)},
			token, data, index, md.Inc, max(1, lockTTL.Milliseconds())).Slice()
		if err != nil {
			return store.Snapshot{}, false, fmt.Errorf("mapstep: create element %s[%d]: %w", mapID, index, err)
		}
		switch code := res[0].(int64); code {
		case 1:
			return store.Snapshot{Data: data, Version: 1}, true, nil
		case 0:
			return store.Snapshot{Version: res[1].(int64), Data: []byte(res[2].(string))}, false, nil
		case -1:
			return store.Snapshot{}, false, store.ErrLockNotHeld
		case -4:
			return store.Snapshot{}, false, maptask.ErrMapGone
		case -5:
			return store.Snapshot{}, false, fmt.Errorf("%w: element %d of map %s: the task is of an earlier map under that id", maptask.ErrBadTask, index, mapID)
		case -6:
			return store.Snapshot{}, false, errElemMapFailed
		default:
			return store.Snapshot{}, false, errElemOwnerDone
		}
	}
}

// elemFinish is the element's terminal write (runctx.Element.Finish):
// elem_finish.lua; what the settle did goes to *sr.
func (s mapStore) elemFinish(mapID string, md meta, index int, sr *settleResult) func(ctx context.Context, t store.Target, token string, version int64, data []byte, o store.WriteOptions, res any) (store.WriteResult, error) {
	return func(ctx context.Context, t store.Target, token string, version int64, data []byte, o store.WriteOptions, res any) (store.WriteResult, error) {
		r, _ := res.(*engine.Result)
		if r == nil {
			return store.WriteResult{}, errors.New("mapstep: an element's terminal write without its result")
		}
		out := outcomeOf(r)
		enc, err := codec.Marshal(out)
		if err != nil {
			return store.WriteResult{}, err
		}
		if !out.Held.IsZero() {
			// Before the settle: a crash in between redoes both.
			if err := s.setHeld(ctx, mapID, index, out.Held); err != nil {
				return store.WriteResult{}, err
			}
		}
		k := s.keys
		args, err := store.AppendAudit([]any{token, version, data, b2s(o.KeepForever), newIncarnation(), t.AuditCapOrDefault(),
			index, enc, b2s(out.Status == outcomeFailed), md.Total, md.BatchSize, b2s(md.Atomic), "f", ""}, o.Audit)
		if err != nil {
			return store.WriteResult{}, err
		}
		keys := []string{t.State, t.Lock, t.Audit, k.MapMeta(mapID), k.MapOffset(mapID), k.MapResults(mapID), k.MapFailed(mapID), k.MapSignalled(mapID), k.MapStates(mapID)}
		vals, err := s.eval(ctx, elemFinishScript, keys, args...).Int64Slice()
		if err != nil {
			return store.WriteResult{}, fmt.Errorf("mapstep: finish element %s[%d]: %w", mapID, index, err)
		}
		switch vals[0] {
		case -1:
			return store.WriteResult{}, store.ErrLockNotHeld
		case -2:
			return store.WriteResult{}, &store.VersionConflictError{Expected: version, Stored: vals[1]}
		}
		*sr = settleResult{Stored: vals[3] == 1, From: int(vals[4]), To: int(vals[5]), Signal: vals[6] == 1}
		return store.WriteResult{Version: vals[0], At: vals[2]}, nil
	}
}

// runCarried executes element t.Index of a map whose task carries its
// metadata md: create (checking the map), run, and finish (settling the
// map) in the element's own writes. It returns what the settle did, and
// errElemMapFailed when the map failed before the element started.
func runCarried(ctx context.Context, e *engine.Engine, ms mapStore, md meta, t maptask.ElementTask) (settleResult, error) {
	var sr settleResult
	if t.Index < 0 || t.Index >= md.Total {
		return sr, fmt.Errorf("%w: element %d of map %s is outside the map (size %d)", maptask.ErrBadTask, t.Index, t.MapID, md.Total)
	}
	def, err := engine.DefinitionFor(e, md.Owner, md.Element, md.ElementDef)
	if err != nil {
		return sr, fmt.Errorf("mapstep: element of map %s: %w", t.MapID, err)
	}
	item := t.Input
	if len(item) == 0 {
		items, err := claimedItems(ctx, e, ms, md, t.MapID, t.Index, t.Index)
		if err != nil {
			return sr, err
		}
		item = items[0]
	}
	inputs := map[string]codec.Raw{}
	if len(md.With) > 0 {
		if err := codec.Unmarshal(md.With, &inputs); err != nil {
			return sr, err
		}
	}
	inputs[md.Input] = item
	ctx = runctx.WithElement(ctx, runctx.Element{Owner: md.Owner, Step: md.Step, Index: t.Index, Trace: md.Trace, Sensitive: md.Sensitive,
		Create: ms.elemBegin(t.MapID, md, t.Index), Finish: ms.elemFinish(t.MapID, md, t.Index, &sr)})
	res, err := engine.ExecuteElement(e, ctx, def, ElementID(t.MapID, t.Index), inputs)
	var ie *engine.InputError
	switch {
	case errors.Is(err, engine.ErrLockLost):
		return sr, fmt.Errorf("mapstep: element %d of %s: %v: %w", t.Index, t.MapID, err, engine.ErrRunLocked)
	case errors.As(err, &ie):
		// Refused before it started: settled failed, apart.
		return ms.settle(ctx, t.MapID, t.Index, outcome{Status: outcomeFailed, Failure: &engine.Failure{Message: ie.Error()}})
	case err != nil:
		return sr, err
	}
	if res != nil && res.Status == engine.StatusPaused {
		// Paused at an interrupt: settled later, by the delivery its
		// continue (or its timer) makes.
		return sr, nil
	}
	if sr == (settleResult{}) && res != nil {
		// The element had finished before this delivery (a duplicate, or a
		// delivery that died between its terminal write and nothing else):
		// its terminal write settled it, or, for an element stopped with
		// its map, the stopped settle did. A settle again is a refused
		// duplicate unless the first never happened.
		o := outcomeOf(res)
		if elementStopped(res) {
			o = outcome{Status: outcomeStopped}
		}
		return ms.settle(ctx, t.MapID, t.Index, o)
	}
	return sr, nil
}

// The refusal of elem_rb_load.lua for a superseded generation.
var errRbSuperseded = errors.New("mapstep: a newer rollback generation superseded this job's")

// elemRbLoad is a rollback job's element load (runctx.Element.Load):
// elem_rb_load.lua.
func (s mapStore) elemRbLoad(md meta, t maptask.RollbackTask) func(ctx context.Context, tg store.Target, token string, lockTTL time.Duration) (store.Snapshot, error) {
	return func(ctx context.Context, tg store.Target, token string, lockTTL time.Duration) (store.Snapshot, error) {
		k := s.keys
		res, err := elemRbLoadScript.Run(ctx, s.rdb, []string{tg.State, tg.Lock, k.MapMeta(t.MapID), k.MapRbMeta(t.MapID, t.Gen), k.MapRbOffset(t.MapID, t.Gen)},
			token, t.Gen, t.Pos, t.Total, md.Inc, max(1, lockTTL.Milliseconds())).Slice()
		if err != nil {
			return store.Snapshot{}, fmt.Errorf("mapstep: load element %s[%d] for its rollback: %w", t.MapID, t.Index, err)
		}
		switch code := res[0].(int64); {
		case code >= 0:
			return store.Snapshot{Version: code, Data: []byte(res[1].(string))}, nil
		case code == -1:
			return store.Snapshot{}, store.ErrLockNotHeld
		case code == -3:
			return store.Snapshot{}, store.ErrNotFound
		case code == -4:
			return store.Snapshot{}, fmt.Errorf("%w: rollback generation %d of map %s", maptask.ErrMapGone, t.Gen, t.MapID)
		case code == -8:
			return store.Snapshot{}, errRbSuperseded
		default:
			return store.Snapshot{}, fmt.Errorf("%w: rollback task %s is of an earlier map under the id %s", maptask.ErrBadTask, t.TaskID(), t.MapID)
		}
	}
}

// elemRbFinish is a rollback job's terminal element write
// (runctx.Element.Finish): elem_finish.lua in its rollback direction, recording the outcome o(res)
// of position t.Pos; what the settle did goes to *sr, the outcome to *out.
func (s mapStore) elemRbFinish(md meta, t maptask.RollbackTask, sr *settleResult, out *rbOutcome) func(ctx context.Context, tg store.Target, token string, version int64, data []byte, o store.WriteOptions, res any) (store.WriteResult, error) {
	return func(ctx context.Context, tg store.Target, token string, version int64, data []byte, o store.WriteOptions, res any) (store.WriteResult, error) {
		r, _ := res.(*engine.Result)
		if r == nil {
			return store.WriteResult{}, errors.New("mapstep: an element's terminal write without its result")
		}
		*out = undoneOutcome(md, t.Index, r)
		enc, err := codec.Marshal(*out)
		if err != nil {
			return store.WriteResult{}, err
		}
		if !out.Held.IsZero() {
			// Before the settle: a crash in between redoes both.
			if err := s.setHeld(ctx, t.MapID, t.Index, out.Held); err != nil {
				return store.WriteResult{}, err
			}
		}
		k := s.keys
		args, err := store.AppendAudit([]any{token, version, data, b2s(o.KeepForever), newIncarnation(), tg.AuditCapOrDefault(),
			t.Pos, enc, b2s(len(out.Failures) > 0), t.Total, md.BatchSize, "0", "r", out.Outcome}, o.Audit)
		if err != nil {
			return store.WriteResult{}, err
		}
		keys := []string{tg.State, tg.Lock, tg.Audit, k.MapRbMeta(t.MapID, t.Gen), k.MapRbOffset(t.MapID, t.Gen), k.MapRbResults(t.MapID, t.Gen),
			k.MapRbHandedOff(t.MapID, t.Gen), k.MapRbSignalled(t.MapID, t.Gen), k.MapStates(t.MapID)}
		vals, err := s.eval(ctx, elemFinishScript, keys, args...).Int64Slice()
		if err != nil {
			return store.WriteResult{}, fmt.Errorf("mapstep: finish the rollback of element %s[%d]: %w", t.MapID, t.Index, err)
		}
		switch vals[0] {
		case -1:
			return store.WriteResult{}, store.ErrLockNotHeld
		case -2:
			return store.WriteResult{}, &store.VersionConflictError{Expected: version, Stored: vals[1]}
		}
		*sr = settleResult{Stored: vals[3] == 1, From: int(vals[4]), To: int(vals[5]), Signal: vals[6] == 1}
		return store.WriteResult{Version: vals[0], At: vals[2]}, nil
	}
}

// processCarriedRollback is processRollback for a task that carries what
// its job needs (a first generation's): the element's load checks the
// rollback, its terminal undo write records the outcome. done is false when
// the job must take the old path instead (nothing was done).
func processCarriedRollback(ctx context.Context, e *engine.Engine, ms mapStore, t maptask.RollbackTask) (done bool, err error) {
	md, err := fromTask(t.Meta)
	if err != nil {
		return true, err
	}
	if t.Gen != 1 || t.Index != t.Total-1-t.Pos {
		return true, fmt.Errorf("%w: rollback task %s names element %d, position %d of %d is element %d", maptask.ErrBadTask, t.TaskID(), t.Index, t.Pos, t.Total, t.Total-1-t.Pos)
	}
	var fwd *outcome
	if len(t.Fwd) > 0 {
		fwd = &outcome{}
		if err := codec.Unmarshal(t.Fwd, fwd); err != nil {
			return true, fmt.Errorf("%w: the forward outcome it carries: %v", maptask.ErrBadTask, err)
		}
	}
	if fwd != nil && (fwd.Status == outcomeSkipped || fwd.Status == outcomeFailed) {
		// Nothing of the element to undo, or (a failed element holding
		// something) the old path's retry: settled apart.
		return false, nil
	}
	var sr settleResult
	var o rbOutcome
	ctx = runctx.WithElement(ctx, runctx.Element{Owner: md.Owner, Step: md.Step, Index: t.Index, Trace: md.Trace, WindowAt: t.WindowAt,
		Load: ms.elemRbLoad(md, t), Finish: ms.elemRbFinish(md, t, &sr, &o)})
	res, err := engine.UndoElement(e, ctx, ElementID(t.MapID, t.Index), 0)
	switch {
	case errors.Is(err, errRbSuperseded):
		return true, nil
	case errors.Is(err, engine.ErrRunLocked):
		// Snooze, noting the wait, as the old path does.
		_, err = ms.heldElement(ctx, e, md, t.MapID, t.Gen, t.Pos, t.Index, err)
		return true, err
	case errors.Is(err, engine.ErrNotFound), err == nil && sr == (settleResult{}):
		// No run to undo, or one with nothing to undo (failed, cancelled,
		// stopped, undone before): the old path judges and settles it.
		return false, nil
	case err != nil:
		return true, forOwner(md, err)
	}
	_ = res
	if !sr.Stored {
		return true, nil
	}
	logElement(engine.Logger(e), md, t.MapID, o)
	if hook := failpoints.rbAfterSettle; hook != nil {
		if err := hook(t.MapID, t.Pos); err != nil {
			return true, err
		}
	}
	if sr.From >= 0 {
		claimedBatch(ctx, e, md, engine.EventMapRollbackBatchClaimed)
		rb := rbMeta{exists: true, Gen: t.Gen, Total: t.Total, BatchSize: md.BatchSize, WindowAt: t.WindowAt}
		if err := dispatchRollback(ctx, e, ms, md, t.MapID, rb, sr.From, sr.To); err != nil {
			return true, err
		}
	}
	if sr.Signal {
		if hook := failpoints.rbJobSignal; hook != nil {
			if err := hook(t.MapID, t.Pos); err != nil {
				return true, err
			}
		}
		return true, resumeOwnerRollback(ctx, e, md.Owner, md.OwnerReact, t.MapID, t.Gen)
	}
	return true, nil
}
