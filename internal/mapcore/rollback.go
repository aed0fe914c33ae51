package mapcore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/runctx"
)

// A map rolls back the way it ran. An inline map undoes its elements in
// this process, newest first, reading positions in chunks of 100. A fan-out
// map dispatches one rollback job per claimed position, newest first, in
// batches of the map's batch size, with the same claim-by-compare-and-set as
// the forward path; the owner hands off (reactor.RollbackHandedOff) and is
// resumed exactly once, after its hand-off save, by a two-flag handshake.
// Both paths record each position's outcome in the rollback's results hash
// through the same element rollback code, and the owner aggregates the
// failures from there, so the two end with the same Failure.

// Rollback outcomes of one element.
const (
	rbUndone             = "undone"
	rbNotNeeded          = "not_needed"
	rbFailed             = "failed"
	rbContextUnavailable = "context_unavailable"
)

// Rollback generations. A map's first rollback is generation 1 (its work
// list: the claimed forward positions, newest first). A re-triggered
// rollback of the owner (reactor.Engine.RetryRollback) reaches the map with
// a higher ConstructContext.RollbackGeneration: the map then starts that
// generation over the elements the previous one could not undo (outcome
// failed, element_in_flight or context_unavailable), listed in the new
// generation's work list, with fresh keys (P:{map:<id>}:rb:<gen>:*) and task
// ids (rb:<mapID>:<gen>:<pos>), through the same protocol. The map meta's
// rbgen field names the current generation, so that jobs, sweepers,
// readers and the retention walk agree; earlier generations stay readable.

// rbRetryable reports whether an element's rollback outcome leaves it to a
// re-triggered generation.
func rbRetryable(outcome string) bool {
	return outcome == rbFailed || outcome == rbContextUnavailable || outcome == rbElementInFlight
}

// rbElementInFlight is the outcome of an element whose lock stayed held
// (recorded by earlier versions; the rollback now waits instead).
const rbElementInFlight = "element_in_flight"

// rollbackLockWait is how long a map's rollback position may find its
// element locked before the rollback warns an operator: the engine's
// LockExpiry plus a third of it (40 s by default), past what a crashed
// holder's lock lives. The rollback never gives up on the element: a lock
// held longer belongs to a live holder (a delivery still executing the
// element, or finishing within its LockGrace), and undoing around it would
// leave whatever it completes undone. Inline rollbacks (which poll in the
// owner's process) and fan-out rollbacks (whose jobs snooze) wait alike; the
// time is measured from the first time the position found the lock held, by
// the Redis server's clock (rb_locked.lua), so a crash and a redelivery do
// not restart it.
func rollbackLockWait(e *engine.Engine) time.Duration {
	x := engine.LockExpiry(e)
	return x + x/3
}

// maxKeptFailures is how many element rollback failures the owner keeps;
// the rest are counted (the engine's MaxRollbackFailures caps again).
const maxKeptFailures = 100

// rbOutcome is one position's rollback outcome.
type rbOutcome struct {
	Index    int                      `msgpack:"i"`
	Outcome  string                   `msgpack:"o"`
	Failures []engine.RollbackFailure `msgpack:"f,omitempty"`
	// OutOfWindow lists the element's steps its rollback kept because
	// their undo windows had closed ("each[3]/reserve").
	OutOfWindow []string `msgpack:"w,omitempty"`
	// Held is what the element's rollbacks left in place, every generation
	// counted (reactor.Result.Held).
	Held engine.Held `msgpack:"h,omitempty"`
}

// rbMeta is a rollback's metadata.
type rbMeta struct {
	exists                   bool
	Gen                      int
	Total, BatchSize, Offset int
	Settled, Failed          int
	// Work: the positions come from the generation's work list.
	Work bool
	// WindowAt is when the owner's rollback judges undo windows (server
	// ms; 0: none): the elements judge theirs by it.
	WindowAt int64
}

func (m rbMeta) settled() bool { return m.exists && m.Settled >= m.Offset && m.Offset >= m.Total }

// rbCmds are the queued reads of one rollback generation.
type rbCmds struct {
	meta *redis.MapStringStringCmd
	off  *redis.StringCmd
}

func (s mapStore) queueRb(ctx context.Context, p redis.Pipeliner, mapID string, gen int) rbCmds {
	return rbCmds{meta: p.HGetAll(ctx, s.keys.MapRbMeta(mapID, gen)), off: p.Get(ctx, s.keys.MapRbOffset(mapID, gen))}
}

func (c rbCmds) parse(gen int) rbMeta {
	m := parseRb(c.meta.Val(), c.off.Val())
	m.Gen = gen
	return m
}

// readRb reads generation gen of map mapID's rollback.
func (s mapStore) readRb(ctx context.Context, mapID string, gen int) (rbMeta, error) {
	var c rbCmds
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		c = s.queueRb(ctx, p, mapID, gen)
		return nil
	})
	if err != nil && err != redis.Nil {
		return rbMeta{}, fmt.Errorf("mapstep: read rollback of %s: %w", mapID, err)
	}
	return c.parse(gen), nil
}

