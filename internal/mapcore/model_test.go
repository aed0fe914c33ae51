package mapcore_test

// The map stage of the model-based test of rollback (reactor/model_test.go
// is the first stage: plain runs and composed children). A seeded generator
// draws small histories: an owner run with 0-2 own steps on shared
// resources, a map (inline or fan-out, atomic or Partial) of 1-5 elements
// whose element reactor has a guarded step (on a resource of its own, or on
// a shared one) and maybe a plain step whose undo fails on chosen attempts,
// elements that fail themselves (some after somebody wrote their resource,
// so their own rollback conflicts), and maybe a failing last owner step.
// Then operations: outside writers, Undo and RetryRollback of the owner
// (some cut short by a "worker kill" and resumed), Resolve of the
// conflicted entries, Retry. Each history runs against the real engine on a
// real Redis and against the small reference model below, and the two are
// compared after every operation.
//
// The model encodes the target semantics, not what the engine does today:
// where they differ the test reports the divergence, grouped by kind, with
// the shortest history that shows it and the seed to replay it:
//
//	GOREACTOR_MODEL_SEED=<seed> go test -race ./mapstep/ -run TestMapRollbackModel -v
//
// -long (go test ./mapstep/ -run TestMapRollbackModel -long) draws 20,000
// histories instead of the default 500; GOREACTOR_MODEL_N sets the number,
// and GOREACTOR_MODEL_MODE=inline or fanout draws only maps of that kind
// (by default one history in five fans out: those start a worker each and
// are the slow ones).
//
// Target semantics the model holds that the engine's documentation does not
// spell out for maps (a divergence there may be the model's to fix):
//   - resource blocking is within one run: an element run is its own
//     (README: "in a fan-out map a resource is scoped to its element run"),
//     so an element's entry never blocks the owner's nor another element's;
//   - RetryRollback of the owner retries every entry of its tree whose undo
//     failed or was blocked, those of elements that failed forward (and
//     rolled themselves back) included, and refuses (ErrNothingToRetry)
//     when none is left, however many conflicts still wait for a person.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/goreactor/goreactor/internal/keys"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/worker"
)

var longModel = flag.Bool("long", false, "TestMapRollbackModel: draw 20,000 histories")

