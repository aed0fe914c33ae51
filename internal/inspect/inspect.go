// Package inspect reads a map's picture from the map's own keys (meta,
// offsets, results, rollback results, element states) for the dashboard: progress counters,
// a page of element outcomes and a bucketed summary, never by loading
// element runs (DESIGN 8.1).
//
// The encodings it decodes are mapstep's (mapstep/outcome.go, the outcome
// type; mapstep/rollback.go, rbOutcome and the rb meta counters); the
// dashboard's tests run real maps through mapstep so that a change there
// shows up here.
package inspect

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
)

// A map's rollback may have several generations (mapstep: a re-triggered
// rollback starts one over the elements the previous one could not undo);
// the map meta's rbgen field names the current one. The reader reports the
// current generation's counters, and an element's rollback outcome is its
// newest: the first generation's by position (position p undoes element
// total-1-p), overlaid by each later generation's outcomes, which name their
// element.

// Element states, the closed set the dashboard draws.
const (
	StatePending     = "pending"
	StateRunning     = "running"
	StateCompleted   = "completed"
	StateFailed      = "failed"
	StateUndone      = "undone"
	StateUndoFailed  = "undo_failed"
	StateUnavailable = "unavailable"
)

// States lists the element states in drawing order.
var States = []string{StatePending, StateRunning, StateCompleted, StateFailed, StateUndone, StateUndoFailed, StateUnavailable}

// Map is a map's metadata and counters.
type Map struct {
	ID      string
	Step    string
	Owner   string
	FanOut  bool
	Total   int
	Offset  int // dispatched (fan-out) or due to run (inline)
	Settled int
	Failed  int
	// Rollback is set once the map's rollback started: its current
	// generation.
	Rollback *Rollback

	firstRbTotal int // the first generation's total (its positions map to elements)
}

// Rollback is a map rollback's counters.
type Rollback struct {
	Generation                  int
	Total, Offset, Settled, Bad int
}

// Reader reads maps under one key prefix.
type Reader struct {
	rdb  redis.UniversalClient
	keys keys.Keys

	mu    sync.Mutex
	cache map[string]summaryEntry // by map id
}

// New returns a Reader.
func New(rdb redis.UniversalClient, prefix string) *Reader {
	return &Reader{rdb: rdb, keys: keys.New(prefix), cache: map[string]summaryEntry{}}
}

type mapCmds struct {
	meta, rbMeta  *redis.MapStringStringCmd
	offset, rbOff *redis.StringCmd
}

func (r *Reader) queue(ctx context.Context, p redis.Pipeliner, id string) mapCmds {
	return mapCmds{
		meta:   p.HGetAll(ctx, r.keys.MapMeta(id)),
		offset: p.Get(ctx, r.keys.MapOffset(id)),
		rbMeta: p.HGetAll(ctx, r.keys.MapRbMeta(id, 1)),
		rbOff:  p.Get(ctx, r.keys.MapRbOffset(id, 1)),
	}
}

func atoi(m map[string]string, k string) int { n, _ := strconv.Atoi(m[k]); return n }

func rollbackOf(gen int, rb map[string]string, offset string) *Rollback {
	if len(rb) == 0 {
		return nil
	}
	out := &Rollback{Generation: gen, Total: atoi(rb, "total"), Settled: atoi(rb, "settled"), Bad: atoi(rb, "failed")}
	out.Offset, _ = strconv.Atoi(offset)
	return out
}

// parse returns the map and its current rollback generation (when it is
// not the first, m.Rollback is the first's until current reads it).
func (c mapCmds) parse(id string) (Map, int, bool) {
	f := c.meta.Val()
	if len(f) == 0 {
		return Map{}, 0, false
	}
	m := Map{ID: id, Step: f["step"], Owner: f["owner"], FanOut: f["fanout"] == "1", Total: atoi(f, "total"),
		Settled: atoi(f, "settled"), Failed: atoi(f, "failures")}
	m.Offset, _ = strconv.Atoi(c.offset.Val())
	m.Rollback = rollbackOf(1, c.rbMeta.Val(), c.rbOff.Val())
	if m.Rollback != nil {
		m.firstRbTotal = m.Rollback.Total
	}
	return m, max(atoi(f, "rbgen"), 1), true
}

