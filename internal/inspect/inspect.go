// Package inspect reads a map's picture from the map's own keys (meta,
// offsets, results, rollback results) for the dashboard: progress counters,
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

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
)

// Generation is the rollback generation the reader looks at: mapstep rolls
// a map back once per run today (its rbGen).
const Generation = 1

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
	// Rollback is set once the map's rollback started.
	Rollback *Rollback
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
}

// New returns a Reader.
func New(rdb redis.UniversalClient, prefix string) *Reader {
	return &Reader{rdb: rdb, keys: keys.New(prefix)}
}

type mapCmds struct {
	meta, rbMeta  *redis.MapStringStringCmd
	offset, rbOff *redis.StringCmd
}

func (r *Reader) queue(ctx context.Context, p redis.Pipeliner, id string) mapCmds {
	return mapCmds{
		meta:   p.HGetAll(ctx, r.keys.MapMeta(id)),
		offset: p.Get(ctx, r.keys.MapOffset(id)),
		rbMeta: p.HGetAll(ctx, r.keys.MapRbMeta(id, Generation)),
		rbOff:  p.Get(ctx, r.keys.MapRbOffset(id, Generation)),
	}
}

func (c mapCmds) parse(id string) (Map, bool) {
	f := c.meta.Val()
	if len(f) == 0 {
		return Map{}, false
	}
	atoi := func(m map[string]string, k string) int { n, _ := strconv.Atoi(m[k]); return n }
	m := Map{ID: id, Step: f["step"], Owner: f["owner"], FanOut: f["fanout"] == "1", Total: atoi(f, "total"),
		Settled: atoi(f, "settled"), Failed: atoi(f, "failures")}
	m.Offset, _ = strconv.Atoi(c.offset.Val())
	if rb := c.rbMeta.Val(); len(rb) > 0 {
		m.Rollback = &Rollback{Generation: Generation, Total: atoi(rb, "total"), Settled: atoi(rb, "settled"), Bad: atoi(rb, "failed")}
		m.Rollback.Offset, _ = strconv.Atoi(c.rbOff.Val())
	}
	return m, true
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
	for i, mid := range ids {
		if m, ok := cmds[i].parse(mid); ok {
			out = append(out, m)
		}
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
	Status  string           `msgpack:"s"`
	Failure *reactor.Failure `msgpack:"f,omitempty"`
	Reason  string           `msgpack:"r,omitempty"`
}

// rbOutcome mirrors mapstep's rbOutcome (mapstep/rollback.go).
type rbOutcome struct {
	Index    int                       `msgpack:"i"`
	Outcome  string                    `msgpack:"o"`
	Failures []reactor.RollbackFailure `msgpack:"f,omitempty"`
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
// map has no keys (never started, or expired with its run). It costs one
// round trip; the summary reads the whole results hashes (not the element
// runs).
func (r *Reader) Read(ctx context.Context, mapID string, from, limit int) (pic Picture, ok bool, err error) {
	var c mapCmds
	var results, rbResults *redis.MapStringStringCmd
	if _, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		c = r.queue(ctx, p, mapID)
		results = p.HGetAll(ctx, r.keys.MapResults(mapID))
		rbResults = p.HGetAll(ctx, r.keys.MapRbResults(mapID, Generation))
		return nil
	}); pipeErr(err) != nil {
		return pic, false, fmt.Errorf("inspect: read map %s: %w", mapID, err)
	}
	m, ok := c.parse(mapID)
	if !ok {
		return pic, false, nil
	}
	pic.Map = m
	total := m.Total
	fwd := make([]string, total) // state by index, before the rollback
	for i := range fwd {
		if i < m.Offset {
			fwd[i] = StateRunning
		} else {
			fwd[i] = StatePending
		}
	}
	for field, v := range results.Val() {
		i, err := strconv.Atoi(field)
		if err != nil || i < 0 || i >= total {
			continue
		}
		var o statusOnly
		if err := codec.Unmarshal([]byte(v), &o); err != nil {
			return pic, false, fmt.Errorf("inspect: decode result %s[%d]: %w", mapID, i, err)
		}
		fwd[i] = forwardState(o.Status)
	}
	rbOut := map[int]string{}
	rbByIndex := map[int]string{}
	for _, v := range rbResults.Val() {
		var o rbOutcomeOnly
		if err := codec.Unmarshal([]byte(v), &o); err != nil {
			return pic, false, fmt.Errorf("inspect: decode a rollback result of %s: %w", mapID, err)
		}
		if o.Index >= 0 && o.Index < total {
			rbOut[o.Index] = o.Outcome
			rbByIndex[o.Index] = v
		}
	}
	state := func(i int) string {
		switch rbOut[i] {
		case "undone":
			return StateUndone
		case "failed":
			return StateUndoFailed
		case "context_unavailable":
			return StateUnavailable
		}
		return fwd[i]
	}
	pic.BucketSize = max(1, (total+MaxCells-1)/MaxCells)
	for lo := 0; lo < total; lo += pic.BucketSize {
		hi := min(lo+pic.BucketSize, total) - 1
		cell := Cell{From: lo, To: hi, Counts: make(map[string]int, len(States))}
		for i := lo; i <= hi; i++ {
			cell.Counts[state(i)]++
		}
		pic.Cells = append(pic.Cells, cell)
	}
	// The page: decode its outcomes in full for their messages.
	for i := from; i < min(from+limit, total); i++ {
		el := Element{Index: i, State: state(i), RollbackOutcome: rbOut[i]}
		if v, ok := results.Val()[strconv.Itoa(i)]; ok {
			var o outcome
			if err := codec.Unmarshal([]byte(v), &o); err == nil {
				switch {
				case o.Failure != nil:
					el.Error = o.Failure.Message
				case o.Reason != "":
					el.Error = o.Reason
				}
			}
		}
		if v, ok := rbByIndex[i]; ok {
			var o rbOutcome
			if err := codec.Unmarshal([]byte(v), &o); err == nil && len(o.Failures) > 0 {
				msgs := make([]string, len(o.Failures))
				for k, f := range o.Failures {
					msgs[k] = f.Step + ": " + f.Message
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
