package inspect

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
)

// The settle scripts are mapcore's; these tests run their sources (the
// files mapcore embeds) on a real Redis, so that the element states they
// keep are checked against the full read of the results hashes they write.
func script(t testing.TB, names ...string) *redis.Script {
	t.Helper()
	var src string
	for _, n := range names {
		b, err := os.ReadFile("../mapcore/lua/" + n)
		require.NoError(t, err)
		src += string(b)
	}
	return redis.NewScript(src)
}

type scripts struct {
	start, claim, settle, finish, rbStart *redis.Script
}

func loadScripts(t testing.TB) scripts {
	return scripts{start: script(t, "start.lua"), claim: script(t, "claim.lua"), settle: script(t, "batch.lua", "settle.lua"),
		finish: script(t, "batch.lua", "elem_finish.lua"), rbStart: script(t, "rb_start.lua")}
}

// fwdOutcome and rbOutcomeFull are mapstep's encodings (mapstep/outcome.go,
// mapstep/rollback.go) with the fields that change their length.
type fwdOutcome struct {
	Status  string          `msgpack:"s"`
	Value   codec.Raw       `msgpack:"v,omitempty"`
	Failure *engine.Failure `msgpack:"f,omitempty"`
	Reason  string          `msgpack:"r,omitempty"`
}

type rbOutcomeFull struct {
	Index    int                      `msgpack:"i"`
	Outcome  string                   `msgpack:"o"`
	Failures []engine.RollbackFailure `msgpack:"f,omitempty"`
}

var (
	fwdStatuses = []string{"ok", "ok", "ok", "failed", "halted", "skipped", "stopped"}
	rbOutcomes  = []string{"undone", "undone", "not_needed", "failed", "context_unavailable", "element_in_flight"}
)

// history drives one map through the real scripts: its forward pass,
// settles of random claimed positions (re-deliveries among them, through
// settle.lua and through elem_finish.lua, a resend of the same write too),
// then up to three rollback generations, each over what the previous one
// could not undo, with forward settles of unsettled elements in between.
type history struct {
	t      *testing.T
	ctx    context.Context
	rdb    redis.UniversalClient
	k      keys.Keys
	s      scripts
	rng    *rand.Rand
	id     string
	total  int
	batch  int
	atomic bool
	seed   uint64
	r      *Reader
	tokens int
}

func (h *history) run(script *redis.Script, keys []string, args ...any) []any {
	h.t.Helper()
	res, err := script.Run(h.ctx, h.rdb, keys, args...).Slice()
	require.NoError(h.t, err, "seed %d", h.seed)
	return res
}

func (h *history) offset(key string) int {
	n, _ := h.rdb.Get(h.ctx, key).Int()
	return n
}

func (h *history) settled(meta string) int {
	n, _ := h.rdb.HGet(h.ctx, meta, "settled").Int()
	return n
}

// settleFwd settles forward position p with a random status, by either
// script; a position already settled is a re-delivery.
func (h *history) settleFwd(p int) {
	o := fwdOutcome{Status: fwdStatuses[h.rng.IntN(len(fwdStatuses))]}
	switch o.Status {
	case "ok":
		if h.rng.IntN(2) == 0 {
			o.Value = codec.Raw{0xa3, 'a', 'b', 'c'}
		}
	case "failed":
		o.Failure = &engine.Failure{Step: "s", Message: "no"}
	case "halted":
		o.Reason = "enough"
	}
	enc, err := codec.Marshal(o)
	require.NoError(h.t, err)
	fail := map[bool]string{true: "1", false: "0"}[o.Status == "failed"]
	k, id := h.k, h.id
	if h.rng.IntN(2) == 0 {
		h.run(h.s.settle, []string{k.MapMeta(id), k.MapOffset(id), k.MapResults(id), k.MapFailed(id), k.MapSignalled(id), k.MapStates(id)},
			p, enc, fail, "f")
		return
	}
	h.finish(p, []string{k.MapMeta(id), k.MapOffset(id), k.MapResults(id), k.MapFailed(id), k.MapSignalled(id)},
		p, enc, fail, h.total, h.batch, map[bool]string{true: "1", false: "0"}[h.atomic], "f", "")
}

// finish runs elem_finish.lua for element i as its run's holder, and
// sometimes sends the same write again (a resend after a lost reply).
func (h *history) finish(i int, mapKeys []string, pos int, enc []byte, fail string, total, batch int, atomic, dir, name string) (stored int64) {
	el := h.id + "." + strconv.Itoa(i)
	state, lock := h.k.ElemState(el), h.k.ElemLock(el)
	h.tokens++
	token := "tok-" + strconv.Itoa(h.tokens)
	require.NoError(h.t, h.rdb.Set(h.ctx, lock, token, time.Minute).Err())
	v, _ := h.rdb.HGet(h.ctx, state, "v").Int()
	keys := append([]string{state, lock, h.k.MapAudit(h.id)}, mapKeys...)
	keys = append(keys, h.k.MapStates(h.id))
	args := []any{token, v, "d", "0", "nonce-" + token, 100, pos, enc, fail, total, batch, atomic, dir, name, 0}
	first := h.run(h.s.finish, keys, args...)
	if h.rng.IntN(4) == 0 {
		again := h.run(h.s.finish, keys, args...)
		require.Equal(h.t, first[3:], again[3:], "seed %d: a resend returns what the first send settled", h.seed)
	}
	return first[3].(int64)
}