// current reads the counters of the current rollback generation of the
// maps whose current generation is not the first (gens[i] for ms[i]), in
// one round trip (none when there are none).
func (r *Reader) current(ctx context.Context, ms []*Map, gens []int) error {
	type later struct {
		m      *Map
		gen    int
		meta   *redis.MapStringStringCmd
		offset *redis.StringCmd
	}
	var ls []later
	for i, m := range ms {
		if gens[i] > 1 {
			ls = append(ls, later{m: m, gen: gens[i]})
		}
	}
	if len(ls) == 0 {
		return nil
	}
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range ls {
			ls[i].meta = p.HGetAll(ctx, r.keys.MapRbMeta(ls[i].m.ID, ls[i].gen))
			ls[i].offset = p.Get(ctx, r.keys.MapRbOffset(ls[i].m.ID, ls[i].gen))
		}
		return nil
	}); pipeErr(err) != nil {
		return fmt.Errorf("inspect: read the rollbacks of maps: %w", err)
	}
	for _, l := range ls {
		if rb := rollbackOf(l.gen, l.meta.Val(), l.offset.Val()); rb != nil {
			l.m.Rollback = rb
		}
	}
	return nil
}

func pipeErr(err error) error {
	if err == nil || err == redis.Nil {
		return nil
	}
	return err
}

// RunMaps returns the maps run id's steps started (its run tree's map ids,
// those of composed children included), by map id, in two round trips.
func (r *Reader) RunMaps(ctx context.Context, id string) ([]Map, error) {
	ids, err := r.rdb.SMembers(ctx, r.keys.RunTree(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("inspect: read the maps of run %s: %w", id, err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	slices.Sort(ids)
	cmds := make([]mapCmds, len(ids))
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, mid := range ids {
			cmds[i] = r.queue(ctx, p, mid)
		}
		return nil
	}); pipeErr(err) != nil {
		return nil, fmt.Errorf("inspect: read the maps of run %s: %w", id, err)
	}
	out := make([]Map, 0, len(ids))
	var gens []int
	for i, mid := range ids {
		if m, gen, ok := cmds[i].parse(mid); ok {
			out = append(out, m)
			gens = append(gens, gen)
		}
	}
	ptrs := make([]*Map, len(out))
	for i := range out {
		ptrs[i] = &out[i]
	}
	if err := r.current(ctx, ptrs, gens); err != nil {
		return nil, err
	}
	return out, nil
}

// Element is one element's state.
type Element struct {
	Index int
	// State is one of States.
	State string
	// Error is the element's failure message, its halt reason, or its
	// rollback failures' messages.
	Error string
	// RollbackOutcome is the element's rollback outcome (undone,
	// not_needed, failed, context_unavailable), "" before it has one.
	RollbackOutcome string
}

// Cell counts the states of the elements from From to To (inclusive).
type Cell struct {
	From, To int
	Counts   map[string]int
}

// Picture is a map's elements page and its summary.
type Picture struct {
	Map        Map
	Elements   []Element
	BucketSize int
	Cells      []Cell
}

// outcome mirrors mapstep's outcome (mapstep/outcome.go).
type outcome struct {
	Status  string          `msgpack:"s"`
	Failure *engine.Failure `msgpack:"f,omitempty"`
	Reason  string          `msgpack:"r,omitempty"`
}

// rbOutcome mirrors mapstep's rbOutcome (mapstep/rollback.go).
type rbOutcome struct {
	Index    int                      `msgpack:"i"`
	Outcome  string                   `msgpack:"o"`
	Failures []engine.RollbackFailure `msgpack:"f,omitempty"`
}

// statusOnly decodes no more of an outcome than its status.
type statusOnly struct {
	Status string `msgpack:"s"`
}

type rbOutcomeOnly struct {
	Index   int    `msgpack:"i"`
	Outcome string `msgpack:"o"`
}

// MaxCells bounds a summary's cells.
const MaxCells = 1000

// Read returns map mapID's picture: the elements from..from+limit-1 and the
// summary of every element in at most MaxCells cells. ok is false when the
// map has no keys (never started, or expired with its run).
//
// The page costs one round trip (two once the map rolls back). The summary
// is read again only when the map's counters moved since the last summary
// of it (a results hash only grows in the scripts that bump those
// counters, so equal counters mean an equal picture), from the map's
// element states (one GET of a byte per element, states.go), or, for a map
// whose settles did not all keep them, from the whole results hashes.
func (r *Reader) Read(ctx context.Context, mapID string, from, limit int) (pic Picture, ok bool, err error) {
	var c mapCmds
	to := from + limit - 1
	fields := make([]string, 0, limit)
	for i := from; i <= to; i++ {
		fields = append(fields, strconv.Itoa(i))
	}
	var page *redis.SliceCmd
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		c = r.queue(ctx, p, mapID)
		page = p.HMGet(ctx, r.keys.MapResults(mapID), fields...)
		return nil
	}); pipeErr(err) != nil {
		return pic, false, fmt.Errorf("inspect: read map %s: %w", mapID, err)
	}
	m, gen, ok := c.parse(mapID)
	if !ok {
		return pic, false, nil
	}
	if err := r.current(ctx, []*Map{&m}, []int{gen}); err != nil {
		return pic, false, err
	}
	pic.Map = m
	// The page's rollback outcomes: the first generation's by position
	// (position p undoes element total-1-p), then each later generation's
	// (only the elements an earlier one could not undo) over them.
	rbPage := make([]any, len(fields))
	if m.Rollback != nil && from < m.Total {
		pos := make([]string, 0, len(fields))
		for i := from; i <= min(to, m.Total-1); i++ {
			pos = append(pos, strconv.Itoa(m.firstRbTotal-1-i))
		}
		var first *redis.SliceCmd
		var later []*redis.MapStringStringCmd
		if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			first = p.HMGet(ctx, r.keys.MapRbResults(mapID, 1), pos...)
			for g := 2; g <= gen; g++ {
				later = append(later, p.HGetAll(ctx, r.keys.MapRbResults(mapID, g)))
			}
			return nil
		}); pipeErr(err) != nil {
			return pic, false, fmt.Errorf("inspect: read the rollback of map %s: %w", mapID, err)
		}
		copy(rbPage, first.Val())
		for _, l := range later {
			for _, v := range l.Val() {
				var o rbOutcomeOnly
				if err := codec.Unmarshal([]byte(v), &o); err != nil {
					return pic, false, fmt.Errorf("inspect: decode a rollback result of %s: %w", mapID, err)
				}
				if o.Index >= from && o.Index <= to && o.Index < m.Total {
					rbPage[o.Index-from] = v
				}
			}
		}
	}
	sum, err := r.summary(ctx, m, gen)
	if err != nil {
		return pic, false, err
	}
	pic.BucketSize, pic.Cells = sum.bucket, sum.cells
	for k, i := 0, from; i <= min(to, m.Total-1); k, i = k+1, i+1 {
		el := Element{Index: i, State: fwdState(i, m.Offset)}
		if v, ok := page.Val()[k].(string); ok {
			var o outcome
			if err := codec.Unmarshal([]byte(v), &o); err != nil {
				return pic, false, fmt.Errorf("inspect: decode result %s[%d]: %w", mapID, i, err)
			}
			el.State = forwardState(o.Status)
			switch {
			case o.Failure != nil:
				el.Error = o.Failure.Message
			case o.Reason != "":
				el.Error = o.Reason
			}
		}
		if v, ok := rbPage[k].(string); ok {
			var o rbOutcome
			if err := codec.Unmarshal([]byte(v), &o); err != nil {
				return pic, false, fmt.Errorf("inspect: decode a rollback result of %s: %w", mapID, err)
			}
			el.RollbackOutcome = o.Outcome
			el.State = rollbackState(o.Outcome, el.State)
			if len(o.Failures) > 0 {
				msgs := make([]string, len(o.Failures))
				for j, f := range o.Failures {
					msgs[j] = f.Step + ": " + f.Message
				}
				if el.Error != "" {
					el.Error += "; "
				}
				el.Error += "rollback: " + strings.Join(msgs, "; ")
			}
		}
		pic.Elements = append(pic.Elements, el)
	}
	return pic, true, nil
}

