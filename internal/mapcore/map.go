package mapcore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/runctx"
)

// DefaultBatchSize is how many element tasks one action enqueues at most,
// unless a map sets BatchSize.
const DefaultBatchSize = 50

// Config describes a map step.
type Config struct {
	// Element is the reactor run once per item. Required.
	Element *engine.Definition
	// Items binds the collection: a slice (reactor.FromInput("orders"),
	// reactor.FromStep("load", "rows"), reactor.Const(...)). Set Items or
	// Pages.
	Items engine.Ref
	// Pages, instead of Items, pages through a collection too big to hold
	// in one process: every batch is fetched by whichever job claims it.
	Pages Source
	// Input is the element reactor's input that receives the item.
	// Default "item".
	Input string
	// With binds more inputs of the element reactor, the same for every
	// element. Default none.
	With engine.Bindings
	// FanOut runs each element as its own task on workers. Default false
	// (inline: elements run one after another where the map runs). A map
	// inside a map element always runs inline.
	FanOut bool
	// BatchSize bounds how many element tasks one action enqueues.
	// Default DefaultBatchSize (50).
	BatchSize int
	// Partial turns atomic off: the map completes with every element's
	// outcome, and failed elements roll themselves back. Default false
	// (atomic: the first element failure fails the map and stops claims).
	Partial bool
	// After lists steps that must complete first.
	After []string
}