func TestMapRollbackModel(t *testing.T) {
	t.Parallel()
	n := 500
	if *longModel {
		n = 20_000
	}
	if v := os.Getenv("GOREACTOR_MODEL_N"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	mode := os.Getenv("GOREACTOR_MODEL_MODE")
	require.Contains(t, []string{"", "inline", "fanout"}, mode, "GOREACTOR_MODEL_MODE")
	rdb := redistest.Client(t)
	env := &mmEnv{rdb: rdb, prefix: redistest.Prefix(t), queue: redistest.Queue(t), mode: mode}
	if v := os.Getenv("GOREACTOR_MODEL_SEED"); v != "" {
		seed, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
		for _, d := range env.runHistory(seed) {
			t.Errorf("divergence: %s\n  %s\n%s", d.category, d.detail, mmIndent(d.history))
		}
		return
	}
	type found struct {
		count int
		best  mmDivergence
	}
	var mu sync.Mutex
	byCat := map[string]*found{}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				ds := env.runHistory(i)
				mu.Lock()
				for _, d := range ds {
					f := byCat[d.category]
					if f == nil {
						f = &found{best: d}
						byCat[d.category] = f
					}
					f.count++
					if d.size < f.best.size || (d.size == f.best.size && d.seed < f.best.seed) {
						f.best = d
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	cats := slices.Sorted(maps.Keys(byCat))
	for _, c := range cats {
		f := byCat[c]
		replay := fmt.Sprintf("GOREACTOR_MODEL_SEED=%d", f.best.seed)
		if mode != "" {
			replay += " GOREACTOR_MODEL_MODE=" + mode
		}
		t.Errorf("%s\n  in %d of %d histories; shortest: seed %d (%s go test -race ./mapstep/ -run TestMapRollbackModel -v)\n  %s\n%s",
			c, f.count, n, f.best.seed, replay, f.best.detail, mmIndent(f.best.history))
	}
}

func mmIndent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

type mmEnv struct {
	rdb           redis.UniversalClient
	prefix, queue string
	mode          string
}

// ---- the history's definition

// mmOwnStep is one of the owner's own steps.
type mmOwnStep struct {
	name    string
	guarded bool
	res     string       // a shared resource ("r0", "r1")
	failOn  map[int]bool // plain: the Undo attempts that fail
	ordinal int
}

// mmElem is what element i of the map does.
type mmElem struct {
	failSelf    bool         // it fails itself (a last step that fails)
	clobberSelf bool         // ... after somebody wrote its guarded step's resource
	pFailOn     map[int]bool // the attempts of its plain step's Undo that fail
}

type mmSpec struct {
	own           []*mmOwnStep
	fanOut        bool
	partial       bool
	elemShared    string // the shared resource of every element's guarded step; "" for one of its own ("e<i>")
	hasP          bool   // the element has a plain undoable step p
	elems         []*mmElem
	fail          bool     // a failing last owner step
	failClobber   []string // the resources it writes before failing
	anyFailSelf   bool
	writableNames []string
}

func (s *mmSpec) elemRes(i int) string {
	if s.elemShared != "" {
		return s.elemShared
	}
	return "e" + strconv.Itoa(i)
}

func (s *mmSpec) String() string {
	var b strings.Builder
	b.WriteString("owner:")
	for _, st := range s.own {
		if st.guarded {
			fmt.Fprintf(&b, " %s:guarded(%s)", st.name, st.res)
		} else {
			fmt.Fprintf(&b, " %s:plain(%s)%s", st.name, st.res, failOnString(st.failOn))
		}
	}
	mode := "inline"
	if s.fanOut {
		mode = "fanout"
	}
	kind := "atomic"
	if s.partial {
		kind = "partial"
	}
	res := "own resource e<i>"
	if s.elemShared != "" {
		res = "shared " + s.elemShared
	}
	fmt.Fprintf(&b, " each:map(%s,%s,%d elements; g:guarded on %s", mode, kind, len(s.elems), res)
	if s.hasP {
		b.WriteString(", p:plain")
	}
	b.WriteString(")")
	for i, e := range s.elems {
		var parts []string
		if len(e.pFailOn) > 0 {
			parts = append(parts, "p undo fails on attempts "+fmt.Sprint(sortedKeys(e.pFailOn)))
		}
		if e.failSelf {
			if e.clobberSelf {
				parts = append(parts, "fails itself after a writer clobbers "+s.elemRes(i))
			} else {
				parts = append(parts, "fails itself")
			}
		}
		if len(parts) > 0 {
			fmt.Fprintf(&b, " [%d: %s]", i, strings.Join(parts, "; "))
		}
	}
	if s.fail {
		b.WriteString(" fail:fails")
		for _, r := range s.failClobber {
			fmt.Fprintf(&b, "[writer clobbers %s first]", r)
		}
	}
	return b.String()
}

func failOnString(m map[int]bool) string {
	if len(m) == 0 {
		return ""
	}
	return fmt.Sprintf("[undo fails on attempts %v]", sortedKeys(m))
}

func sortedKeys(m map[int]bool) []int { return slices.Sorted(maps.Keys(m)) }

func genMapSpec(r *rand.Rand, mode string) *mmSpec {
	s := &mmSpec{}
	// The draw is the same whatever the mode, so a seed replays alike.
	s.fanOut = r.IntN(5) == 0
	switch mode {
	case "inline":
		s.fanOut = false
	case "fanout":
		s.fanOut = true
	}
	s.partial = r.IntN(2) == 0
	shared := []string{"r0", "r1"}
	ord := 0
	for i := range r.IntN(3) {
		ord++
		st := &mmOwnStep{name: string(rune('a' + i)), guarded: r.IntN(2) == 0, res: shared[r.IntN(2)], ordinal: ord}
		if !st.guarded && r.IntN(4) == 0 {
			st.failOn = pickFailOn(r)
		}
		s.own = append(s.own, st)
	}
	if !s.fanOut && r.IntN(5) < 2 {
		// A fan-out map's elements run concurrently: on a shared resource
		// their order, and so each one's before, would be the scheduler's.
		s.elemShared = shared[r.IntN(2)]
	}
	s.hasP = r.IntN(5) < 3
	for range 1 + r.IntN(5) {
		e := &mmElem{}
		if s.hasP && r.IntN(10) < 3 {
			e.pFailOn = pickFailOn(r)
		}
		if r.IntN(5) == 0 {
			e.failSelf, e.clobberSelf = true, r.IntN(5) < 3
			s.anyFailSelf = true
		}
		s.elems = append(s.elems, e)
	}
	s.writableNames = slices.Clone(shared)
	if s.elemShared == "" {
		for i := range s.elems {
			s.writableNames = append(s.writableNames, "e"+strconv.Itoa(i))
		}
	}
	if r.IntN(5) < 3 {
		s.fail = true
		if r.IntN(5) < 3 {
			for range 1 + r.IntN(2) {
				n := s.writableNames[r.IntN(len(s.writableNames))]
				if !slices.Contains(s.failClobber, n) {
					s.failClobber = append(s.failClobber, n)
				}
			}
		}
	}
	return s
}

func pickFailOn(r *rand.Rand) map[int]bool {
	m := map[int]bool{}
	for _, a := range [][]int{{1}, {1}, {2}, {1, 2}}[r.IntN(4)] {
		m[a] = true
	}
	return m
}

// ---- the reference model

// mmEntry is a ledger entry of the tree, as the model sees it: one of the
// owner's own steps (elem -1) or a step of element elem.
type mmEntry struct {
	elem          int
	step, path    string // "a" / "g"; "a" / "each[2]/g"
	id            string // "a#1", "g#1"
	guarded       bool
	res           string // resource name ("" none)
	before, after string
	failOn        map[int]bool
	status        engine.RollbackStatus // "" while no rollback reached it
	calls         int
	conflict      bool
	resolved      bool
}

func (e *mmEntry) applied() bool {
	switch e.status {
	case engine.RollbackCompensated, engine.RollbackManuallyReverted:
		return false
	}
	return true
}

type mmModel struct {
	spec       *mmSpec
	entries    []*mmEntry // completion order, oldest first
	kv         map[string]string
	status     engine.Status
	gen        int          // the owner's rollback generations
	elemRolled map[int]bool // the element rolled back at least once
	elemFailed map[int]bool // the element failed forward (and rolled itself back)
	ran        map[int]bool // the element ran (its guarded step wrote)
}

func (m *mmModel) index(e *mmEntry) int { return slices.Index(m.entries, e) }

// blocker is what keeps e from being undone: a newer entry of the same run
// on its resource still applied. left: a person left one applied.
func (m *mmModel) blocker(e *mmEntry) (by *mmEntry, left bool) {
	if e.res == "" {
		return nil, false
	}
	for i := m.index(e) + 1; i < len(m.entries); i++ {
		n := m.entries[i]
		if n.elem != e.elem || n.res != e.res || !n.applied() {
			continue
		}
		if by == nil {
			by = n
		}
		if n.status == engine.RollbackLeftApplied {
			return n, true
		}
	}
	return by, false
}

func (m *mmModel) undoOne(e *mmEntry) {
	if e.elem >= 0 {
		m.elemRolled[e.elem] = true
	}
	if e.conflict && !e.resolved || e.status == engine.RollbackLeftApplied {
		return
	}
	if by, left := m.blocker(e); by != nil {
		e.status = engine.RollbackBlocked
		if left {
			e.status = engine.RollbackLeftApplied
		}
		return
	}
	if e.guarded {
		switch m.kv[e.res] {
		case e.after:
			e.calls++
			m.kv[e.res] = e.before
			e.status = engine.RollbackCompensated
		case e.before:
			e.status = engine.RollbackCompensated
		default:
			e.status, e.conflict = engine.RollbackNeedsPerson, true
		}
		return
	}
	e.calls++
	if e.failOn[e.calls] {
		e.status = engine.RollbackFailed
		return
	}
	if e.res != "" {
		m.kv[e.res] = e.before
	}
	e.status = engine.RollbackCompensated
}

// rollbackElement is element i rolling back (its own failure, or its map's
// rollback): its applied entries, newest first.
func (m *mmModel) rollbackElement(i int) {
	m.elemRolled[i] = true
	for j := len(m.entries) - 1; j >= 0; j-- {
		if e := m.entries[j]; e.elem == i && e.applied() {
			m.undoOne(e)
		}
	}
}

// rollback is the owner's whole rollback (its failure, or Undo): the map's
// elements that completed, newest first (the ones that failed forward
// rolled themselves back already), then the owner's own entries.
func (m *mmModel) rollback(failure bool) {
	m.gen++
	for j := len(m.entries) - 1; j >= 0; j-- {
		e := m.entries[j]
		if e.elem >= 0 && m.elemFailed[e.elem] {
			continue
		}
		if e.applied() {
			m.undoOne(e)
		}
	}
	m.status = engine.StatusCancelled
	if failure {
		m.status = engine.StatusFailed
	}
}

// retryPlan is RetryRollback's decision: the entries it retries, or the
// refusal.
func (m *mmModel) retryPlan() ([]*mmEntry, error) {
	if m.status != engine.StatusFailed && m.status != engine.StatusCancelled {
		return nil, engine.ErrNoRollbackToRetry
	}
	var retry []*mmEntry
	for j := len(m.entries) - 1; j >= 0; j-- {
		if e := m.entries[j]; e.status == engine.RollbackFailed || e.status == engine.RollbackBlocked {
			retry = append(retry, e)
		}
	}
	if len(retry) == 0 {
		return nil, engine.ErrNothingToRetry
	}
	return retry, nil
}

func (m *mmModel) retryRollback(retry []*mmEntry) {
	m.gen++
	for _, e := range retry {
		m.undoOne(e)
	}
}

func (m *mmModel) resolve(e *mmEntry, kind engine.Resolution) {
	e.resolved = true
	e.status = engine.RollbackStatus(kind)
	if kind == engine.ResolvedManuallyReverted {
		m.kv[e.res] = e.before
		return
	}
	for i := m.index(e) - 1; i >= 0; i-- {
		if o := m.entries[i]; o.elem == e.elem && o.res == e.res && o.status == engine.RollbackBlocked {
			o.status = engine.RollbackLeftApplied
		}
	}
}

func inPlaceStatus(s engine.RollbackStatus) bool {
	switch s {
	case engine.RollbackFailed, engine.RollbackNeedsPerson, engine.RollbackBlocked, engine.RollbackLeftApplied:
		return true
	}
	return false
}

func (m *mmModel) effectInPlace() bool {
	return slices.ContainsFunc(m.entries, func(e *mmEntry) bool { return inPlaceStatus(e.status) })
}

func (m *mmModel) retryAllowed() bool {
	return (m.status == engine.StatusFailed || m.status == engine.StatusCancelled) && !m.effectInPlace()
}

// held counts what the tree holds: entries waiting for a person, left
// applied, failed or blocked; elements only with elemsOnly.
func (m *mmModel) held(elemsOnly bool) engine.Held {
	var h engine.Held
	for _, e := range m.entries {
		if elemsOnly && e.elem < 0 {
			continue
		}
		switch e.status {
		case engine.RollbackNeedsPerson:
			h.Waiting++
		case engine.RollbackLeftApplied:
			h.LeftApplied++
		case engine.RollbackFailed, engine.RollbackBlocked:
			h.Failed++
		}
	}
	return h
}

// open lists the unresolved conflicts as "<run>/<entry>".
func (m *mmModel) open(h *mmHist) []string {
	var out []string
	for _, e := range m.entries {
		if e.conflict && !e.resolved {
			out = append(out, h.runOf(e)+"/"+e.id)
		}
	}
	slices.Sort(out)
	return out
}

func (m *mmModel) elemOpen(i int) bool {
	return slices.ContainsFunc(m.entries, func(e *mmEntry) bool { return e.elem == i && e.conflict && !e.resolved })
}

func (m *mmModel) outcome() engine.RollbackOutcome {
	var human, kept, reverted bool
	for _, e := range m.entries {
		switch e.status {
		case engine.RollbackFailed, engine.RollbackNeedsPerson, engine.RollbackBlocked:
			human = true
		case engine.RollbackLeftApplied:
			kept = true
		case engine.RollbackCompensated, engine.RollbackManuallyReverted:
			reverted = true
		}
	}
	switch {
	case human:
		return engine.RollbackNeedsHuman
	case kept:
		return engine.RollbackKeptInPlace
	case reverted:
		return engine.RollbackReverted
	}
	return engine.RollbackNothingToDo
}

// forward computes the entries and resources after the forward run; for a
// fan-out map, ran says which elements ran (the scheduler's choice once an
// atomic map fails). It returns the elements the model expects to run.
func (m *mmModel) forward(ran map[int]bool) map[int]bool {
	s := m.spec
	for _, st := range s.own {
		e := &mmEntry{elem: -1, step: st.name, path: st.name, id: st.name + "#" + strconv.Itoa(st.ordinal), guarded: st.guarded,
			res: st.res, failOn: st.failOn, after: mmValueOf(st.name)}
		e.before = m.kv[e.res]
		m.kv[e.res] = e.after
		m.entries = append(m.entries, e)
	}
	expect := map[int]bool{}
	mapFailed := false
	for i, el := range s.elems {
		if s.fanOut && !ran[i] || !s.fanOut && mapFailed {
			continue
		}
		expect[i] = true
		m.ran[i] = true
		path := fmt.Sprintf("each[%d]/g", i)
		g := &mmEntry{elem: i, step: "g", path: path, id: "g#1", guarded: true, res: s.elemRes(i), after: mmValueOf(path)}
		g.before = m.kv[g.res]
		m.kv[g.res] = g.after
		m.entries = append(m.entries, g)
		if s.hasP {
			path := fmt.Sprintf("each[%d]/p", i)
			m.entries = append(m.entries, &mmEntry{elem: i, step: "p", path: path, id: "p#2", failOn: el.pFailOn, after: mmValueOf(path)})
		}
		if el.failSelf {
			if el.clobberSelf {
				m.kv[g.res] = "w:self" + strconv.Itoa(i)
			}
			m.elemFailed[i] = true
			m.rollbackElement(i)
			if !s.partial {
				mapFailed = true
			}
		}
	}
	if s.fail && !mapFailed {
		for _, r := range s.failClobber {
			m.kv[r] = "w:fail"
		}
	}
	if s.fail || mapFailed {
		m.rollback(true)
	} else {
		m.status = engine.StatusCompleted
	}
	return expect
}

// ---- one history against the engine

type mmDivergence struct {
	seed     int64
	category string
	detail   string
	history  string
	size     int
}

type mmHist struct {
	ctx    context.Context
	rdb    redis.UniversalClient
	eng    *engine.Engine
	prefix string
	spec   *mmSpec
	m      *mmModel
	runID  string
	log    []string
	writes int

	mu         sync.Mutex
	calls      map[string]int // Undo (plain) and Restore (guarded) calls, by path
	oks        map[string]int // the calls that changed something
	violations []string
	ran        map[int]bool
	inPlace    map[string]bool // the paths whose effect the model had in place when the operation began
	kill       func()          // set: the next Undo or Restore call cuts its rollback short
	add        func(category, detail string)
}

func (h *mmHist) key(name string) string { return h.prefix + ":" + name }

func (h *mmHist) get(key string) string {
	v, err := h.rdb.Get(h.ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		panic(err)
	}
	return v
}

func (h *mmHist) set(key, v string) {
	if err := h.rdb.Set(h.ctx, key, v, 0).Err(); err != nil {
		panic(err)
	}
}

func (h *mmHist) violate(format string, args ...any) {
	h.mu.Lock()
	h.violations = append(h.violations, fmt.Sprintf(format, args...))
	h.mu.Unlock()
}

func (h *mmHist) mapID() string { return mapcore.MapID(h.runID, "each") }

func (h *mmHist) elemID(i int) string { return h.mapID() + "." + strconv.Itoa(i) }

func (h *mmHist) runOf(e *mmEntry) string {
	if e.elem < 0 {
		return h.runID
	}
	return h.elemID(e.elem)
}

// snapshot records what the model has in place before an operation, for
// the undo hooks.
func (h *mmHist) snapshot() {
	in := map[string]bool{}
	for _, e := range h.m.entries {
		in[e.path] = e.applied()
	}
	h.mu.Lock()
	h.inPlace = in
	h.mu.Unlock()
}

// killed cuts the rollback short if a kill is armed: it ends the
// operation's context and returns its error once the engine sees it.
func (h *mmHist) killed(ctx context.Context) error {
	h.mu.Lock()
	k := h.kill
	h.kill = nil
	h.mu.Unlock()
	if k == nil {
		return nil
	}
	k()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Second):
		return errors.New("the kill did not reach the undo's context")
	}
}

func (h *mmHist) count(path string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls[path]++
	return h.calls[path]
}

func (h *mmHist) ok(path string) {
	h.mu.Lock()
	h.oks[path]++
	h.mu.Unlock()
}

type mmOut struct {
	Before string `msgpack:"b"`
	After  string `msgpack:"a"`
}

type mmIn struct {
	N int `json:"n"`
}

func mmValueOf(path string) string { return "v:" + path }

func mmWriterOf(v string) (string, bool) { return strings.CutPrefix(v, "v:") }

// restore is a guarded step's Restore, for the step at path.
func (h *mmHist) restore(ctx context.Context, path, key, before string) (engine.RestoreResult, error) {
	if err := h.killed(ctx); err != nil {
		return "", err
	}
	h.count(path)
	h.ok(path)
	if cur := h.get(key); cur != mmValueOf(path) {
		h.violate("Restore of %s wrote over %q (not its own write)", path, cur)
	}
	h.set(key, before)
	return engine.RestoreWritten, nil
}

func (h *mmHist) definitions(seed int64) (*engine.Definition, *engine.Definition) {
	s := h.spec
	// The element's guarded effect names its element after "|": the
	// Restore must know whose it is (a resource is the element run's own).
	elemKey := func(resource string) (string, int) {
		k, n, _ := strings.Cut(resource, "|")
		i, _ := strconv.Atoi(n)
		return k, i
	}
	guard := engine.Guarded(engine.GuardConfig[string]{
		Probe: func(ctx context.Context, resource string) (string, error) {
			k, _ := elemKey(resource)
			return h.get(k), nil
		},
		Restore: func(ctx context.Context, resource, before, _ string) (engine.RestoreResult, error) {
			k, i := elemKey(resource)
			return h.restore(ctx, fmt.Sprintf("each[%d]/g", i), k, before)
		},
	})
	parts := []engine.Part{
		engine.Input[int]("item", engine.Required()),
		engine.Step("g", engine.StepConfig[mmIn, mmOut]{
			Args:  engine.Bindings{"n": engine.FromInput("item")},
			Guard: guard,
			Run: func(ctx context.Context, in mmIn) (mmOut, error) {
				h.mu.Lock()
				h.ran[in.N] = true
				h.mu.Unlock()
				path := fmt.Sprintf("each[%d]/g", in.N)
				key := h.key(s.elemRes(in.N))
				before := h.get(key)
				h.set(key, mmValueOf(path))
				return mmOut{Before: before, After: mmValueOf(path)}, engine.RecordEffect(ctx,
					engine.Effect{Resource: key + "|" + strconv.Itoa(in.N), Before: before, After: mmValueOf(path), Label: path})
			},
		}),
	}
	last := "g"
	if s.hasP {
		last = "p"
		parts = append(parts, engine.Step("p", engine.StepConfig[mmIn, mmOut]{
			Args:  engine.Bindings{"n": engine.FromInput("item")},
			After: []string{"g"},
			Run: func(ctx context.Context, in mmIn) (mmOut, error) {
				return mmOut{After: mmValueOf(fmt.Sprintf("each[%d]/p", in.N))}, nil
			},
			Undo: func(ctx context.Context, in mmIn, _ mmOut) error {
				if err := h.killed(ctx); err != nil {
					return err
				}
				path := fmt.Sprintf("each[%d]/p", in.N)
				if n := h.count(path); s.elems[in.N].pFailOn[n] {
					return fmt.Errorf("undo of %s refused (attempt %d)", path, n)
				}
				h.ok(path)
				return nil
			},
		}))
	}
	if s.anyFailSelf {
		parts = append(parts, engine.Step("boom", engine.StepConfig[mmIn, mmOut]{
			Args:  engine.Bindings{"n": engine.FromInput("item")},
			After: []string{last},
			Run: func(ctx context.Context, in mmIn) (mmOut, error) {
				el := s.elems[in.N]
				if !el.failSelf {
					return mmOut{}, nil
				}
				if el.clobberSelf {
					h.set(h.key(s.elemRes(in.N)), "w:self"+strconv.Itoa(in.N))
				}
				return mmOut{}, engine.Permanent(fmt.Errorf("element %d refused", in.N))
			},
		}))
	}
	name := fmt.Sprintf("mapmodel-%d", seed)
	element := engine.MustDefine(name+"-el", parts...)

	owner := []engine.Part{engine.Input[[]int]("items", engine.Required())}
	var after []string
	for _, st := range s.own {
		path, key := st.name, h.key(st.res)
		cfg := engine.StepConfig[engine.Args, mmOut]{After: after}
		if st.guarded {
			cfg.Guard = engine.Guarded(engine.GuardConfig[string]{
				Probe: func(ctx context.Context, k string) (string, error) { return h.get(k), nil },
				Restore: func(ctx context.Context, k, before, _ string) (engine.RestoreResult, error) {
					return h.restore(ctx, path, k, before)
				},
			})
			cfg.Run = func(ctx context.Context, _ engine.Args) (mmOut, error) {
				before := h.get(key)
				h.set(key, mmValueOf(path))
				return mmOut{Before: before, After: mmValueOf(path)}, engine.RecordEffect(ctx,
					engine.Effect{Resource: key, Before: before, After: mmValueOf(path), Label: path})
			}
		} else {
			cfg.Resource = func(engine.Args, mmOut) string { return key }
			cfg.Run = func(ctx context.Context, _ engine.Args) (mmOut, error) {
				before := h.get(key)
				h.set(key, mmValueOf(path))
				return mmOut{Before: before, After: mmValueOf(path)}, nil
			}
			cfg.Undo = func(ctx context.Context, _ engine.Args, out mmOut) error {
				if err := h.killed(ctx); err != nil {
					return err
				}
				if n := h.count(path); st.failOn[n] {
					return fmt.Errorf("undo of %s refused (attempt %d)", path, n)
				}
				h.ok(path)
				// A plain Undo writes blindly: over an outside writer's
				// value by design, never over the effect of an entry still
				// in place.
				if cur := h.get(key); cur != out.After {
					if w, ok := mmWriterOf(cur); ok && w != path {
						h.mu.Lock()
						in := h.inPlace[w]
						h.mu.Unlock()
						if in {
							h.violate("Undo of %s wrote over %q, the effect of %s still in place", path, cur, w)
						}
					}
				}
				h.set(key, out.Before)
				return nil
			}
		}
		owner = append(owner, engine.Step(st.name, cfg))
		after = []string{st.name}
	}
	owner = append(owner, mapcore.Map("each", mapcore.Config{Element: element, Items: engine.FromInput("items"),
		FanOut: s.fanOut, Partial: s.partial, BatchSize: 2, After: after}))
	if s.fail {
		owner = append(owner, engine.Step("fail", engine.StepConfig[engine.Args, mmOut]{
			After: []string{"each"},
			Run: func(ctx context.Context, _ engine.Args) (mmOut, error) {
				for _, r := range s.failClobber {
					h.set(h.key(r), "w:fail")
				}
				return mmOut{}, engine.Permanent(errors.New("downstream refused"))
			},
		}))
	}
	return engine.MustDefine(name, owner...), element
}

func (env *mmEnv) runHistory(seed int64) (out []mmDivergence) {
	r := rand.New(rand.NewPCG(uint64(seed), 0x3a9))
	spec := genMapSpec(r, env.mode)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := &mmHist{ctx: ctx, rdb: env.rdb, prefix: env.prefix + ":h" + strconv.FormatInt(seed, 10), spec: spec,
		calls: map[string]int{}, oks: map[string]int{}, ran: map[int]bool{}, runID: "mm-" + strconv.FormatInt(seed, 10)}
	h.m = &mmModel{spec: spec, kv: map[string]string{}, elemRolled: map[int]bool{}, elemFailed: map[int]bool{}, ran: map[int]bool{}}
	h.log = append(h.log, "definition: "+spec.String())
	seen := map[string]bool{}
	add := func(c, det string) {
		if c == "" || seen[c] {
			return
		}
		seen[c] = true
		out = append(out, mmDivergence{seed: seed, category: c, detail: det, history: strings.Join(h.log, "\n"), size: len(h.log)})
	}
	h.add = add
	defer func() {
		if p := recover(); p != nil {
			add("panic", fmt.Sprint(p))
		}
	}()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	queue := env.queue
	if spec.fanOut {
		queue = fmt.Sprintf("%s-h%d", env.queue, seed)
		defer env.dropQueue(queue)
	}
	eng, err := engine.NewEngine(ctx, engine.Config{Client: env.rdb, Prefix: h.prefix, Enqueuer: worker.NewClient(env.rdb, queue),
		Logger: logger, Retention: time.Hour})
	if err != nil {
		panic(err)
	}
	h.eng = eng
	owner, element := h.definitions(seed)
	if err := eng.Register(owner, element); err != nil {
		panic(err)
	}
	if spec.fanOut {
		w := worker.New(eng, env.rdb, worker.Config{Queues: map[string]int{queue: 1}, Concurrency: 3, Logger: logger})
		if err := w.Start(ctx); err != nil {
			panic(err)
		}
		defer func() { _ = w.Stop(context.Background()) }()
	}

	items := make([]int, len(spec.elems))
	for i := range items {
		items[i] = i
	}
	h.snapshot()
	var res *engine.Result
	if spec.fanOut {
		res, err = eng.Enqueue(ctx, owner, map[string]any{"items": items}, engine.WithRunID(h.runID))
	} else {
		res, err = eng.Run(ctx, owner, map[string]any{"items": items}, engine.WithRunID(h.runID))
	}
	if err == nil {
		res, err = h.finish(res)
	}
	if err != nil {
		add("run error", err.Error())
		return out
	}
	h.mu.Lock()
	ran := maps.Clone(h.ran)
	h.mu.Unlock()
	expect := h.m.forward(ran)
	if !maps.Equal(ran, expect) {
		add("forward: the elements that ran differ", fmt.Sprintf("engine %v, model %v", sortedKeys(ran), sortedKeys(expect)))
		return out
	}
	if h.m.status == engine.StatusCompleted {
		h.log = append(h.log, "run: completes (elements run: "+fmt.Sprint(sortedKeys(ran))+")")
	} else {
		h.log = append(h.log, "run: fails, rolls back (elements run: "+fmt.Sprint(sortedKeys(ran))+")")
	}
	if c, det := h.checkResult(res); c != "" {
		add(c, det)
	}
	if !h.check(add) {
		return out
	}
	for range 1 + r.IntN(6) {
		op := h.pickOp(r)
		h.snapshot()
		desc, c, det, stop := op()
		h.log = append(h.log, desc)
		if c != "" {
			add(c, det)
			if stop {
				return out
			}
		}
		if desc == "Retry: accepted" {
			return out // the retry is a new run; this one is done
		}
		if !h.check(add) {
			return out
		}
	}
	return out
}

// dropQueue deletes the keys of a fan-out history's own asynq queue.
func (env *mmEnv) dropQueue(queue string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Best effort, as before: redistest's cleanup of the test's queues
	// deletes what is left.
	if ks, err := redistest.ScanKeys(ctx, env.rdb, "asynq:{"+queue+"}:*"); err == nil {
		_ = redistest.Unlink(ctx, env.rdb, ks...)
	}
	env.rdb.SRem(ctx, "asynq:queues", queue)
}

// finish waits for a run handed to workers.
func (h *mmHist) finish(res *engine.Result) (*engine.Result, error) {
	if res.Status.Terminal() {
		return res, nil
	}
	return h.eng.Wait(h.ctx, res.RunID)
}

// checkResult compares a result's Held with the model's.
func (h *mmHist) checkResult(res *engine.Result) (string, string) {
	if res == nil || !res.Status.Terminal() {
		return "", ""
	}
	if want := h.m.held(false); res.Held != want {
		return "P6 Result.Held of the owner differs from the model's", fmt.Sprintf("engine %+v, model %+v (%s; %s)", res.Held, want, h.m.statusSet(), h.ownerReport())
	}
	return "", ""
}

func (m *mmModel) statusSet() string {
	var s []string
	for _, e := range m.entries {
		st := string(e.status)
		if st == "" {
			st = "applied"
		}
		s = append(s, e.path+"="+st)
	}
	return "model: " + strings.Join(s, " ")
}

type mmOp func() (desc, category, detail string, stop bool)

func (h *mmHist) pickOp(r *rand.Rand) mmOp {
	m := h.m
	var ops []mmOp
	ops = append(ops, func() (string, string, string, bool) {
		name := m.spec.writableNames[r.IntN(len(m.spec.writableNames))]
		h.writes++
		v := "w:" + strconv.Itoa(h.writes)
		h.set(h.key(name), v)
		m.kv[name] = v
		return fmt.Sprintf("writer: %s = %s", name, v), "", "", false
	})
	if m.status == engine.StatusCompleted || r.IntN(5) == 0 {
		undo := func() (string, string, string, bool) {
			res, err := h.eng.Undo(h.ctx, h.runID)
			want := m.status == engine.StatusCompleted
			switch {
			case want && err != nil:
				return "Undo", "Undo refused, model accepts it: " + mmErrClass(err), err.Error(), true
			case !want && err == nil:
				return "Undo", "Undo accepted, model refuses it", "", true
			case !want:
				return "Undo: refused", "", "", false
			}
			if res, err = h.finish(res); err != nil {
				return "Undo", "Undo: Wait failed", err.Error(), true
			}
			m.rollback(false)
			c, det := h.checkResult(res)
			return "Undo", c, det, false
		}
		ops = append(ops, undo, undo)
	}
	if m.status != engine.StatusCompleted || r.IntN(5) == 0 {
		retry := func(kill bool) mmOp {
			return func() (string, string, string, bool) {
				desc := "RetryRollback"
				ctx := h.ctx
				if kill {
					desc = "RetryRollback, killed at its first undo call, then Resume"
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(h.ctx)
					defer cancel()
					h.mu.Lock()
					h.kill = cancel
					h.mu.Unlock()
				}
				res, err := h.eng.RetryRollback(ctx, h.runID)
				h.mu.Lock()
				fired := h.kill == nil && kill
				h.kill = nil
				h.mu.Unlock()
				if fired {
					desc += " (killed)"
					if err == nil {
						return desc, "kill: RetryRollback cut short returned no error", "", true
					}
					res, err = h.resume()
					if err != nil {
						return desc, "kill: Resume failed: " + mmErrClass(err), err.Error(), true
					}
				}
				plan, refusal := m.retryPlan()
				switch {
				case err == nil && refusal != nil:
					// The engine went on; what it changed shows in the
					// checks after this operation.
					if _, err = h.finish(res); err != nil {
						return desc, "RetryRollback: Wait failed", err.Error(), true
					}
					return desc, fmt.Sprintf("RetryRollback accepted, model refuses it (%v)", refusal), h.m.statusSet(), false
				case err != nil && refusal == nil:
					return desc, "RetryRollback refused, model accepts it: " + mmErrClass(err),
						fmt.Sprintf("engine: %v; model retries %v", err, paths(plan)), false
				case err != nil && !errors.Is(err, refusal):
					return desc, fmt.Sprintf("RetryRollback refused with %s, model: %v", mmErrClass(err), refusal), err.Error(), false
				case err != nil:
					return desc + ": refused", "", "", false
				}
				if res, err = h.finish(res); err != nil {
					return desc, "RetryRollback: Wait failed", err.Error(), true
				}
				m.retryRollback(plan)
				c, det := h.checkResult(res)
				return desc, c, det, false
			}
		}
		ops = append(ops, retry(false), retry(false))
		if !m.spec.fanOut {
			ops = append(ops, retry(true))
		}
	}
	var open []*mmEntry
	for _, e := range m.entries {
		if e.conflict && !e.resolved {
			open = append(open, e)
		}
	}
	if len(open) > 0 {
		resolve := func() (string, string, string, bool) {
			e := open[r.IntN(len(open))]
			kind := engine.ResolvedManuallyReverted
			if r.IntN(2) == 0 {
				kind = engine.ResolvedLeftApplied
			}
			run := h.runOf(e)
			desc := fmt.Sprintf("Resolve %s of %s %s", e.id, run, kind)
			// The entry id, as the run's report gives it.
			rep, err := h.eng.RollbackReport(h.ctx, run)
			if err != nil {
				return desc, "RollbackStatus of a run with a conflict failed: " + mmErrClass(err), err.Error(), true
			}
			i := slices.IndexFunc(rep.ActionRequired, func(a engine.ActionItem) bool { return a.Run == run && a.ID == e.id })
			if i < 0 {
				return desc, "P3 the conflicted run's ActionRequired lacks the conflict", fmt.Sprintf("%s: %+v", run, rep.ActionRequired), true
			}
			if kind == engine.ResolvedManuallyReverted {
				h.set(h.key(e.res), e.before) // the person puts it back
			}
			err = h.eng.Resolve(h.ctx, run, rep.ActionRequired[i].ID, kind, "checked by the model")
			m.resolve(e, kind)
			if err != nil {
				return desc, "Resolve refused: " + mmErrClass(err), err.Error(), true
			}
			if err := h.eng.Resolve(h.ctx, run, e.id, kind, "again"); !errors.Is(err, engine.ErrAlreadyResolved) {
				return desc, "Resolve repeated: not ErrAlreadyResolved", fmt.Sprint(err), false
			}
			return desc, "", "", false
		}
		ops = append(ops, resolve, resolve, resolve)
	}
	ops = append(ops, func() (string, string, string, bool) {
		_, err := h.eng.Retry(h.ctx, h.runID)
		want := m.retryAllowed()
		var se *engine.StatusError
		switch {
		case want && err != nil:
			return "Retry", "P4 Retry refused, model allows it: " + mmErrClass(err), err.Error(), true
		case !want && err == nil:
			return "Retry: accepted", "P4 Retry allowed while an effect is in place (" + h.inPlaceNames() + ")", h.m.statusSet(), true
		case !want && !errors.As(err, &se):
			return "Retry", "Retry refused without a StatusError", err.Error(), false
		case want:
			return "Retry: accepted", "", "", false
		}
		return "Retry: refused", "", "", false
	})
	return ops[r.IntN(len(ops))]
}

func paths(es []*mmEntry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.path)
	}
	return out
}