// counters is what a summary was computed at.
type counters struct {
	total, offset, settled, failed      int
	rbGen, rbTotal, rbOffset, rbSettled int
}

func countersOf(m Map) counters {
	c := counters{total: m.Total, offset: m.Offset, settled: m.Settled, failed: m.Failed}
	if rb := m.Rollback; rb != nil {
		c.rbGen, c.rbTotal, c.rbOffset, c.rbSettled = rb.Generation, rb.Total, rb.Offset, rb.Settled
	}
	return c
}

type summaryEntry struct {
	at     counters
	bucket int
	cells  []Cell
}

// maxCached bounds the summaries kept (one per map being watched).
const maxCached = 64

// summary returns m's bucketed summary, from the cache when m's counters
// have not moved.
func (r *Reader) summary(ctx context.Context, m Map, gens int) (summaryEntry, error) {
	at := countersOf(m)
	r.mu.Lock()
	if e, ok := r.cache[m.ID]; ok && e.at == at {
		r.mu.Unlock()
		return e, nil
	}
	r.mu.Unlock()
	state, ok, err := r.fromStates(ctx, m)
	if err != nil {
		return summaryEntry{}, err
	}
	if !ok {
		if state, err = r.fromResults(ctx, m, gens); err != nil {
			return summaryEntry{}, err
		}
	}
	e := summaryEntry{at: at, bucket: max(1, (m.Total+MaxCells-1)/MaxCells)}
	for lo := 0; lo < m.Total; lo += e.bucket {
		hi := min(lo+e.bucket, m.Total) - 1
		var n [7]int
		for i := lo; i <= hi; i++ {
			n[state[i]]++
		}
		cell := Cell{From: lo, To: hi, Counts: make(map[string]int, len(States))}
		for k, s := range States {
			cell.Counts[s] = n[k]
		}
		e.cells = append(e.cells, cell)
	}
	r.mu.Lock()
	if len(r.cache) >= maxCached {
		for k := range r.cache {
			delete(r.cache, k)
			break
		}
	}
	r.cache[m.ID] = e
	r.mu.Unlock()
	return e, nil
}