// forward settles random claimed positions, claiming the next batch as
// the sweeper would when a trigger was lost, for a random number of steps.
func (h *history) forward(steps int) {
	k, id := h.k, h.id
	for range steps {
		off := h.offset(k.MapOffset(id))
		if off == 0 {
			return
		}
		if h.settled(k.MapMeta(id)) >= off && off < h.total {
			h.run(h.s.claim, []string{k.MapMeta(id), k.MapOffset(id), k.MapFailed(id)}, off)
		}
		h.settleFwd(h.rng.IntN(off))
	}
}

// rollback runs generation gen over idx (the elements of its positions)
// to the end, settling random positions (re-deliveries among them) and
// now and then a forward position; it returns the elements left to a next
// generation.
func (h *history) rollback(gen int, idx []int) []int {
	k, id := h.k, h.id
	total := len(idx)
	if total == 0 {
		return nil
	}
	batch := 1 + h.rng.IntN(8)
	h.run(h.s.rbStart, []string{k.MapRbMeta(id, gen), k.MapRbOffset(id, gen), k.MapMeta(id)},
		total, batch, 0, gen, map[bool]string{true: "1", false: "0"}[gen > 1], 0)
	rbKeys := []string{k.MapRbMeta(id, gen), k.MapRbOffset(id, gen), k.MapRbResults(id, gen), k.MapRbHandedOff(id, gen), k.MapRbSignalled(id, gen)}
	outcome := map[int]string{} // by position: the first writer's
	for len(outcome) < total {
		off := h.offset(k.MapRbOffset(id, gen))
		if h.settled(k.MapRbMeta(id, gen)) >= off && off < total {
			h.run(h.s.claim, []string{k.MapRbMeta(id, gen), k.MapRbOffset(id, gen)}, off)
			off = h.offset(k.MapRbOffset(id, gen))
		}
		if h.rng.IntN(8) == 0 {
			h.settleFwd(h.rng.IntN(max(h.offset(k.MapOffset(id)), 1)))
		}
		p := h.rng.IntN(off)
		o := rbOutcomeFull{Index: idx[p], Outcome: rbOutcomes[h.rng.IntN(len(rbOutcomes))]}
		if o.Outcome == "failed" {
			o.Failures = []engine.RollbackFailure{{Step: "s", Message: "undo failed"}}
		}
		enc, err := codec.Marshal(o)
		require.NoError(h.t, err)
		fail := map[bool]string{true: "1", false: "0"}[o.Outcome == "failed"]
		var stored int64
		if h.rng.IntN(2) == 0 {
			stored = h.run(h.s.settle, append(rbKeys, k.MapStates(id)), p, enc, fail, "r", o.Outcome)[0].(int64)
		} else {
			stored = h.finish(o.Index, rbKeys, p, enc, fail, total, batch, "0", "r", o.Outcome)
		}
		if _, had := outcome[p]; !had {
			require.EqualValues(h.t, 1, stored, "seed %d: the first settle of position %d stores", h.seed, p)
			outcome[p] = o.Outcome
		} else {
			require.EqualValues(h.t, 0, stored, "seed %d: a repeated settle of position %d stores nothing", h.seed, p)
		}
		if h.rng.IntN(16) == 0 {
			h.check()
		}
	}
	var next []int
	for p, o := range outcome {
		if o == "failed" || o == "context_unavailable" || o == "element_in_flight" {
			next = append(next, idx[p])
		}
	}
	return next
}

// check compares the summary from the element states with the full read.
func (h *history) check() {
	h.t.Helper()
	c := mapCmds{}
	_, err := h.rdb.Pipelined(h.ctx, func(p redis.Pipeliner) error { c = h.r.queue(h.ctx, p, h.id); return nil })
	require.NoError(h.t, pipeErr(err))
	m, gen, ok := c.parse(h.id)
	require.True(h.t, ok)
	require.NoError(h.t, h.r.current(h.ctx, []*Map{&m}, []int{gen}))
	got, ok, err := h.r.fromStates(h.ctx, m)
	require.NoError(h.t, err)
	require.True(h.t, ok, "seed %d: the element states are complete", h.seed)
	want, err := h.r.fromResults(h.ctx, m, gen)
	require.NoError(h.t, err)
	require.Equal(h.t, want, got, "seed %d: element states differ from the results hashes", h.seed)
}

func newHistory(t *testing.T, rdb redis.UniversalClient, prefix string, s scripts, seed uint64, n int) *history {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	h := &history{t: t, ctx: context.Background(), rdb: rdb, k: keys.New(prefix), s: s, rng: rng, seed: seed, r: New(rdb, prefix),
		id: fmt.Sprintf("m%d", n), total: 1 + rng.IntN(60), batch: 1 + rng.IntN(10), atomic: rng.IntN(3) == 0}
	return h
}