// currentRb reads the map's current rollback generation: one round trip,
// and a second only for a re-triggered one.
func (s mapStore) currentRb(ctx context.Context, mapID string) (rbMeta, error) {
	var g *redis.StringCmd
	var c rbCmds
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		g = p.HGet(ctx, s.keys.MapMeta(mapID), "rbgen")
		c = s.queueRb(ctx, p, mapID, 1)
		return nil
	})
	if err != nil && err != redis.Nil {
		return rbMeta{}, fmt.Errorf("mapstep: read rollback of %s: %w", mapID, err)
	}
	if gen, _ := strconv.Atoi(g.Val()); gen > 1 {
		return s.readRb(ctx, mapID, gen)
	}
	return c.parse(1), nil
}

func parseRb(f map[string]string, offset string) rbMeta {
	if len(f) == 0 {
		return rbMeta{}
	}
	atoi := func(k string) int { n, _ := strconv.Atoi(f[k]); return n }
	m := rbMeta{exists: true, Total: atoi("total"), BatchSize: atoi("batch_size"), Settled: atoi("settled"), Failed: atoi("failed"),
		Work: f["work"] == "1"}
	m.WindowAt, _ = strconv.ParseInt(f["wa"], 10, 64)
	m.Offset, _ = strconv.Atoi(offset)
	return m
}

func (s mapStore) rbKeys(mapID string, gen int) []string {
	k := s.keys
	return []string{k.MapRbMeta(mapID, gen), k.MapRbOffset(mapID, gen), k.MapRbResults(mapID, gen),
		k.MapRbHandedOff(mapID, gen), k.MapRbSignalled(mapID, gen), k.MapStates(mapID)}
}

// rbStart creates generation gen of the map's rollback (once) and makes it
// the current one; work says its positions come from its work list.
func (s mapStore) rbStart(ctx context.Context, mapID string, gen, total, batch int, work bool, windowAt int64) (created bool, offset int, err error) {
	k := s.keys
	w := "0"
	if work {
		w = "1"
	}
	res, err := s.eval(ctx, rbStartScript, []string{k.MapRbMeta(mapID, gen), k.MapRbOffset(mapID, gen), k.MapMeta(mapID)},
		total, batch, time.Now().UnixMilli(), gen, w, windowAt).Slice()
	if err != nil {
		return false, 0, fmt.Errorf("mapstep: start rollback of %s: %w", mapID, err)
	}
	return res[0].(int64) == 1, int(res[1].(int64)), nil
}

func (s mapStore) rbSettle(ctx context.Context, mapID string, gen, pos int, o rbOutcome) (settleResult, error) {
	enc, err := codec.Marshal(o)
	if err != nil {
		return settleResult{}, err
	}
	failure := "0"
	if len(o.Failures) > 0 {
		failure = "1"
	}
	if !o.Held.IsZero() || gen > 1 {
		// Before the settle: a crash in between redoes both. A later
		// generation may have cleared what an earlier one recorded.
		if err := s.setHeld(ctx, mapID, o.Index, o.Held); err != nil {
			return settleResult{}, err
		}
	}
	res, err := s.eval(ctx, settleScript, s.rbKeys(mapID, gen), pos, enc, failure, "r", o.Outcome).Slice()
	if err != nil {
		return settleResult{}, fmt.Errorf("mapstep: settle rollback %s[%d]: %w", mapID, pos, err)
	}
	return settleResult{Stored: res[0].(int64) == 1, From: int(res[1].(int64)), To: int(res[2].(int64)), Signal: res[3].(int64) == 1}, nil
}

func (s mapStore) rbHandOff(ctx context.Context, mapID string, gen int) (bool, error) {
	k := s.keys
	n, err := s.eval(ctx, rbHandOffScript, []string{k.MapRbHandedOff(mapID, gen), k.MapRbMeta(mapID, gen),
		k.MapRbOffset(mapID, gen), k.MapRbSignalled(mapID, gen)}).Int()
	if err != nil {
		return false, fmt.Errorf("mapstep: hand off rollback of %s: %w", mapID, err)
	}
	return n == 1, nil
}

// readJob reads what a rollback job needs in one round trip: the map's
// metadata, its rollback's (the task's generation), element i's forward
// outcome and, for a re-triggered generation, the element its position
// names (-1 for none).
func (s mapStore) readJob(ctx context.Context, t maptask.RollbackTask) (meta, rbMeta, *outcome, int, error) {
	k := s.keys
	mapID, i := t.MapID, t.Index
	var mh *redis.MapStringStringCmd
	var off, failed, res, work *redis.StringCmd
	var rc rbCmds
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		mh = p.HGetAll(ctx, k.MapMeta(mapID))
		off = p.Get(ctx, k.MapOffset(mapID))
		failed = p.Get(ctx, k.MapFailed(mapID))
		rc = s.queueRb(ctx, p, mapID, t.Gen)
		res = p.HGet(ctx, k.MapResults(mapID), strconv.Itoa(i))
		if t.Gen > 1 {
			work = p.LIndex(ctx, k.MapRbWork(mapID, t.Gen), int64(t.Pos))
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return meta{}, rbMeta{}, nil, -1, fmt.Errorf("mapstep: read rollback job of %s: %w", mapID, err)
	}
	md := parseMeta(mh.Val(), off.Val(), failed)
	rb := rc.parse(t.Gen)
	listed := -1
	if work != nil {
		if n, err := strconv.Atoi(work.Val()); err == nil {
			listed = n
		}
	}
	var o *outcome
	if raw, err := res.Result(); err == nil {
		o = &outcome{}
		if err := codec.Unmarshal([]byte(raw), o); err != nil {
			return md, rb, nil, listed, fmt.Errorf("mapstep: decode result %s[%d]: %w", mapID, i, err)
		}
	}
	return md, rb, o, listed, nil
}

