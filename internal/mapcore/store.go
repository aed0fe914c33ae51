package mapcore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/store"
)

var (
	// batch.lua is the settle shared by the scripts that settle a position,
	// forward and rollback alike; it is prepended to each of them.
	//go:embed lua/batch.lua
	batchSrc string
	//go:embed lua/start.lua
	startSrc string
	//go:embed lua/settle.lua
	settleSrc string
	//go:embed lua/elem_begin.lua
	elemBeginSrc string
	//go:embed lua/elem_finish.lua
	elemFinishSrc string
	//go:embed lua/elem_rb_load.lua
	elemRbLoadSrc string

	//go:embed lua/rb_start.lua
	rbStartSrc string
	//go:embed lua/rb_handoff.lua
	rbHandOffSrc string
	//go:embed lua/rb_locked.lua
	rbLockedSrc string

	startScript      = redis.NewScript(startSrc)
	settleScript     = redis.NewScript(batchSrc + settleSrc)
	elemBeginScript  = redis.NewScript(elemBeginSrc)
	elemFinishScript = redis.NewScript(batchSrc + elemFinishSrc)
	elemRbLoadScript = redis.NewScript(elemRbLoadSrc)
	rbStartScript    = redis.NewScript(rbStartSrc)
	rbHandOffScript  = redis.NewScript(rbHandOffSrc)
	rbLockedScript   = redis.NewScript(rbLockedSrc)
)

// mapStore is the Redis side of one engine's maps.
type mapStore struct {
	rdb  redis.UniversalClient
	keys keys.Keys
	// acks makes the writes that record an element's or a settle's
	// outcome wait for replicas (Config.ReplicaAcks); nil for none.
	acks *store.Acks
}

// eval runs a write script that records progress: with the engine's
// replica acknowledgements, if it asks for them (store.Eval).
func (s mapStore) eval(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	return store.Eval(store.WithAcks(ctx, s.acks), s.rdb, sc, keys, args...)
}

// setHeld records what element index holds after its rollbacks, for the
// map's totals (store.SetHeld).
func (s mapStore) setHeld(ctx context.Context, mapID string, index int, h engine.Held) error {
	_, err := store.SetHeld(ctx, s.rdb, s.keys, mapID, index, store.Held{Waiting: h.Waiting, LeftApplied: h.LeftApplied, Failed: h.Failed})
	return err
}

// held reads what the map's elements hold, in total, over every rollback
// generation.
func (s mapStore) held(ctx context.Context, mapID string) (engine.Held, error) {
	h, err := store.HeldTotals(ctx, s.rdb, s.keys, mapID)
	return engine.Held{Waiting: h.Waiting, LeftApplied: h.LeftApplied, Failed: h.Failed}, err
}

func storeOf(e *engine.Engine) mapStore {
	return mapStore{rdb: engine.Client(e), keys: keys.New(engine.Prefix(e)), acks: engine.Acks(e)}
}

// meta is a map's metadata as the element jobs read it.
type meta struct {
	Total, BatchSize  int
	Atomic, FanOut    bool
	Paged             bool
	Owner, OwnerReact string
	Element, Step     string
	// ElementDef and OwnerDef are the fingerprints of the element and
	// owner definitions the map started under ("" in maps stored before
	// maps recorded them): only those execute its element tasks.
	ElementDef, OwnerDef string
	Input                string
	With                 codec.Raw
	Trace                string // the owner's trace id, inherited by element runs
	Sensitive            bool   // the owner is a sensitive run: so are the element runs
	Settled, Failures    int
	Offset               int
	Failed               bool
	FailedIndex          int
	// Inc is the map's incarnation (start.lua), Layout its key layout (2:
	// element runs in the map's slot; 0: a map started before that).
	Inc    string
	Layout int
	// RbGen is the map's current rollback generation (rb_start.lua's
	// rbgen; 0 before its first rollback).
	RbGen     int
	exists    bool
	ownerDone bool // the owner finished: the map's keys carry its retention
}

func (s mapStore) readMeta(ctx context.Context, mapID string) (meta, error) {
	var m meta
	var h *redis.MapStringStringCmd
	var off, failed *redis.StringCmd
	var ttl *redis.DurationCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		h = p.HGetAll(ctx, s.keys.MapMeta(mapID))
		off = p.Get(ctx, s.keys.MapOffset(mapID))
		failed = p.Get(ctx, s.keys.MapFailed(mapID))
		ttl = p.PTTL(ctx, s.keys.MapMeta(mapID))
		return nil
	})
	if err != nil && err != redis.Nil {
		return m, fmt.Errorf("mapstep: read map %s: %w", mapID, err)
	}
	m = parseMeta(h.Val(), off.Val(), failed)
	// The map's keys carry an expiry only once its owner has finished (the
	// owner's retention walk): nothing of it runs any more.
	m.ownerDone = m.exists && ttl.Val() > 0
	return m, nil
}