// resume resumes the owner after a kill, waiting for the killed call's
// lock to go.
func (h *mmHist) resume() (*engine.Result, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := h.eng.Resume(h.ctx, h.runID)
		if errors.Is(err, engine.ErrRunLocked) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		return res, err
	}
}

func (h *mmHist) inPlaceNames() string {
	var s []string
	for _, e := range h.m.entries {
		if inPlaceStatus(e.status) {
			s = append(s, e.path+"="+string(e.status))
		}
	}
	return "in place: " + strings.Join(s, ",")
}

func mmErrClass(err error) string {
	for _, s := range []error{engine.ErrNotUndoable, engine.ErrNoRollbackToRetry, engine.ErrNothingToRetry,
		engine.ErrNotRetryable, engine.ErrAlreadyRetried, engine.ErrNoSuchConflict, engine.ErrAlreadyResolved,
		engine.ErrRollbackInProgress, engine.ErrRunLocked, engine.ErrNoRollback, engine.ErrNotFound, context.Canceled,
		context.DeadlineExceeded} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "error " + err.Error()
}

// check compares the engine with the model after an operation; false after
// a divergence of state (the history cannot go on meaningfully).
func (h *mmHist) check(add func(category, detail string)) bool {
	c, det, soft := h.checkState()
	if c != "" {
		add(c, det)
		return soft
	}
	return true
}