// rbDone reads which positions of [from, to] already have an outcome.
func (s mapStore) rbDone(ctx context.Context, mapID string, gen, from, to int) ([]bool, error) {
	fields := make([]string, 0, to-from+1)
	for p := from; p <= to; p++ {
		fields = append(fields, strconv.Itoa(p))
	}
	vals, err := s.rdb.HMGet(ctx, s.keys.MapRbResults(mapID, gen), fields...).Result()
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(vals))
	for i, v := range vals {
		out[i] = v != nil
	}
	return out, nil
}

// indexes returns the element indexes of rollback positions [from, to].
func (s mapStore) indexes(ctx context.Context, mapID string, rb rbMeta, from, to int) ([]int, error) {
	out := make([]int, 0, to-from+1)
	if !rb.Work {
		for p := from; p <= to; p++ {
			out = append(out, rb.Total-1-p)
		}
		return out, nil
	}
	vals, err := s.rdb.LRange(ctx, s.keys.MapRbWork(mapID, rb.Gen), int64(from), int64(to)).Result()
	if err != nil {
		return nil, fmt.Errorf("mapstep: read the rollback work list of %s: %w", mapID, err)
	}
	if len(vals) != to-from+1 {
		return nil, fmt.Errorf("mapstep: the rollback work list of %s (generation %d) has no positions [%d, %d]", mapID, rb.Gen, from, to)
	}
	for _, v := range vals {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("mapstep: the rollback work list of %s holds %q: %w", mapID, v, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// retryable lists the elements generation gen could not undo, newest
// first, reading its outcomes with HSCAN a chunk at a time.
func (s mapStore) retryable(ctx context.Context, mapID string, gen int) ([]int, error) {
	var out []int
	var cursor uint64
	for {
		kv, next, err := s.rdb.HScan(ctx, s.keys.MapRbResults(mapID, gen), cursor, "", 100).Result()
		if err != nil {
			return nil, fmt.Errorf("mapstep: scan rollback of %s: %w", mapID, err)
		}
		for j := 1; j < len(kv); j += 2 {
			var o rbOutcome
			if err := codec.Unmarshal([]byte(kv[j]), &o); err != nil {
				return nil, fmt.Errorf("mapstep: decode rollback outcome of %s: %w", mapID, err)
			}
			if rbRetryable(o.Outcome) {
				out = append(out, o.Index)
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(out)))
	return slices.Compact(out), nil
}

// regenerate starts rollback generation gen over what generation prev
// (settled) could not undo: its work list is written first (again, after a
// crash, until the start script has run), then the start script creates the
// generation and makes it current, once.
func (s mapStore) regenerate(ctx context.Context, md meta, mapID string, fanOut bool, prev, gen int, windowAt int64) (created bool, offset int, err error) {
	idx, err := s.retryable(ctx, mapID, prev)
	if err != nil {
		return false, 0, err
	}
	work := s.keys.MapRbWork(mapID, gen)
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, work)
		for i := 0; i < len(idx); i += 1000 {
			vals := make([]any, 0, 1000)
			for _, n := range idx[i:min(i+1000, len(idx))] {
				vals = append(vals, n)
			}
			p.RPush(ctx, work, vals...)
		}
		return nil
	}); err != nil {
		return false, 0, fmt.Errorf("mapstep: write the rollback work list of %s: %w", mapID, err)
	}
	batch := md.BatchSize
	if !fanOut {
		batch = max(len(idx), 1)
	}
	return s.rbStart(ctx, mapID, gen, len(idx), batch, true, windowAt)
}

// Undo rolls back a completed map: every completed element, newest first.
func (m *construct) Undo(ctx context.Context, c *engine.ConstructContext) error {
	return m.rollback(ctx, c)
}

// Compensate rolls back the completed elements of a map that failed.
func (m *construct) Compensate(ctx context.Context, c *engine.ConstructContext, _ error) error {
	return m.rollback(ctx, c)
}

// rollback starts the map's rollback, or adopts it once settled. A fan-out
// map hands off while its jobs work; an inline map rolls back here. Its
// phases: stop a forward pass still running, choose (and start) the
// rollback generation, undo inline, hand off, and aggregate what the
// settled generation could not undo.
func (m *construct) rollback(ctx context.Context, c *engine.ConstructContext) error {
	raw := c.State()
	if raw == nil {
		return nil // the map never started: nothing to undo
	}
	var st state
	if err := codec.Unmarshal(raw, &st); err != nil {
		return engine.Permanent(fmt.Errorf("mapstep: decode map state: %w", err))
	}
	if st.Total == 0 {
		return nil
	}
	ms := storeOf(c.Engine)
	md, err := ms.readMeta(ctx, st.MapID)
	if err != nil || !md.exists {
		// Not existing: saved, but the map was never created (a crash
		// before its start script): no element can exist, nothing to undo.
		return err
	}
	r := &mapRollback{m: m, c: c, ms: ms, st: st, md: md,
		log: engine.Logger(c.Engine).With("reactor", c.OwnerReactor, "run", c.OwnerID, "map_step", c.Step, "map", st.MapID)}
	if st.FanOut && !md.settled() {
		settled, err := r.stopForward(ctx)
		if err != nil {
			return err
		}
		if !settled {
			return &engine.RollbackHandedOff{}
		}
	}
	gen, rb, err := r.generation(ctx)
	if err != nil {
		return err
	}
	if !st.FanOut && !rb.settled() {
		if err := m.rollbackInline(ctx, c, ms, r.md, st.MapID, rb); err != nil {
			return err
		}
		if rb, err = ms.readRb(ctx, st.MapID, gen); err != nil {
			return err
		}
	}
	if !rb.settled() {
		// Not settled (or a resume came early): hand off, dispatching
		// nothing more.
		return r.handOff(gen)
	}
	return r.finish(ctx, gen, rb)
}

// mapRollback is one call of a map's rollback: what its phases share.
type mapRollback struct {
	m   *construct
	c   *engine.ConstructContext
	ms  mapStore
	st  state
	md  meta
	log *slog.Logger
}

// stopForward stops a fan-out map still running forward (the run was
// cancelled or undone mid-map): no further claims, and the elements in
// flight settle first, or one could complete after its rollback position
// was judged. It reports whether the forward pass has settled; when not,
// the forward settle resumes the owner as usual.
func (r *mapRollback) stopForward(ctx context.Context) (bool, error) {
	if err := r.ms.rdb.SetNX(ctx, r.ms.keys.MapFailed(r.st.MapID), "-1", 0).Err(); err != nil {
		return false, err
	}
	md, err := r.ms.readMeta(ctx, r.st.MapID)
	if err != nil {
		return false, err
	}
	r.md = md
	if !md.settled() {
		if err := r.wakeUnsettled(ctx); err != nil {
			return false, err
		}
	}
	return md.settled(), nil
}

// wakeUnsettled delivers the task of every claimed element that has not
// settled once more, now that the map is failed: an element paused at an
// interrupt would otherwise never settle, and the map never with it. The
// delivery finds the map failed and settles the element stopped, under the
// element's lock (settleStopped): one still running holds its lock, and the
// delivery waits for it (and is a refused duplicate once it settled
// itself), so an element that pauses after this read is settled too. The
// unsettled elements are those whose forward nibble in the map's states
// string is unset (an element settled by a process without that string is
// delivered to needlessly, and refused). One task per element in flight,
// once per stop: the ids name the cause.
func (r *mapRollback) wakeUnsettled(ctx context.Context) error {
	n := min(r.md.Offset, r.md.Total)
	if n <= 0 {
		return nil
	}
	states, err := r.ms.rdb.GetRange(ctx, r.ms.keys.MapStates(r.st.MapID), 0, int64(n-1)).Result()
	if err != nil {
		return fmt.Errorf("mapstep: read the element states of map %s: %w", r.st.MapID, err)
	}
	var ts []maptask.ElementTask
	for i := range n {
		if i < len(states) && states[i]>>4 != 0 {
			continue
		}
		ts = append(ts, maptask.ElementTask{MapID: r.st.MapID, Index: i, Redelivery: "stop"})
	}
	if len(ts) == 0 {
		return nil
	}
	q, ok := maptask.Adapt(engine.EnqueuerOf(r.c.Engine))
	if !ok {
		return errors.New("mapstep: the engine's Enqueuer cannot enqueue element tasks (use worker.Client)")
	}
	return maptask.EnqueueElements(ctx, q, ts)
}

// generation returns the generation to roll back in, and its meta: the
// current one, or a new one (started here) over what the previous could
// not undo when the owner's rollback was re-triggered. A fan-out
// generation started here has its first batch dispatched; one that never
// settled anything has its first batch dispatched again.
func (r *mapRollback) generation(ctx context.Context) (int, rbMeta, error) {
	ms, st, md := r.ms, r.st, r.md
	want := r.c.RollbackGeneration()
	gen := md.rbGen()
	rb, err := ms.readRb(ctx, st.MapID, gen)
	if err != nil {
		return 0, rb, err
	}
	if rb.exists && !(gen < want && rb.settled()) {
		if st.FanOut && rb.Settled == 0 && rb.Offset > 0 {
			// Nothing settled yet: the first batch may never have gone out
			// (the enqueue after the start script failed, or the owner died
			// there). Enqueue it again: at most one batch, and task ids
			// dedupe the jobs still queued.
			err = dispatchRollback(ctx, r.c.Engine, ms, md, st.MapID, rb, 0, min(rb.Offset, rb.BatchSize)-1)
		}
		return gen, rb, err
	}
	if st.FanOut {
		// Indexed before the rollback exists, like the forward map, so the
		// map sweeper can find a rollback with outstanding work.
		if err := ms.index(ctx, st.MapID, r.c.OwnerID); err != nil {
			return 0, rb, err
		}
	}
	var created bool
	var offset int
	if !rb.exists {
		// The work list: the claimed forward positions, newest first,
		// anchored at the claim offset fixed now.
		total := min(md.Offset, md.Total)
		batch := md.BatchSize
		if !st.FanOut {
			batch = max(total, 1)
		}
		gen = max(want, 1)
		created, offset, err = ms.rbStart(ctx, st.MapID, gen, total, batch, false, windowAtMs(r.c))
	} else {
		prev := gen
		gen = want
		created, offset, err = ms.regenerate(ctx, md, st.MapID, st.FanOut, prev, gen, windowAtMs(r.c))
	}
	if err != nil {
		return 0, rb, err
	}
	if rb, err = ms.readRb(ctx, st.MapID, gen); err != nil {
		return 0, rb, err
	}
	if created {
		r.log.Info("map rollback started", "event", "reactor.map.rollback.started", "total", rb.Total, "batch_size", rb.BatchSize, "generation", gen)
	}
	if created && st.FanOut && offset > 0 {
		claimedBatch(ctx, r.c.Engine, md, engine.EventMapRollbackBatchClaimed)
		if err := dispatchRollback(ctx, r.c.Engine, ms, md, st.MapID, rb, 0, offset-1); err != nil {
			return 0, rb, err
		}
	}
	return gen, rb, nil
}

// handOff hands the owner's rollback to generation gen's jobs. After the
// owner's state is saved, it raises its half of the two-flag handshake;
// when the jobs had settled everything first, it resumes the owner itself.
func (r *mapRollback) handOff(gen int) error {
	e, ms := r.c.Engine, r.ms
	mapID, owner, reactorName := r.st.MapID, r.c.OwnerID, r.c.OwnerReactor
	return &engine.RollbackHandedOff{AfterSave: func(ctx context.Context) error {
		if hook := failpoints.rbBeforeHandOff; hook != nil {
			if err := hook(mapID, -1); err != nil {
				return err
			}
		}
		resume, err := ms.rbHandOff(ctx, mapID, gen)
		if err != nil || !resume {
			return err
		}
		if hook := failpoints.rbOwnerSignal; hook != nil {
			if err := hook(mapID, -1); err != nil {
				return err
			}
		}
		return resumeOwnerRollback(ctx, e, owner, reactorName, mapID, gen)
	}}
}

// finish adopts settled generation gen: the entries it left held, the
// failures, omissions and closed windows it reports, and the map's removal
// from the sweeper's index.
func (r *mapRollback) finish(ctx context.Context, gen int, rb rbMeta) error {
	ms, st := r.ms, r.st
	failures, omitted, outOfWindow, err := r.m.aggregate(ctx, ms, st.MapID, gen)
	if err != nil {
		return err
	}
	held, err := ms.held(ctx, st.MapID)
	if err != nil {
		return err
	}
	r.c.Hold(held)
	if st.FanOut {
		ms.unindex(ctx, st.MapID, r.c.OwnerID)
	}
	r.log.Info("map rollback completed", "event", "reactor.map.rollback.completed", "total", rb.Total, "failed", rb.Failed, "generation", gen)
	if len(failures) == 0 && omitted == 0 && len(outOfWindow) == 0 {
		return nil
	}
	return &engine.RollbackFailures{Failures: failures, Omitted: omitted, OutOfWindow: outOfWindow}
}

// rollbackInline undoes the positions without an outcome, newest first, a
// chunk of 100 at a time, through the same code as the rollback jobs.
func (m *construct) rollbackInline(ctx context.Context, c *engine.ConstructContext, ms mapStore, md meta, mapID string, rb rbMeta) error {
	const chunk = 100
	for from := 0; from < rb.Total; from += chunk {
		to := min(from+chunk, rb.Total) - 1
		done, err := ms.rbDone(ctx, mapID, rb.Gen, from, to)
		if err != nil {
			return err
		}
		var idx []int // read for a chunk with work left
		for p := from; p <= to; p++ {
			if done[p-from] {
				continue
			}
			if idx == nil {
				if idx, err = ms.indexes(ctx, mapID, rb, from, to); err != nil {
					return err
				}
			}
			o, err := rollbackInlineElement(ctx, c.Engine, ms, md, mapID, rb, p, idx[p-from])
			if err != nil {
				return err
			}
			if _, err := ms.rbSettle(ctx, mapID, rb.Gen, p, o); err != nil {
				return err
			}
			logElement(engine.Logger(c.Engine), md, mapID, o)
		}
	}
	return nil
}

// rollbackInlineElement rolls back element i at position p, waiting
// while another process holds its lock, the way a rollback job does
// (heldElement) but polling in this process instead of snoozing.
func rollbackInlineElement(ctx context.Context, e *engine.Engine, ms mapStore, md meta, mapID string, rb rbMeta, p, i int) (rbOutcome, error) {
	delay := 10 * time.Millisecond
	for {
		o, err := rollbackElement(ctx, e, ms, md, mapID, rb, i, 0)
		if errors.Is(err, engine.ErrRunLocked) {
			o, err = ms.heldElement(ctx, e, md, mapID, rb.Gen, p, i, err)
		}
		if !errors.Is(err, engine.ErrRunLocked) {
			return o, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return o, ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, 200*time.Millisecond)
	}
}

// heldElement handles position p, whose element i was found locked
// (lockErr): the rollback waits (lockErr is returned: the caller retries, a
// job by snoozing) for as long as the lock is held, and once the position has
// waited rollbackLockWait it warns, once, naming the element. Both rollback
// modes decide here, so they wait alike and report alike.
func (s mapStore) heldElement(ctx context.Context, e *engine.Engine, md meta, mapID string, gen, p, i int, lockErr error) (rbOutcome, error) {
	wait := rollbackLockWait(e)
	res, err := rbLockedScript.Run(ctx, s.rdb, []string{s.keys.MapRbMeta(mapID, gen)}, p, wait.Milliseconds()).Int64Slice()
	if err != nil {
		return rbOutcome{Index: i}, fmt.Errorf("mapstep: note held element %s[%d]: %w", mapID, i, err)
	}
	if res[1] == 1 {
		engine.Logger(e).Warn("map rollback is waiting for an element another process holds; it undoes the element once the holder lets go",
			"event", "reactor.map.rollback.element_held", "reactor", md.OwnerReact, "run", md.Owner, "map_step", md.Step,
			"map", mapID, "index", i, "element_run", ElementID(mapID, i), "waited", (time.Duration(res[0]) * time.Millisecond).String())
	}
	return rbOutcome{Index: i}, lockErr
}

// rollbackElement rolls back element i of rollback generation rb: the
// one code path of inline rollbacks and rollback jobs.
func rollbackElement(ctx context.Context, e *engine.Engine, ms mapStore, md meta, mapID string, rb rbMeta, i int, wait time.Duration) (rbOutcome, error) {
	if rb.Work {
		return retryElement(ctx, e, md, mapID, i, rb.Gen, wait, rb.WindowAt)
	}
	fwd, err := ms.results(ctx, mapID, i, i)
	if err != nil {
		return rbOutcome{Index: i}, err
	}
	return rollbackElementWith(ctx, e, md, mapID, i, fwd[0], rb.Gen, wait, rb.WindowAt)
}

// retryElement brings element i, which an earlier generation could not
// undo, to generation gen: the element retries its own failed entries (only
// those), or is undone if it never was.
func retryElement(ctx context.Context, e *engine.Engine, md meta, mapID string, i, gen int, wait time.Duration, windowAt int64) (rbOutcome, error) {
	ctx = runctx.WithElement(ctx, runctx.Element{Owner: md.Owner, Step: md.Step, Index: i, Trace: md.Trace, WindowAt: windowAt, Legacy: md.Layout < 2})
	res, err := engine.RetryElementRollback(e, ctx, ElementID(mapID, i), gen, wait)
	switch {
	case errors.Is(err, engine.ErrNotFound):
		return unavailable(md, i), nil
	case err != nil:
		return rbOutcome{Index: i}, forOwner(md, err)
	}
	return undoneOutcome(md, i, res), nil
}

// forOwner makes a refusal for want of an element's definition name the
// map's owner, the run an operator looks at (and the dashboard shows
// waiting).
func forOwner(md meta, err error) error {
	if mm, ok := errors.AsType[*engine.DefinitionMismatchError](err); ok {
		mm.Run = md.Owner
	}
	return err
}

func unavailable(md meta, i int) rbOutcome {
	return rbOutcome{Index: i, Outcome: rbContextUnavailable, Failures: []engine.RollbackFailure{{Step: elementPath(md.Step, i), Kind: engine.ActionUndo, Reason: rbContextUnavailable,
		Message: fmt.Sprintf("element %d completed but its run is gone (expired?); its steps were not undone", i)}}}
}

// undoneOutcome is the outcome of element i whose rollback ended with res:
// undone, or failed with its rollback failures.
func undoneOutcome(md meta, i int, res *engine.Result) rbOutcome {
	o := rbOutcome{Index: i, Outcome: rbUndone, Held: res.Held}
	for _, s := range res.OutOfWindow {
		o.OutOfWindow = append(o.OutOfWindow, elementPath(md.Step, i)+"/"+s)
	}
	if res.Failure != nil {
		for _, f := range res.Failure.RollbackFailures {
			f.Step = elementPath(md.Step, i) + "/" + f.Step
			o.Failures = append(o.Failures, f)
		}
		if len(o.Failures) > 0 {
			o.Outcome = rbFailed
		}
	}
	return o
}

// rollbackElementWith rolls back element i given its forward outcome, in
// rollback generation gen.
func rollbackElementWith(ctx context.Context, e *engine.Engine, md meta, mapID string, i int, fwd *outcome, gen int, wait time.Duration, windowAt int64) (rbOutcome, error) {
	if fwd != nil && fwd.Status == outcomeFailed && !fwd.Held.IsZero() {
		// It failed and rolled itself back, leaving something in place:
		// the map's rollback reports it (and a later generation retries
		// what failed) instead of passing it over.
		return retryElement(ctx, e, md, mapID, i, gen, wait, windowAt)
	}
	o := rbOutcome{Index: i}
	// Skipped and failed elements (a failed element rolled itself back)
	// have nothing for the map to undo. A halted element kept what it
	// completed, like a halted run, and is undone. An element with no
	// outcome, or settled "stopped", may have been cut short with its map:
	// whatever it completed is undone, and if it never started there is
	// nothing.
	f := fwd
	if f != nil && (f.Status == outcomeSkipped || f.Status == outcomeFailed) {
		o.Outcome = rbNotNeeded
		return o, nil
	}
	mayBeAbsent := f == nil || f.Status == outcomeStopped
	ctx = runctx.WithElement(ctx, runctx.Element{Owner: md.Owner, Step: md.Step, Index: i, Trace: md.Trace, WindowAt: windowAt, Legacy: md.Layout < 2})
	res, err := engine.UndoElement(e, ctx, ElementID(mapID, i), wait)
	switch {
	case mayBeAbsent && errors.Is(err, engine.ErrNotFound):
		o.Outcome = rbNotNeeded
		return o, nil
	case errors.Is(err, engine.ErrNotFound):
		return unavailable(md, i), nil
	case err != nil:
		return o, forOwner(md, err)
	case elementStopped(res):
		// Sealed by its stopped settle before any delivery started it.
		o.Outcome = rbNotNeeded
		return o, nil
	}
	return undoneOutcome(md, i, res), nil
}

func elementPath(step string, i int) string { return fmt.Sprintf("%s[%d]", step, i) }

// logElement logs one element's rollback outcome at Debug: it is one line
// per element (thousands for a big map), and what an operator must act on
// (the failures) reaches the owner's Failure and its terminal event.
func logElement(log *slog.Logger, md meta, mapID string, o rbOutcome) {
	log.Debug("map element rolled back", "event", "reactor.map.rollback.element", "reactor", md.OwnerReact,
		"run", md.Owner, "map_step", md.Step, "map", mapID, "index", o.Index, "outcome", o.Outcome, "failures", len(o.Failures))
}

// aggregate reads the rollback's outcomes with HSCAN, a chunk at a time,
// keeping only failures: the first maxKeptFailures (newest element first)
// and a count of the rest. It never loads every outcome at once.
func (m *construct) aggregate(ctx context.Context, ms mapStore, mapID string, gen int) ([]engine.RollbackFailure, int, []string, error) {
	type indexed struct {
		i int
		f engine.RollbackFailure
	}
	var kept []indexed
	var oow []indexedSteps
	omitted := 0
	var cursor uint64
	for {
		kv, next, err := ms.rdb.HScan(ctx, ms.keys.MapRbResults(mapID, gen), cursor, "", 100).Result()
		if err != nil {
			return nil, 0, nil, fmt.Errorf("mapstep: scan rollback of %s: %w", mapID, err)
		}
		for j := 1; j < len(kv); j += 2 {
			var o rbOutcome
			if err := codec.Unmarshal([]byte(kv[j]), &o); err != nil {
				return nil, 0, nil, fmt.Errorf("mapstep: decode rollback outcome of %s: %w", mapID, err)
			}
			for _, f := range o.Failures {
				kept = append(kept, indexed{o.Index, f})
			}
			if len(o.OutOfWindow) > 0 && len(oow) < maxKeptFailures {
				oow = append(oow, indexedSteps{o.Index, o.OutOfWindow})
			}
			if len(kept) > maxKeptFailures {
				sort.SliceStable(kept, func(a, b int) bool { return kept[a].i > kept[b].i })
				omitted += len(kept) - maxKeptFailures
				kept = kept[:maxKeptFailures]
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	sort.SliceStable(kept, func(a, b int) bool { return kept[a].i > kept[b].i })
	out := make([]engine.RollbackFailure, len(kept))
	for j, k := range kept {
		out[j] = k.f
	}
	// Newest element first, as the rollback reached them.
	sort.SliceStable(oow, func(a, b int) bool { return oow[a].i > oow[b].i })
	var steps []string
	for _, o := range oow {
		steps = append(steps, o.steps...)
	}
	return out, omitted, steps, nil
}

// indexedSteps are an element's steps kept out of their undo windows.
type indexedSteps struct {
	i     int
	steps []string
}

// dispatchRollback enqueues the rollback jobs of positions [from, to] of
// generation rb of map md. A first generation's jobs carry what each would
// read first (the map's immutable metadata, the element's forward outcome,
// read here for the batch in one round trip), so that a job's first Redis
// call is its element's load.
func dispatchRollback(ctx context.Context, e *engine.Engine, ms mapStore, md meta, mapID string, rb rbMeta, from, to int) error {
	q, ok := maptask.Adapt(engine.EnqueuerOf(e))
	if !ok {
		return errors.New("mapstep: the engine's Enqueuer cannot enqueue rollback jobs (use worker.Client)")
	}
	idx, err := ms.indexes(ctx, mapID, rb, from, to)
	if err != nil {
		return err
	}
	carried := md.carried()
	var fwd []any
	if carried != nil && !rb.Work {
		fields := make([]string, len(idx))
		for j, i := range idx {
			fields[j] = strconv.Itoa(i)
		}
		if fwd, err = ms.rdb.HMGet(ctx, ms.keys.MapResults(mapID), fields...).Result(); err != nil {
			return fmt.Errorf("mapstep: read the forward results of %s: %w", mapID, err)
		}
	}
	ts := make([]maptask.RollbackTask, 0, to-from+1)
	for p := from; p <= to; p++ {
		if hook := failpoints.rbBeforeEnqueue; hook != nil {
			if err := hook(mapID, p); err != nil {
				// The positions before the failing one still go out.
				return errors.Join(inWaves(rb.BatchSize, from, len(ts), func(lo, hi int) error {
					return maptask.EnqueueRollbacks(ctx, q, ts[lo:hi])
				}), err)
			}
		}
		t := maptask.RollbackTask{MapID: mapID, Gen: rb.Gen, Pos: p, Index: idx[p-from]}
		if fwd != nil {
			t.Meta, t.Total, t.WindowAt = carried, rb.Total, rb.WindowAt
			if v, ok := fwd[p-from].(string); ok {
				t.Fwd = codec.Raw(v)
			}
		}
		ts = append(ts, t)
	}
	return inWaves(rb.BatchSize, from, len(ts), func(lo, hi int) error {
		return maptask.EnqueueRollbacks(ctx, q, ts[lo:hi])
	})
}

func resumeOwnerRollback(ctx context.Context, e *engine.Engine, owner, reactorName, mapID string, gen int) error {
	return engine.EnqueuerOf(e).Enqueue(ctx, engine.Wake{
		ID:    rbResumeID(owner, mapID, gen),
		RunID: owner, Reactor: reactorName, Retain: resumeRetention,
	})
}

// processRollback executes one element rollback job on a worker: undo the
// element (checkpointed after every undone entry), store its outcome (first
// writer wins), claim the next batch on trigger, and resume the owner when
// the rollback has settled and the owner has handed off. A held element
// lock returns reactor.ErrRunLocked (the worker snoozes) for as long as it
// is held. A job of a generation that a newer one superseded has nothing to
// do: its generation had settled before the newer one started.
func processRollback(ctx context.Context, e *engine.Engine, t maptask.RollbackTask) error {
	ms := storeOf(e)
	if len(t.Meta) > 0 {
		done, err := processCarriedRollback(ctx, e, ms, t)
		if done || err != nil {
			return err
		}
	}
	md, rb, fwd, listed, err := ms.readJob(ctx, t)
	if err != nil {
		return err
	}
	if !md.exists || !rb.exists {
		return fmt.Errorf("%w: rollback generation %d of map %s", maptask.ErrMapGone, t.Gen, t.MapID)
	}
	if t.Gen < md.rbGen() {
		return nil
	}
	// Only claimed positions are undone (newest first, a batch at a
	// time) and only they settle: a task for any other position would undo
	// its element out of order, and its outcome would then be refused.
	if t.Pos < 0 || t.Pos >= rb.Offset {
		return fmt.Errorf("%w: rollback task %s names position %d; the rollback of map %s has claimed %d of %d", maptask.ErrBadTask, t.TaskID(), t.Pos, t.MapID, rb.Offset, rb.Total)
	}
	want := rb.Total - 1 - t.Pos
	if rb.Work {
		want = listed
	}
	if t.Index != want {
		return fmt.Errorf("%w: rollback task %s names element %d, position %d of %d is element %d", maptask.ErrBadTask, t.TaskID(), t.Index, t.Pos, rb.Total, want)
	}
	var o rbOutcome
	if rb.Work {
		o, err = retryElement(ctx, e, md, t.MapID, t.Index, t.Gen, 0, rb.WindowAt)
	} else {
		o, err = rollbackElementWith(ctx, e, md, t.MapID, t.Index, fwd, t.Gen, 0, rb.WindowAt)
	}
	if errors.Is(err, engine.ErrRunLocked) {
		// Snooze (the position stays outstanding) while the lock is held.
		o, err = ms.heldElement(ctx, e, md, t.MapID, t.Gen, t.Pos, t.Index, err)
	}
	if err != nil {
		return err
	}
	sr, err := ms.rbSettle(ctx, t.MapID, t.Gen, t.Pos, o)
	if err != nil {
		return err
	}
	if !sr.Stored {
		return nil
	}
	logElement(engine.Logger(e), md, t.MapID, o)
	if hook := failpoints.rbAfterSettle; hook != nil {
		if err := hook(t.MapID, t.Pos); err != nil {
			return err
		}
	}
	if sr.From >= 0 {
		claimedBatch(ctx, e, md, engine.EventMapRollbackBatchClaimed)
		if err := dispatchRollback(ctx, e, ms, md, t.MapID, rb, sr.From, sr.To); err != nil {
			return err
		}
	}
	if sr.Signal {
		if hook := failpoints.rbJobSignal; hook != nil {
			if err := hook(t.MapID, t.Pos); err != nil {
				return err
			}
		}
		return resumeOwnerRollback(ctx, e, md.Owner, md.OwnerReact, t.MapID, t.Gen)
	}
	return nil
}

// windowAtMs is the time (server ms) the owner's rollback judges undo
// windows at, for the elements (0: none).
func windowAtMs(c *engine.ConstructContext) int64 {
	if t := c.UndoWindowAt(); !t.IsZero() {
		return t.UnixMilli()
	}
	return 0
}