func parseMeta(f map[string]string, offset string, failed *redis.StringCmd) meta {
	var m meta
	if len(f) == 0 {
		return m
	}
	atoi := func(k string) int { n, _ := strconv.Atoi(f[k]); return n }
	m = meta{exists: true, Total: atoi("total"), BatchSize: atoi("batch_size"), Atomic: f["atomic"] == "1",
		FanOut: f["fanout"] == "1", Paged: f["paged"] == "1", Owner: f["owner"], OwnerReact: f["owner_reactor"], Element: f["element"],
		Step: f["step"], Input: f["input"], With: codec.Raw(f["with"]), Trace: f["trace"], Settled: atoi("settled"), Failures: atoi("failures"),
		RbGen: atoi("rbgen"), Sensitive: f["sensitive"] == "1", ElementDef: f["element_def"], OwnerDef: f["owner_def"],
		Inc: f["inc"], Layout: atoi("layout")}
	m.Offset, _ = strconv.Atoi(offset)
	if fi, err := failed.Result(); err == nil {
		m.Failed = true
		m.FailedIndex, _ = strconv.Atoi(fi)
	}
	return m
}

// rbGen is the generation of the map's current (or first) rollback.
func (m meta) rbGen() int { return max(m.RbGen, 1) }

func (m meta) settled() bool {
	return m.Settled >= m.Offset && (m.Offset >= m.Total || m.Failed)
}

// start creates the map's metadata and claims its first batch, once.
func (s mapStore) start(ctx context.Context, mapID string, m meta) (created bool, offset int, err error) {
	res, err := s.eval(ctx, startScript, []string{s.keys.MapMeta(mapID), s.keys.MapOffset(mapID)},
		m.Total, m.BatchSize, b2s(m.Atomic), m.Owner, m.OwnerReact, m.Element, m.Step, []byte(m.With), m.Input, b2s(m.FanOut), b2s(m.Paged), m.Trace,
		b2s(m.Sensitive), m.ElementDef, m.OwnerDef, m.Inc).Slice()
	if err != nil {
		return false, 0, fmt.Errorf("mapstep: start map %s: %w", mapID, err)
	}
	return res[0].(int64) == 1, int(res[1].(int64)), nil
}

// settleResult is what one settle did.
type settleResult struct {
	Stored   bool
	From, To int
	Signal   bool
}

func (s mapStore) settle(ctx context.Context, mapID string, index int, o outcome) (settleResult, error) {
	enc, err := codec.Marshal(o)
	if err != nil {
		return settleResult{}, err
	}
	failure := "0"
	if o.Status == outcomeFailed {
		failure = "1"
	}
	if !o.Held.IsZero() {
		// Before the settle: a crash in between redoes both.
		if err := s.setHeld(ctx, mapID, index, o.Held); err != nil {
			return settleResult{}, err
		}
	}
	k := s.keys
	res, err := s.eval(ctx, settleScript, []string{k.MapMeta(mapID), k.MapOffset(mapID), k.MapResults(mapID), k.MapFailed(mapID), k.MapSignalled(mapID), k.MapStates(mapID)},
		index, enc, failure, "f").Slice()
	if err != nil {
		return settleResult{}, fmt.Errorf("mapstep: settle %s[%d]: %w", mapID, index, err)
	}
	return settleResult{Stored: res[0].(int64) == 1, From: int(res[1].(int64)), To: int(res[2].(int64)), Signal: res[3].(int64) == 1}, nil
}

// pushSource stores a value source once, before the map's meta exists.
func (s mapStore) pushSource(ctx context.Context, mapID string, items []codec.Raw) error {
	key := s.keys.MapSource(mapID)
	if err := s.rdb.Del(ctx, key).Err(); err != nil {
		return err
	}
	const chunk = 1000
	for i := 0; i < len(items); i += chunk {
		end := min(i+chunk, len(items))
		vals := make([]any, 0, end-i)
		for _, it := range items[i:end] {
			vals = append(vals, []byte(it))
		}
		if err := s.rdb.RPush(ctx, key, vals...).Err(); err != nil {
			return fmt.Errorf("mapstep: store source of %s: %w", mapID, err)
		}
	}
	return nil
}

func (s mapStore) sourceRange(ctx context.Context, mapID string, from, to int) ([]codec.Raw, error) {
	vals, err := s.rdb.LRange(ctx, s.keys.MapSource(mapID), int64(from), int64(to)).Result()
	if err != nil {
		return nil, fmt.Errorf("mapstep: read source of %s: %w", mapID, err)
	}
	out := make([]codec.Raw, len(vals))
	for i, v := range vals {
		out[i] = codec.Raw(v)
	}
	return out, nil
}

// results reads the outcomes of indexes [from, to] (missing ones are nil).
func (s mapStore) results(ctx context.Context, mapID string, from, to int) ([]*outcome, error) {
	fields := make([]string, 0, to-from+1)
	for i := from; i <= to; i++ {
		fields = append(fields, strconv.Itoa(i))
	}
	vals, err := s.rdb.HMGet(ctx, s.keys.MapResults(mapID), fields...).Result()
	if err != nil {
		return nil, fmt.Errorf("mapstep: read results of %s: %w", mapID, err)
	}
	out := make([]*outcome, len(vals))
	for i, v := range vals {
		str, ok := v.(string)
		if !ok {
			continue
		}
		var o outcome
		if err := codec.Unmarshal([]byte(str), &o); err != nil {
			return nil, fmt.Errorf("mapstep: decode result %s[%d]: %w", mapID, from+i, err)
		}
		out[i] = &o
	}
	return out, nil
}

// b2s is a script's boolean argument.
func b2s(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