func (h *history) startMap() {
	k := h.k
	h.run(h.s.start, []string{k.MapMeta(h.id), k.MapOffset(h.id)}, h.total, h.batch, map[bool]string{true: "1", false: "0"}[h.atomic],
		"owner", "owner-r", "elem-r", "each", "", "item", "1", "0", "", "0", "", "", "inc")
}

// A seeded generator of settle histories (forward settles by either script,
// re-deliveries and resends, forward settles during a rollback, rollback
// generations over what the previous could not undo) run on the real
// scripts: after every phase, and at random points within, the summary the
// element states give equals the one the full read of the results hashes
// gives. GOREACTOR_STATES_SEED replays one history, GOREACTOR_STATES_N sets
// how many (default 200, 40 with -short).
func TestElementStatesMatchTheResults(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	k := keys.New(prefix)
	s := loadScripts(t)
	n := 200
	if testing.Short() {
		n = 40
	}
	if v := os.Getenv("GOREACTOR_STATES_N"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	seeds := make([]uint64, n)
	base := uint64(time.Now().UnixNano())
	for j := range seeds {
		seeds[j] = base + uint64(j)
	}
	if v := os.Getenv("GOREACTOR_STATES_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		seeds = []uint64{seed}
	}
	t.Logf("seeds %d..%d (GOREACTOR_STATES_SEED=<seed> replays one)", seeds[0], seeds[len(seeds)-1])
	for j, seed := range seeds {
		h := newHistory(t, rdb, prefix, s, seed, j)
		h.startMap()
		h.check()
		h.forward(h.rng.IntN(3 * h.total))
		h.check()
		if h.rng.IntN(4) == 0 {
			continue // no rollback
		}
		// The first generation: the claimed forward positions, newest
		// first (position p undoes element claimed-1-p).
		claimed := min(h.offset(k.MapOffset(h.id)), h.total)
		idx := make([]int, claimed)
		for p := range idx {
			idx[p] = claimed - 1 - p
		}
		for gen := 1; gen <= 3 && len(idx) > 0; gen++ {
			idx = h.rollback(gen, idx)
			h.check()
		}
	}
}

// A map whose settles did not all keep element states (started before the
// settle scripts kept them, or settled in part by a process that did not)
// is summarised from its results hashes, as before; once its states are
// complete, from them.
func TestSummaryFallsBackWithoutStates(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	s := loadScripts(t)
	h := newHistory(t, rdb, prefix, s, 1, 0)
	h.total, h.batch, h.atomic = 10, 10, false
	h.startMap()
	k, id, ctx := h.k, h.id, h.ctx
	ok, err := codec.Marshal(fwdOutcome{Status: "ok"})
	require.NoError(t, err)
	bad, err := codec.Marshal(fwdOutcome{Status: "failed", Failure: &engine.Failure{Step: "s", Message: "no"}})
	require.NoError(t, err)
	// Elements 0-3 settled the way the scripts did before they kept states
	// (the outcome and the counter, nothing else).
	for i := range 4 {
		enc := ok
		if i == 2 {
			enc = bad
		}
		require.NoError(t, rdb.HSet(ctx, k.MapResults(id), strconv.Itoa(i), enc).Err())
		require.NoError(t, rdb.HIncrBy(ctx, k.MapMeta(id), "settled", 1).Err())
	}
	// Element 4 by today's script.
	h.run(s.settle, []string{k.MapMeta(id), k.MapOffset(id), k.MapResults(id), k.MapFailed(id), k.MapSignalled(id), k.MapStates(id)}, 4, ok, "0", "f")

	r := New(rdb, prefix)
	read := func() (Map, []uint8, bool) {
		pic, found, err := r.Read(ctx, id, 0, 10)
		require.NoError(t, err)
		require.True(t, found)
		got, ok, err := r.fromStates(ctx, pic.Map)
		require.NoError(t, err)
		require.Len(t, pic.Cells, 10)
		want := []string{StateCompleted, StateCompleted, StateFailed, StateCompleted, StateCompleted}
		for i, c := range pic.Cells {
			st := StateRunning
			if i < len(want) {
				st = want[i]
			}
			require.Equal(t, 1, c.Counts[st], "element %d is %s", i, st)
		}
		return pic.Map, got, ok
	}
	_, _, complete := read()
	require.False(t, complete, "a map settled in part without states is read from its results")

	// The same map once every settle kept its state (the states a
	// process of today would have written): read from them.
	for i := range 4 {
		code := 1
		if i == 2 {
			code = 2
		}
		require.NoError(t, rdb.BitField(ctx, k.MapStates(id), "SET", "u4", "#"+strconv.Itoa(2*i), code).Err())
	}
	r.Forget()
	m, got, complete := read()
	require.True(t, complete)
	want, err := r.fromResults(ctx, m, 1)
	require.NoError(t, err)
	require.Equal(t, want, got)
}