// eventually polls cond for a while (a fan-out map's last writes may land
// just after its owner's result is visible).
func (h *mmHist) eventually(cond func() (bool, error)) (bool, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		ok, err := cond()
		if ok || err != nil || time.Now().After(deadline) {
			return ok, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *mmHist) pttl(kind, id string) (time.Duration, error) {
	if kind == "elem" {
		return h.rdb.PTTL(h.ctx, keys.New(h.prefix).ElemState(id)).Result()
	}
	return h.rdb.PTTL(h.ctx, h.prefix+":{"+kind+":"+id+"}:ctx").Result()
}

// checkState returns the first divergence; soft: the history may go on.
func (h *mmHist) checkState() (category, detail string, soft bool) {
	m := h.m
	ctx := h.ctx
	h.mu.Lock()
	violations := slices.Clone(h.violations)
	calls, oks := maps.Clone(h.calls), maps.Clone(h.oks)
	h.mu.Unlock()
	if len(violations) > 0 {
		return "P1 restore over somebody else's write", strings.Join(violations, "; "), false
	}
	for p, n := range oks {
		if n > 1 {
			return "P2 an entry undone twice", fmt.Sprintf("%s: %d successful Undo/Restore calls", p, n), false
		}
	}
	for _, e := range m.entries {
		if got := calls[e.path]; got != e.calls {
			kind := "plain Undo"
			if e.guarded {
				kind = "guarded Restore"
			}
			where := "owner's own step"
			if e.elem >= 0 {
				where = "element's step"
				if m.elemFailed[e.elem] {
					where = "step of an element that failed forward"
				}
			}
			return fmt.Sprintf("P2 calls of a %s's %s: engine %s, model %s", where, kind, mmCalls(got), mmCalls(e.calls)),
				fmt.Sprintf("%s: engine called %d times, model %d (%s)", e.path, got, e.calls, m.statusSet()), false
		}
	}
	names := slices.Sorted(maps.Keys(m.kv))
	for _, name := range names {
		if got, want := h.get(h.key(name)), m.kv[name]; got != want {
			return "resources: engine and model hold different values", fmt.Sprintf("%s: engine %q, model %q", name, got, want), false
		}
	}
	run, err := h.eng.Get(ctx, h.runID)
	if err != nil {
		return "Get failed", err.Error(), false
	}
	if run.Status != m.status {
		return fmt.Sprintf("owner status: engine %s, model %s", run.Status, m.status), "", false
	}
	if want := m.held(false); run.Held != want {
		h.add("P6 Run.Held of the owner differs from the model's", fmt.Sprintf("engine %+v, model %+v (%s; %s)", run.Held, want, m.statusSet(), h.ownerReport()))
	}
	// The elements' own reports.
	for i := range m.spec.elems {
		if !m.elemRolled[i] {
			continue
		}
		id := h.elemID(i)
		rep, err := h.eng.RollbackReport(ctx, id)
		if err != nil {
			return "RollbackStatus of a rolled back element failed: " + mmErrClass(err), err.Error(), false
		}
		var got, want []string
		for _, re := range rep.Entries {
			if re.Step == "g" || re.Step == "p" {
				got = append(got, re.Step+"="+string(re.Status))
			}
		}
		for _, e := range m.entries {
			if e.elem == i && e.status != "" {
				want = append(want, e.step+"="+string(e.status))
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			return "P5 an element's report entries differ", fmt.Sprintf("%s: engine %v, model %v", id, got, want), false
		}
		var action []string
		for _, a := range rep.ActionRequired {
			action = append(action, a.Run+"/"+a.ID)
		}
		var wantAction []string
		if m.elemOpen(i) {
			wantAction = []string{id + "/g#1"}
		}
		if !slices.Equal(action, wantAction) {
			h.add("P3 an element's ActionRequired differs from its open conflict", fmt.Sprintf("engine %v, model %v", action, wantAction))
		}
	}
	// The owner's report.
	open := m.open(h)
	if m.gen > 0 {
		rep, err := h.eng.RollbackReport(ctx, h.runID)
		if err != nil {
			return "RollbackStatus of the owner failed: " + mmErrClass(err), err.Error(), false
		}
		for _, e := range m.entries {
			if e.elem >= 0 || e.status == "" {
				continue
			}
			i := slices.IndexFunc(rep.Entries, func(re engine.RollbackEntry) bool { return re.ID == e.id })
			if i < 0 || rep.Entries[i].Status != e.status {
				got := "none"
				if i >= 0 {
					got = string(rep.Entries[i].Status)
				}
				return fmt.Sprintf("P5 the owner's own entry: engine %s, model %s", got, e.status), e.path + ": " + m.statusSet(), false
			}
		}
		if wh := m.held(true); rep.ElementsHeld.Waiting != wh.Waiting {
			h.add("P3 ElementsHeld.Waiting differs from the model's", fmt.Sprintf("engine %+v, model %+v (%s)", rep.ElementsHeld, wh, m.statusSet()))
		} else if rep.ElementsHeld != wh {
			h.add("P6 ElementsHeld differs from the model's", fmt.Sprintf("engine %+v, model %+v (%s)", rep.ElementsHeld, wh, m.statusSet()))
		}
		var action []string
		for _, a := range rep.ActionRequired {
			action = append(action, a.Run+"/"+a.ID)
		}
		slices.Sort(action)
		if !slices.Equal(action, open) {
			cat := "P3 the owner's ActionRequired differs from the open conflicts"
			if len(action) < len(open) {
				cat = "P3 the owner's ActionRequired lacks an open conflict"
				for _, o := range open {
					if !slices.Contains(action, o) {
						e := m.entries[slices.IndexFunc(m.entries, func(e *mmEntry) bool { return h.runOf(e)+"/"+e.id == o })]
						switch {
						case e.elem < 0:
							cat += " (the owner's own)"
						case m.elemFailed[e.elem] && m.spec.partial:
							cat += " (of an element that failed forward, Partial map)"
						case m.elemFailed[e.elem]:
							cat += " (of an element that failed forward, atomic map)"
						default:
							cat += " (of an element the owner's rollback undid)"
						}
						break
					}
				}
			}
			h.add(cat, fmt.Sprintf("engine %v, model %v (%s)", action, open, m.statusSet()))
		}
		if rep.Summary.Outcome == engine.RollbackInProgress {
			h.add("P5 summary outcome in_progress on a settled owner", "")
		}
		if o := m.outcome(); rep.Summary.Outcome != o {
			h.add(fmt.Sprintf("P5 summary outcome: engine %s, model %s", rep.Summary.Outcome, o), m.statusSet()+"; "+h.ownerReport())
		}
	}
	// Every conflict listed until resolved; nothing of the tree expires.
	var missing string
	ok, err := h.eventually(func() (bool, error) {
		waiting, err := h.eng.NeedsHuman(ctx, 1000)
		if err != nil {
			return false, err
		}
		if got, want := slices.Contains(waiting, h.runID), len(open) > 0; got != want {
			missing = fmt.Sprintf("P3 NeedsHuman lists the owner: %v, model's open conflicts in its tree: %d", got, len(open))
			return false, nil
		}
		for i := range m.spec.elems {
			if got, want := slices.Contains(waiting, h.elemID(i)), m.elemOpen(i); got != want {
				missing = fmt.Sprintf("P3 NeedsHuman lists an element: %v, model: its conflict is open: %v", got, want)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return "NeedsHuman failed", err.Error(), false
	}
	if !ok {
		h.add(missing, strings.Join(open, ",")+" "+m.statusSet())
	}
	var ttlDetail string
	ok, err = h.eventually(func() (bool, error) {
		owner, err := h.pttl("run", h.runID)
		if err != nil {
			return false, err
		}
		if len(open) > 0 && owner != -1 {
			missing, ttlDetail = "P3 the owner's state expires while a conflict in its tree is open", fmt.Sprintf("PTTL %s", owner)
			return false, nil
		}
		if len(open) == 0 && owner <= 0 {
			missing, ttlDetail = "P3b the owner's state never expires though nothing in its tree waits", fmt.Sprintf("PTTL %s", owner)
			return false, nil
		}
		for i := range m.spec.elems {
			if !m.ran[i] {
				continue
			}
			ttl, err := h.pttl("elem", h.elemID(i))
			if err != nil {
				return false, err
			}
			if m.elemOpen(i) && ttl != -1 {
				missing, ttlDetail = "P3 an element's state expires while its conflict is open", fmt.Sprintf("element %d: PTTL %s", i, ttl)
				return false, nil
			}
			if len(open) == 0 && ttl <= 0 {
				missing, ttlDetail = "P3b an element's state never expires though nothing in its tree waits", fmt.Sprintf("element %d: PTTL %s", i, ttl)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return "PTTL failed", err.Error(), false
	}
	if !ok {
		h.add(missing, ttlDetail+"; "+m.statusSet())
	}
	// Retry refused while any effect is in place.
	_, err = h.eng.Check(ctx, h.runID, engine.OpRetry)
	switch want := m.retryAllowed(); {
	case want && err != nil:
		h.add("P4 Check(OpRetry) refuses, model allows it: "+mmErrClass(err), err.Error())
	case !want && err == nil:
		h.add("P4 Check(OpRetry) allows Retry while an effect is in place", h.inPlaceNames())
	}
	return "", "", true
}

// ownerReport is the engine's report of the owner, for a divergence's
// detail.
func (h *mmHist) ownerReport() string {
	rep, err := h.eng.RollbackReport(h.ctx, h.runID)
	if err != nil {
		return "engine's owner report: " + mmErrClass(err)
	}
	var s []string
	for _, e := range rep.Entries {
		s = append(s, e.Step+"="+string(e.Status))
	}
	return fmt.Sprintf("engine's owner report: %s, elements_held %+v", strings.Join(s, " "), rep.ElementsHeld)
}

func mmCalls(n int) string {
	if n > 1 {
		return "2+"
	}
	return strconv.Itoa(n)
}