// fromResults returns each element's state (an index into States) from the
// map's whole results hashes, forward and every rollback generation's: the
// summary's path for a map without complete element states (one started
// before the settle scripts kept them, or settled in part by a process
// that did not).
func (r *Reader) fromResults(ctx context.Context, m Map, gens int) ([]uint8, error) {
	var results *redis.MapStringStringCmd
	var rbResults []*redis.MapStringStringCmd // by generation, oldest first
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		results = p.HGetAll(ctx, r.keys.MapResults(m.ID))
		for g := 1; g <= gens && m.Rollback != nil; g++ {
			rbResults = append(rbResults, p.HGetAll(ctx, r.keys.MapRbResults(m.ID, g)))
		}
		return nil
	}); pipeErr(err) != nil {
		return nil, fmt.Errorf("inspect: read map %s: %w", m.ID, err)
	}
	total := m.Total
	state := make([]uint8, total) // index into States
	for i := range state {
		if i < m.Offset {
			state[i] = 1 // running
		}
	}
	stateIndex := map[string]uint8{}
	for k, s := range States {
		stateIndex[s] = uint8(k)
	}
	for field, v := range results.Val() {
		i, err := strconv.Atoi(field)
		if err != nil || i < 0 || i >= total {
			continue
		}
		st, ok := fastStatus(v)
		if !ok {
			var o statusOnly
			if err := codec.Unmarshal([]byte(v), &o); err != nil {
				return nil, fmt.Errorf("inspect: decode result %s[%d]: %w", m.ID, i, err)
			}
			st = o.Status
		}
		state[i] = stateIndex[forwardState(st)]
	}
	fwd := slices.Clone(state) // an element's state before any rollback
	for _, gen := range rbResults {
		for _, v := range gen.Val() {
			var o rbOutcomeOnly
			if err := codec.Unmarshal([]byte(v), &o); err != nil {
				return nil, fmt.Errorf("inspect: decode a rollback result of %s: %w", m.ID, err)
			}
			if o.Index >= 0 && o.Index < total {
				state[o.Index] = stateIndex[rollbackState(o.Outcome, States[fwd[o.Index]])]
			}
		}
	}
	return state, nil
}

// fastStatus reads the status of an encoded outcome without a decoder: a
// msgpack map (fixmap) whose first key is "s" and whose value is a short
// string, as mapstep's codec writes it. ok is false for anything else (the
// caller decodes).
func fastStatus(v string) (string, bool) {
	if len(v) < 4 || v[0]&0xf0 != 0x80 || v[1] != 0xa1 || v[2] != 's' || v[3]&0xe0 != 0xa0 {
		return "", false
	}
	n := int(v[3] & 0x1f)
	if len(v) < 4+n {
		return "", false
	}
	return v[4 : 4+n], true
}

// fwdState is the state of element i without an outcome.
func fwdState(i, offset int) string {
	if i < offset {
		return StateRunning
	}
	return StatePending
}

// rollbackState is the state of an element whose rollback outcome is
// outcome and whose forward state is fwd.
func rollbackState(outcome, fwd string) string {
	switch outcome {
	case "undone":
		return StateUndone
	case "failed":
		return StateUndoFailed
	case "context_unavailable":
		return StateUnavailable
	}
	return fwd // not_needed: nothing was applied to undo
}

// forwardState is the state of an element with forward outcome status s.
func forwardState(s string) string {
	switch s {
	case "ok", "halted", "skipped":
		return StateCompleted
	case "failed":
		return StateFailed
	}
	// stopped: settled without running because the map had failed or was
	// stopped.
	return StatePending
}

// Forget drops the cached summaries (a benchmark measures a cold read).
func (r *Reader) Forget() {
	r.mu.Lock()
	clear(r.cache)
	r.mu.Unlock()
}