// Map declares a map step.
func Map(name string, cfg Config) engine.Part {
	if cfg.Input == "" {
		cfg.Input = "item"
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	args := engine.Bindings{}
	if cfg.Pages == nil {
		args["items"] = cfg.Items
	}
	for k, r := range cfg.With {
		args["with."+k] = r
	}
	return engine.ConstructStep(name, &construct{cfg: cfg}, engine.ConstructConfig{Args: args, After: cfg.After})
}

type construct struct {
	cfg Config
}

// UndoWindowed tells the owner's rollback that the map's elements judge
// undo windows (reactor.WindowedConstruct), so that it hands them the time
// it started at.
func (m *construct) UndoWindowed() bool {
	return m.cfg.Element != nil && m.cfg.Element.UndoWindow() > 0
}

// Shape goes into the owner definition's fingerprint (reactor.Version):
// what changes the meaning of a map's stored keys.
func (m *construct) Shape() string {
	return fmt.Sprintf("map fanout=%t partial=%t paged=%t input=%q", m.cfg.FanOut, m.cfg.Partial, m.cfg.Pages != nil, m.cfg.Input)
}

// Validate is called by reactor.Define.
func (m *construct) Validate() error {
	if m.cfg.Element == nil {
		return errors.New("map needs an Element reactor")
	}
	if m.cfg.Pages != nil && !m.cfg.Items.IsZero() {
		return errors.New("map sets both Items and Pages; choose one")
	}
	if m.cfg.Pages == nil && m.cfg.Items.IsZero() {
		return errors.New("map needs Items (a slice) or Pages (a Source)")
	}
	if step := engine.InterruptStep(m.cfg.Element); step != "" && !m.cfg.FanOut {
		return fmt.Errorf("map element reactor %q has interrupt step %q, and an inline map's elements cannot pause "+
			"(they run inside the owner's execution): set FanOut, so that each element waits as a task of its own", m.cfg.Element.Name(), step)
	}
	return nil
}

// Source pages through a map's collection. Both calls get the map's With
// arguments, so one Source serves every run ("orders of customer X").
type Source interface {
	// Len returns the number of items; it is called once, when the map
	// starts, and fixes the map's size.
	Len(ctx context.Context, with engine.Args) (int, error)
	// Page returns items [offset, offset+limit), each a value the element
	// reactor's input decodes.
	Page(ctx context.Context, with engine.Args, offset, limit int) ([]any, error)
}

// itemsFunc returns the encoded items at positions [from, to].
type itemsFunc func(ctx context.Context, from, to int) ([]codec.Raw, error)

// openItems gives the map's size and a way to read its items. total < 0
// asks a Source for its length; a resumed map passes its saved size.
func (m *construct) openItems(ctx context.Context, args map[string]codec.Raw, total int) (int, itemsFunc, error) {
	if m.cfg.Pages == nil {
		var items []codec.Raw
		if err := codec.Unmarshal(args["items"], &items); err != nil {
			return 0, nil, engine.Permanent(fmt.Errorf("mapstep: Items must be a list: %w", err))
		}
		if total >= 0 && total != len(items) {
			return 0, nil, engine.Permanent(fmt.Errorf("mapstep: the map had %d items, its arguments now give %d", total, len(items)))
		}
		return len(items), func(_ context.Context, from, to int) ([]codec.Raw, error) { return items[from : to+1], nil }, nil
	}
	with := withArgs(args)
	if total < 0 {
		n, err := m.cfg.Pages.Len(ctx, with)
		if err != nil {
			return 0, nil, fmt.Errorf("mapstep: source length: %w", err)
		}
		total = n
	}
	return total, func(ctx context.Context, from, to int) ([]codec.Raw, error) {
		return m.page(ctx, with, from, to)
	}, nil
}

// page fetches items [from, to] from the Source.
func (m *construct) page(ctx context.Context, with engine.Args, from, to int) ([]codec.Raw, error) {
	vals, err := m.cfg.Pages.Page(ctx, with, from, to-from+1)
	if err != nil {
		return nil, fmt.Errorf("mapstep: source page [%d, %d]: %w", from, to, err)
	}
	if len(vals) != to-from+1 {
		return nil, fmt.Errorf("mapstep: source page [%d, %d] returned %d items", from, to, len(vals))
	}
	out := make([]codec.Raw, len(vals))
	for i, v := range vals {
		b, err := codec.Marshal(v)
		if err != nil {
			return nil, engine.Permanent(fmt.Errorf("mapstep: encode item %d: %w", from+i, err))
		}
		out[i] = b
	}
	return out, nil
}

func withArgs(args map[string]codec.Raw) engine.Args {
	with := engine.Args{}
	for k, v := range args {
		if len(k) > 5 && k[:5] == "with." {
			with[k[5:]] = v
		}
	}
	return with
}

// Definitions makes Engine.Register register the element reactor too.
func (m *construct) Definitions() []*engine.Definition { return []*engine.Definition{m.cfg.Element} }

// MapID is the id of the map run by step (a path) of owner run: derived, so
// a re-entered owner finds its own keys.
func MapID(owner, step string) string { return owner + "~" + step }

// ElementID is the run id of element i of a map.
func ElementID(mapID string, i int) string { return mapID + "." + strconv.Itoa(i) }

func (m *construct) Run(ctx context.Context, c *engine.ConstructContext) (codec.Raw, error) {
	e := c.Engine
	ms := storeOf(e)
	var st state
	if raw := c.State(); raw != nil {
		if err := codec.Unmarshal(raw, &st); err != nil {
			return nil, engine.Permanent(fmt.Errorf("mapstep: decode map state: %w", err))
		}
		return m.resume(ctx, c, ms, st)
	}
	var args map[string]codec.Raw
	if err := codec.Unmarshal(c.Args, &args); err != nil {
		return nil, engine.Permanent(fmt.Errorf("mapstep: decode arguments: %w", err))
	}
	total, items, err := m.openItems(ctx, args, -1)
	if err != nil {
		return nil, err
	}
	st = state{MapID: MapID(c.OwnerID, c.Step), Total: total, FanOut: m.cfg.FanOut && !c.Nested}
	if total > 0 {
		if err := keys.ValidateID(ElementID(st.MapID, total-1)); err != nil {
			return nil, engine.Permanent(fmt.Errorf("mapstep: element run ids of this map are invalid (shorten the run id or step name): %w", err))
		}
	}
	if st.FanOut && engine.EnqueuerOf(e) == nil {
		return nil, engine.Permanent(errors.New("mapstep: a fan-out map needs an engine with an Enqueuer (worker.Client)"))
	}
	if st.Total == 0 { // an empty map settles at once, without keys or tasks
		return codec.Marshal(Result{MapID: st.MapID})
	}
	enc, err := codec.Marshal(st)
	if err != nil {
		return nil, err
	}
	// Decide, save, then act.
	if err := c.SaveState(ctx, enc); err != nil {
		return nil, err
	}
	return m.begin(ctx, c, ms, st, args, items)
}

// begin acts on the saved decision: it creates the map (once) and runs it
// inline, or dispatches its first batch. A re-entered owner whose map never
// got created (a crash between its save and the start script) comes here
// again.
func (m *construct) begin(ctx context.Context, c *engine.ConstructContext, ms mapStore, st state, args map[string]codec.Raw, items itemsFunc) (codec.Raw, error) {
	e := c.Engine
	wenc, err := codec.Marshal(withArgs(args))
	if err != nil {
		return nil, err
	}
	md := meta{Total: st.Total, BatchSize: m.cfg.BatchSize, Atomic: !m.cfg.Partial, FanOut: st.FanOut, Paged: m.cfg.Pages != nil,
		Owner: c.OwnerID, OwnerReact: c.OwnerReactor, Element: m.cfg.Element.Name(), Step: c.Step,
		Input: m.cfg.Input, With: wenc, Trace: c.TraceID, Sensitive: c.Sensitive,
		ElementDef: m.cfg.Element.Fingerprint(), OwnerDef: c.OwnerDefinition, Inc: newIncarnation(), Layout: 2}
	if !st.FanOut {
		md.BatchSize = st.Total // inline: everything is claimed at once, nothing is enqueued
		if err := ms.addToTree(ctx, st.MapID, c.OwnerID, c.Nested); err != nil {
			return nil, err
		}
		if _, _, err := ms.start(ctx, st.MapID, md); err != nil {
			return nil, err
		}
		return m.runInline(ctx, c, ms, st, items)
	}
	// Indexed before it exists, so a crash after the start script can
	// never leave a claimed map where the map sweeper does not look.
	if err := ms.index(ctx, st.MapID, c.OwnerID); err != nil {
		return nil, err
	}
	if hook := failpoints.beforeStart; hook != nil {
		if err := hook(st.MapID, 0); err != nil {
			return nil, err
		}
	}
	existing, err := ms.readMeta(ctx, st.MapID)
	if err != nil {
		return nil, err
	}
	if !existing.exists && m.cfg.Pages == nil {
		all, err := items(ctx, 0, st.Total-1)
		if err != nil {
			return nil, err
		}
		if err := ms.pushSource(ctx, st.MapID, all); err != nil {
			return nil, err
		}
	}
	created, offset, err := ms.start(ctx, st.MapID, md)
	if err != nil {
		return nil, err
	}
	if created {
		claimedBatch(ctx, e, md, engine.EventMapBatchClaimed)
		first, err := items(ctx, 0, offset-1)
		if err != nil {
			return nil, err
		}
		if err := dispatch(ctx, e, md, st.MapID, 0, first); err != nil {
			return nil, err
		}
		return nil, engine.Dispatch()
	}
	return m.resume(ctx, c, ms, st)
}

// resume is the owner re-entering its map step: adopt a settled map, or
// hand off again without dispatching anything.
func (m *construct) resume(ctx context.Context, c *engine.ConstructContext, ms mapStore, st state) (codec.Raw, error) {
	if !st.FanOut {
		// start is idempotent: it creates the map if a crash came between
		// the save and the start script, and finds it otherwise.
		return m.reopen(ctx, c, ms, st)
	}
	md, err := ms.readMeta(ctx, st.MapID)
	if err != nil {
		return nil, err
	}
	if !md.exists {
		// Saved, then crashed before the start script: act now.
		return m.reopen(ctx, c, ms, st)
	}
	if !md.settled() {
		return nil, engine.Dispatch()
	}
	return adopt(ctx, c, ms, st, md)
}

// reopen re-derives a saved map's items and acts on it again.
func (m *construct) reopen(ctx context.Context, c *engine.ConstructContext, ms mapStore, st state) (codec.Raw, error) {
	var args map[string]codec.Raw
	if err := codec.Unmarshal(c.Args, &args); err != nil {
		return nil, engine.Permanent(fmt.Errorf("mapstep: decode arguments: %w", err))
	}
	_, items, err := m.openItems(ctx, args, st.Total)
	if err != nil {
		return nil, err
	}
	return m.begin(ctx, c, ms, st, args, items)
}

// adopt turns a settled map into the step's result: the failing element's
// Failure for an atomic failure, else a Result. Failed elements rolled
// themselves back: what they hold goes to the owner (Hold).
func adopt(ctx context.Context, c *engine.ConstructContext, ms mapStore, st state, md meta) (codec.Raw, error) {
	if st.FanOut {
		ms.unindex(ctx, st.MapID, md.Owner)
	}
	if md.Failures > 0 || md.Failed {
		held, err := ms.held(ctx, st.MapID)
		if err != nil {
			return nil, err
		}
		c.Hold(held)
	}
	if md.Atomic && md.Failed {
		outs, err := ms.results(ctx, st.MapID, md.FailedIndex, md.FailedIndex)
		if err != nil {
			return nil, err
		}
		if o := outs[0]; o != nil && o.Failure != nil {
			return nil, elementFailure(md.Step, md.FailedIndex, o.Failure)
		}
		return nil, engine.Permanent(fmt.Errorf("mapstep: element %d of map %s failed", md.FailedIndex, st.MapID))
	}
	return codec.Marshal(Result{MapID: st.MapID, Total: st.Total, Failed: md.Failures})
}

// elementFailure is the map step's failure for element i's failure: the
// element's error and the failures of its own rollback (a failed element
// rolls itself back), each with the step path leading to it. The element
// run named them relative to itself ("reserve"); in the owner's Failure
// they must say which element ("each[20]/reserve"), as the map's rollback
// failures do (rollbackElementWith). Inline and fan-out maps both adopt
// through here, so both name them alike.
func elementFailure(step string, i int, f *engine.Failure) *engine.Failure {
	out := *f
	path := elementPath(step, i)
	out.Step = path + "/" + f.Step
	out.RollbackFailures = make([]engine.RollbackFailure, len(f.RollbackFailures))
	for j, rf := range f.RollbackFailures {
		rf.Step = path + "/" + rf.Step
		out.RollbackFailures[j] = rf
	}
	if len(out.RollbackFailures) == 0 {
		out.RollbackFailures = nil
	}
	return &out
}

// CancelCheckInterval is how often, at most, an inline map reads whether its
// run was asked to cancel (Engine.Cancel, a dashboard's cancel), between two
// elements: before its first element, then before each element that starts
// at least this long after the last read. A cancel stops the map before its
// next element once the interval or the element in progress is over,
// whichever is later; the run then undoes the elements that completed. The
// interval keeps the read off the path of small elements (one read per
// hundred 1 ms elements instead of one per element, each of which already
// costs a few round trips), while a slow element is followed by a read every
// time.
const CancelCheckInterval = 100 * time.Millisecond

// runInline runs the elements one after another in this process, recording
// each outcome as it settles, so a crash resumes after the last settled
// element. It honours a cancel request between elements (see
// CancelCheckInterval).
func (m *construct) runInline(ctx context.Context, c *engine.ConstructContext, ms mapStore, st state, items itemsFunc) (codec.Raw, error) {
	md, err := ms.readMeta(ctx, st.MapID)
	if err != nil {
		return nil, err
	}
	const chunk = 100
	var checked time.Time // when the run's cancel request was last read
	for from := 0; from < st.Total && !(md.Atomic && md.Failed); from += chunk {
		to := min(from+chunk, st.Total) - 1
		done, err := ms.results(ctx, st.MapID, from, to)
		if err != nil {
			return nil, err
		}
		var chunkItems []codec.Raw
		for i := from; i <= to; i++ {
			if done[i-from] != nil {
				continue
			}
			if chunkItems == nil { // fetched only for a chunk with work left
				if chunkItems, err = items(ctx, from, to); err != nil {
					return nil, err
				}
			}
			if time.Since(checked) >= CancelCheckInterval {
				// Between elements: a cancel stops the map here, and the
				// run rolls back the elements settled so far.
				cancel, err := c.CancelRequested(ctx)
				if err != nil {
					return nil, err
				}
				if cancel {
					return nil, engine.ErrCancelRequested
				}
				checked = time.Now()
			}
			o, err := runInlineElement(ctx, c.Engine, m.cfg.Element, md, st.MapID, i, chunkItems[i-from])
			if err != nil {
				return nil, err
			}
			if _, err := ms.settle(ctx, st.MapID, i, o); err != nil {
				return nil, err
			}
			if o.Status == outcomeFailed {
				md.Failures++
				if md.Atomic {
					md.Failed, md.FailedIndex = true, i
					break
				}
			}
		}
	}
	return adopt(ctx, c, ms, st, md)
}

// runElement executes element i (or reads its stored result).
func runElement(ctx context.Context, e *engine.Engine, def *engine.Definition, md meta, mapID string, i int, item codec.Raw) (outcome, error) {
	inputs := map[string]codec.Raw{}
	if len(md.With) > 0 {
		if err := codec.Unmarshal(md.With, &inputs); err != nil {
			return outcome{}, err
		}
	}
	inputs[md.Input] = item
	ctx = runctx.WithElement(ctx, runctx.Element{Owner: md.Owner, Step: md.Step, Index: i, Trace: md.Trace, Sensitive: md.Sensitive, Legacy: md.Layout < 2})
	res, err := engine.ExecuteElement(e, ctx, def, ElementID(mapID, i), inputs)
	if errors.Is(err, engine.ErrLockLost) {
		// The element's lock, not the owner's: for the caller this element
		// is held elsewhere (a worker snoozes, an inline map waits).
		return outcome{}, fmt.Errorf("mapstep: element %d of %s: %v: %w", i, mapID, err, engine.ErrRunLocked)
	}
	var ie *engine.InputError
	if errors.As(err, &ie) {
		f := &engine.Failure{Step: "", Message: ie.Error()}
		return outcome{Status: outcomeFailed, Failure: f}, nil
	}
	if err != nil {
		return outcome{}, err
	}
	if res.Status == engine.StatusPaused {
		// Waiting at an interrupt: nothing to settle; its continue (or
		// its timer) delivers its task again.
		return outcome{}, errElemPaused
	}
	if elementStopped(res) {
		// A stopped settle sealed the element before this delivery got
		// to it: it never ran, and its position is (being) settled stopped.
		return outcome{Status: outcomeStopped}, nil
	}
	return outcomeOf(res), nil
}

// elementStopped reports whether res is an element run that a stopped
// settle created finished (reactor.Engine.StopElement): it never ran.
func elementStopped(res *engine.Result) bool {
	return res.Status == engine.StatusCancelled && res.Failure != nil && errors.Is(res.Failure, engine.ErrElementStopped)
}

// runInlineElement runs element i of an inline map, waiting while its lock
// is held: after the process that ran the map lost it mid-element (crash,
// lost owner lock), the element's lock lives on until it expires, and
// ErrRunLocked returned from the construct would fail the map step instead
// of resuming it. Only ctx (the owner's run) bounds the wait; the owner's
// lock guarantees no other execution of this map holds the element for
// long.
func runInlineElement(ctx context.Context, e *engine.Engine, def *engine.Definition, md meta, mapID string, i int, item codec.Raw) (outcome, error) {
	delay := 10 * time.Millisecond
	for {
		o, err := runElement(ctx, e, def, md, mapID, i, item)
		if !errors.Is(err, engine.ErrRunLocked) {
			return o, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return outcome{}, err
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}
