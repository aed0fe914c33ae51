package engine_test

// The acceptance test of issue 21, "one truth per rollback entry": a
// model-based test of rollback. A seeded generator draws small histories (a
// definition, a run, then operations on it); each history runs against the
// real engine on a real Redis and against a small reference model written
// here, and the two are compared after every operation.
//
// The model encodes the target semantics of rollback, not what the engine
// does today: where they differ, the test reports the divergence, grouped by
// kind, with the shortest history that shows it and the seed to replay it:
//
//	GOREACTOR_MODEL_SEED=<seed> GOREACTOR_MODEL_FEATURES=<features> \
//	  go test -race ./reactor/ -run TestRollbackModel -v
//
// -long (go test ./reactor/ -run TestRollbackModel -long) draws 100,000
// histories instead of the default 2,000; GOREACTOR_MODEL_N sets the number
// per feature set, and GOREACTOR_MODEL_FEATURES restricts the run to one
// feature set (a comma-separated list of the features below).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redistest"
)

var longModel = flag.Bool("long", false, "TestRollbackModel: draw 100,000 histories")

// Features of the history generator: each names something a history may
// contain, so a failing area can be run on its own.
const (
	fGuarded  = "guarded"  // guarded steps (Guard + RecordEffect) on the shared resources
	fResource = "resource" // plain steps name a shared resource (StepConfig.Resource)
	fNoUndo   = "noundo"   // steps without an Undo
	fFail     = "fail"     // a last step that fails, rolling the run back
	fUndoFail = "undofail" // Undo instances fail on chosen attempts
	fWriter   = "writer"   // a concurrent writer clobbers a resource
	fResolve  = "resolve"  // Engine.Resolve of conflicts
	fRetryRB  = "retryrb"  // Engine.RetryRollback
	fUndo     = "undo"     // Engine.Undo of a completed run
	fCompose  = "compose"  // composed children (reactor.Compose) with their own undo window
	fWindow   = "window"   // undo windows and clock advances (SetServerClockSkew)
	fSteps    = "steps"    // Engine.UndoSteps
	fRetry    = "retry"    // Engine.Retry (refused or accepted)
)

var modelFeatureSets = []struct{ name, features string }{
	{"stage1", "guarded,resource,noundo,fail,undofail,writer,resolve,retryrb,undo"},
	{"compose_windows", "guarded,resource,noundo,fail,undofail,writer,resolve,retryrb,undo,compose,window"},
	{"steps_retry", "guarded,resource,noundo,fail,undofail,writer,resolve,retryrb,undo,steps,retry"},
	{"all", "guarded,resource,noundo,fail,undofail,writer,resolve,retryrb,undo,compose,window,steps,retry"},
}

func TestRollbackModel(t *testing.T) {
	t.Parallel()
	n := 500 // per feature set: 2,000 in all
	if *longModel {
		n = 25_000
	}
	if v := os.Getenv("GOREACTOR_MODEL_N"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	sets := modelFeatureSets
	if v := os.Getenv("GOREACTOR_MODEL_FEATURES"); v != "" {
		sets = []struct{ name, features string }{{"custom", v}}
	}
	var seed int64 = -1
	if v := os.Getenv("GOREACTOR_MODEL_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
	}
	rdb := redistest.Client(t)
	for _, set := range sets {
		t.Run(set.name, func(t *testing.T) {
			t.Parallel()
			prefix := redistest.Prefix(t)
			feats := parseFeatures(set.features)
			if seed >= 0 {
				for _, d := range runHistory(rdb, prefix, feats, seed) {
					t.Errorf("divergence: %s\n  %s\n%s", d.category, d.detail, indent(d.history))
				}
				return
			}
			runHistories(t, rdb, prefix, set.features, feats, n)
		})
	}
}

func parseFeatures(s string) map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			m[f] = true
		}
	}
	return m
}

// runHistories runs n histories on a few goroutines and reports each kind
// of divergence once, with the shortest history that shows it.
func runHistories(t *testing.T, rdb redis.UniversalClient, prefix, features string, feats map[string]bool, n int) {
	type found struct {
		count int
		best  divergence
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
				ds := runHistory(rdb, prefix, feats, i)
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
	cats := make([]string, 0, len(byCat))
	for c := range byCat {
		cats = append(cats, c)
	}
	sort.Strings(cats)
	for _, c := range cats {
		f := byCat[c]
		t.Errorf("%s\n  in %d of %d histories; shortest: seed %d (GOREACTOR_MODEL_SEED=%d GOREACTOR_MODEL_FEATURES=%s)\n  %s\n%s",
			c, f.count, n, f.best.seed, f.best.seed, features, f.best.detail, indent(f.best.history))
	}
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

// ---- the history's definition

type mkind int

const (
	mPlain mkind = iota
	mGuarded
	mNoUndo
	mCompose
	mFail
)

// mStep is a step of a generated definition.
type mStep struct {
	name     string
	kind     mkind
	res      int          // the shared resource it changes (-1: none)
	failOn   map[int]bool // plain: the Undo attempts that fail
	children []*mStep     // compose
	// fail: the resources a concurrent writer clobbers meanwhile, and the
	// server clock skew it sets (the step takes that long), before failing.
	clobber []int
	skew    time.Duration
}

type mSpec struct {
	steps               []*mStep
	window, childWindow time.Duration
	resources           int
}

func (s *mSpec) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "window=%s child_window=%s:", s.window, s.childWindow)
	var step func(st *mStep)
	step = func(st *mStep) {
		b.WriteString(" " + st.name + ":")
		switch st.kind {
		case mPlain:
			b.WriteString("plain")
			if st.res >= 0 {
				fmt.Fprintf(&b, "(r%d)", st.res)
			}
			if len(st.failOn) > 0 {
				var at []int
				for k := range st.failOn {
					at = append(at, k)
				}
				slices.Sort(at)
				fmt.Fprintf(&b, "[undo fails on attempts %v]", at)
			}
		case mGuarded:
			fmt.Fprintf(&b, "guarded(r%d)", st.res)
		case mNoUndo:
			b.WriteString("no_undo")
		case mCompose:
			b.WriteString("compose{")
			for _, c := range st.children {
				step(c)
			}
			b.WriteString(" }")
		case mFail:
			b.WriteString("fails")
			for _, r := range st.clobber {
				fmt.Fprintf(&b, "[writer clobbers r%d first]", r)
			}
			if st.skew > 0 {
				fmt.Fprintf(&b, "[clock at +%s first]", st.skew)
			}
		}
	}
	for _, st := range s.steps {
		step(st)
	}
	return b.String()
}

func genSpec(r *rand.Rand, f map[string]bool) *mSpec {
	s := &mSpec{resources: 2 + r.IntN(2)}
	if f[fWindow] {
		s.window = []time.Duration{0, time.Hour, 2 * time.Hour}[r.IntN(3)]
		if s.window == 0 {
			s.childWindow = []time.Duration{0, 30 * time.Minute, time.Hour}[r.IntN(3)]
		} else {
			s.childWindow = []time.Duration{30 * time.Minute, time.Hour, s.window}[r.IntN(3)]
			s.childWindow = min(s.childWindow, s.window)
		}
	}
	leaf := func(name string) *mStep {
		var kinds []mkind
		kinds = append(kinds, mPlain, mPlain)
		if f[fGuarded] {
			kinds = append(kinds, mGuarded, mGuarded)
		}
		if f[fNoUndo] {
			kinds = append(kinds, mNoUndo)
		}
		st := &mStep{name: name, kind: kinds[r.IntN(len(kinds))], res: -1}
		switch st.kind {
		case mPlain:
			if f[fResource] && r.IntN(10) < 7 {
				st.res = r.IntN(s.resources)
			}
			if f[fUndoFail] && r.IntN(10) < 3 {
				st.failOn = map[int]bool{}
				for _, a := range [][]int{{1}, {1}, {2}, {1, 2}}[r.IntN(4)] {
					st.failOn[a] = true
				}
			}
		case mGuarded:
			st.res = r.IntN(s.resources)
		}
		return st
	}
	n := 2 + r.IntN(5)
	fail := f[fFail] && r.IntN(10) < 6
	if fail {
		n--
	}
	composes := 0
	for i := range n {
		if f[fCompose] && composes < 2 && r.IntN(10) < 3 {
			composes++
			c := &mStep{name: "c" + strconv.Itoa(composes), kind: mCompose, res: -1}
			for j := range 1 + r.IntN(3) {
				c.children = append(c.children, leaf(string(rune('x'+j))))
			}
			s.steps = append(s.steps, c)
			continue
		}
		s.steps = append(s.steps, leaf(string(rune('a'+i))))
	}
	if fail {
		st := &mStep{name: "fail", kind: mFail, res: -1}
		if f[fWriter] && r.IntN(2) == 0 {
			st.clobber = []int{r.IntN(s.resources)}
		}
		if f[fWindow] && r.IntN(2) == 0 {
			st.skew = []time.Duration{40 * time.Minute, 75 * time.Minute, 150 * time.Minute}[r.IntN(3)]
		}
		s.steps = append(s.steps, st)
	}
	return s
}

// ---- the reference model

// mEntry is a step that completed, as the model sees it: a ledger entry
// (plain with an Undo, guarded), a step without Undo, or the failing step.
type mEntry struct {
	id, path      string
	kind          mkind
	res           string // the resource's key ("" none)
	resName       string
	before, after string
	child         bool // judged by the child's undo window
	failOn        map[int]bool
	// status is its rollback status ("" while no rollback reached it).
	status   engine.RollbackStatus
	inReport bool
	calls    int // Undo calls (plain) or Restore calls (guarded) the model expects
	conflict bool
	resolved bool
	// blockers are the entries that could block it when it was blocked:
	// the newer entries on its resource then in place.
	blockers []string
}

func (e *mEntry) ledger() bool { return e.kind == mPlain || e.kind == mGuarded }

// applied reports whether e's effect stays in place.
func (e *mEntry) applied() bool {
	if !e.ledger() {
		return false
	}
	switch e.status {
	case engine.RollbackCompensated, engine.RollbackManuallyReverted:
		return false
	}
	return true
}

type model struct {
	entries []*mEntry // completion order, oldest first
	report  []*mEntry // in the order a rollback first reached them
	kv      map[string]string
	skew    time.Duration
	spec    *mSpec
	status  engine.Status
	gen     int
	retried bool
}

func (m *model) window(e *mEntry) time.Duration {
	if e.child {
		return m.spec.childWindow
	}
	return m.spec.window
}

func (m *model) touch(e *mEntry) {
	if !e.inReport {
		e.inReport = true
		m.report = append(m.report, e)
	}
}

func (m *model) index(e *mEntry) int { return slices.Index(m.entries, e) }

// blocker is what keeps e from being undone: a newer entry on its resource
// still applied, from any rollback generation. left: a person left one of
// them applied, so e is kept for good.
func (m *model) blocker(e *mEntry) (by *mEntry, left bool) {
	if e.res == "" {
		return nil, false
	}
	for i := m.index(e) + 1; i < len(m.entries); i++ {
		n := m.entries[i]
		if n.res != e.res || !n.applied() {
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

// undoOne is the rollback reaching ledger entry e; oow: judged past its
// undo window when the rollback started.
func (m *model) undoOne(e *mEntry, oow bool) {
	m.touch(e)
	if e.conflict && !e.resolved || e.status == engine.RollbackLeftApplied {
		return // never attempted again (until resolved), or kept for good
	}
	if oow {
		e.status = engine.RollbackOutOfWindow
		return
	}
	if by, left := m.blocker(e); by != nil {
		e.status, e.blockers = engine.RollbackBlocked, nil
		for i := m.index(e) + 1; i < len(m.entries); i++ {
			if n := m.entries[i]; n.res == e.res && n.applied() {
				e.blockers = append(e.blockers, n.id)
			}
		}
		if left {
			e.status = engine.RollbackLeftApplied
		}
		return
	}
	switch e.kind {
	case mGuarded:
		switch m.kv[e.res] {
		case e.after:
			e.calls++
			m.kv[e.res] = e.before
			e.status = engine.RollbackCompensated
		case e.before:
			e.status = engine.RollbackCompensated // reactor.already_reverted
		default:
			e.status, e.conflict = engine.RollbackNeedsPerson, true
		}
	case mPlain:
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
}

func (m *model) oow(e *mEntry) bool {
	w := m.window(e)
	return w > 0 && m.skew > w
}

// rollback is a whole rollback (a failure, or Undo): every entry still
// applied, newest first, windows judged at its start.
func (m *model) rollback(failure bool) {
	m.gen++
	judged := map[*mEntry]bool{}
	for _, e := range m.entries {
		if e.applied() {
			judged[e] = m.oow(e)
		}
	}
	for i := len(m.entries) - 1; i >= 0; i-- {
		e := m.entries[i]
		switch {
		case e.kind == mFail:
			m.touch(e)
			e.status = engine.RollbackNoCompensation
		case e.kind == mNoUndo:
			m.touch(e)
			e.status = engine.RollbackNoCompensation
		case e.applied():
			m.undoOne(e, judged[e])
		}
	}
	m.status = engine.StatusCancelled
	if failure {
		m.status = engine.StatusFailed
	}
}

// retryRollback is RetryRollback: "" when it runs, else the refusal.
func (m *model) retryRollback() error {
	if m.status != engine.StatusFailed && m.status != engine.StatusCancelled {
		return engine.ErrNoRollbackToRetry
	}
	var retry []*mEntry
	for i := len(m.entries) - 1; i >= 0; i-- {
		e := m.entries[i]
		if e.ledger() && (e.status == engine.RollbackFailed || e.status == engine.RollbackBlocked) {
			retry = append(retry, e)
		}
	}
	if len(retry) == 0 {
		return engine.ErrNothingToRetry
	}
	m.gen++
	for _, e := range retry {
		m.undoOne(e, false) // the first rollback's window verdict stands
	}
	return nil
}

// undoSteps is UndoSteps: the refusal, if any.
func (m *model) undoSteps(names []string) error {
	if m.status != engine.StatusCompleted {
		return engine.ErrNotUndoable
	}
	targets := map[*mEntry]bool{}
	var kept []*mEntry
	for _, name := range names {
		for _, e := range m.entries {
			switch {
			case e.ledger() && e.applied() && (e.path == name || strings.HasPrefix(e.path, name+"/")):
				targets[e] = true
			case e.kind == mNoUndo && e.path == name && !slices.Contains(kept, e):
				kept = append(kept, e)
			}
		}
	}
	for e := range targets {
		if e.res == "" {
			continue
		}
		for i := m.index(e) + 1; i < len(m.entries); i++ {
			if n := m.entries[i]; n.res == e.res && n.applied() && !targets[n] {
				return engine.ErrResourceOrder
			}
		}
	}
	if len(targets) == 0 && len(kept) == 0 {
		return nil
	}
	m.gen++
	for _, e := range kept {
		m.touch(e)
		e.status = engine.RollbackNoCompensation
	}
	judged := map[*mEntry]bool{}
	for e := range targets {
		judged[e] = m.oow(e)
	}
	for i := len(m.entries) - 1; i >= 0; i-- {
		if e := m.entries[i]; targets[e] {
			m.undoOne(e, judged[e])
		}
	}
	return nil
}

func (m *model) resolve(e *mEntry, kind engine.Resolution) {
	e.resolved = true
	e.status = engine.RollbackStatus(kind)
	if kind == engine.ResolvedManuallyReverted {
		m.kv[e.res] = e.before
		return
	}
	for i := m.index(e) - 1; i >= 0; i-- {
		if o := m.entries[i]; o.res == e.res && o.status == engine.RollbackBlocked {
			o.status = engine.RollbackLeftApplied
		}
	}
}

// effectInPlace: an entry a rollback reached did not revert and stays.
func (m *model) effectInPlace() bool {
	for _, e := range m.entries {
		switch e.status {
		case engine.RollbackFailed, engine.RollbackNeedsPerson, engine.RollbackBlocked,
			engine.RollbackLeftApplied, engine.RollbackOutOfWindow:
			return true
		}
	}
	return false
}

func (m *model) retryAllowed() bool {
	return (m.status == engine.StatusFailed || m.status == engine.StatusCancelled) && !m.effectInPlace() && !m.retried
}

func (m *model) unresolved() []string {
	var out []string
	for _, e := range m.entries {
		if e.conflict && !e.resolved {
			out = append(out, e.id)
		}
	}
	slices.Sort(out)
	return out
}

// outcome is the summary of the report's entries.
func (m *model) outcome() engine.RollbackOutcome {
	var human, kept, reverted bool
	for _, e := range m.report {
		switch e.status {
		case engine.RollbackFailed, engine.RollbackNeedsPerson, engine.RollbackBlocked:
			human = true
		case engine.RollbackLeftApplied, engine.RollbackOutOfWindow:
			kept = true
		case engine.RollbackCompensated, engine.RollbackManuallyReverted:
			reverted = true
		}
	}
	switch {
	case human:
		return engine.RollbackNeedsHuman
	case kept:
		return "kept_in_place"
	case reverted:
		return engine.RollbackReverted
	}
	return engine.RollbackNothingToDo
}

// ---- one history against the engine

// divergence is where engine and model first disagreed in a history.
type divergence struct {
	seed     int64
	category string // the property and what differed, without names: groups alike divergences
	detail   string
	history  string
	size     int
}

type hist struct {
	ctx    context.Context
	rdb    redis.UniversalClient
	eng    *engine.Engine
	prefix string
	m      *model
	runID  string
	log    []string

	mu         sync.Mutex
	calls      map[string]int // Undo calls (plain), Restore calls (guarded), by step path
	oks        map[string]int // calls that changed something
	violations []string
	writes     int
}

func (h *hist) key(r int) string { return h.prefix + ":r" + strconv.Itoa(r) }

func (h *hist) get(key string) string {
	v, err := h.rdb.Get(h.ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		panic(err)
	}
	return v
}

func (h *hist) set(key, v string) {
	if err := h.rdb.Set(h.ctx, key, v, 0).Err(); err != nil {
		panic(err)
	}
}

func (h *hist) violate(format string, args ...any) {
	h.mu.Lock()
	h.violations = append(h.violations, fmt.Sprintf(format, args...))
	h.mu.Unlock()
}

type mOut struct {
	Before string `msgpack:"b"`
	After  string `msgpack:"a"`
}

// valueOf is the value step path writes: the writer of a value is read
// back from it.
func valueOf(path string) string { return "v:" + path }

func writerOf(v string) (string, bool) { return strings.CutPrefix(v, "v:") }

func (h *hist) part(st *mStep, path string, childWindow time.Duration, seed int64) engine.Part {
	key := ""
	if st.res >= 0 {
		key = h.key(st.res)
	}
	switch st.kind {
	case mCompose:
		var parts []engine.Part
		if childWindow > 0 {
			parts = append(parts, engine.UndoWindow(childWindow))
		}
		for _, c := range st.children {
			parts = append(parts, h.part(c, path+"/"+c.name, 0, seed))
		}
		child := engine.MustDefine(fmt.Sprintf("model-%s-%d-%s", h.prefixTag(), seed, st.name), parts...)
		return engine.Compose(st.name, child, engine.ComposeConfig{})
	case mNoUndo:
		return engine.Step(st.name, engine.StepConfig[engine.Args, mOut]{
			Run: func(context.Context, engine.Args) (mOut, error) { return mOut{After: valueOf(path)}, nil },
		})
	case mFail:
		return engine.Step(st.name, engine.StepConfig[engine.Args, mOut]{
			Run: func(context.Context, engine.Args) (mOut, error) {
				for _, r := range st.clobber {
					h.writes++
					h.set(h.key(r), "w:"+strconv.Itoa(h.writes))
				}
				if st.skew > 0 {
					engine.SetServerClockSkew(h.eng, st.skew)
				}
				return mOut{}, engine.Permanent(errors.New("downstream refused"))
			},
		})
	case mGuarded:
		g := engine.Guarded(engine.GuardConfig[string]{
			Probe: func(ctx context.Context, k string) (string, error) { return h.get(k), nil },
			Restore: func(ctx context.Context, k, before, _ string) (engine.RestoreResult, error) {
				h.mu.Lock()
				h.calls[path]++
				h.oks[path]++
				h.mu.Unlock()
				if cur := h.get(k); cur != valueOf(path) {
					h.violate("Restore of %s wrote over %q (not its own write)", path, cur)
				}
				h.set(k, before)
				return engine.RestoreWritten, nil
			},
		})
		return engine.Step(st.name, engine.StepConfig[engine.Args, mOut]{
			Guard: g,
			Run: func(ctx context.Context, _ engine.Args) (mOut, error) {
				before := h.get(key)
				h.set(key, valueOf(path))
				return mOut{Before: before, After: valueOf(path)}, engine.RecordEffect(ctx,
					engine.Effect{Resource: key, Before: before, After: valueOf(path), Label: path})
			},
		})
	}
	cfg := engine.StepConfig[engine.Args, mOut]{
		Run: func(ctx context.Context, _ engine.Args) (mOut, error) {
			if key == "" {
				return mOut{After: valueOf(path)}, nil
			}
			before := h.get(key)
			h.set(key, valueOf(path))
			return mOut{Before: before, After: valueOf(path)}, nil
		},
		Undo: func(ctx context.Context, _ engine.Args, out mOut) error {
			h.mu.Lock()
			h.calls[path]++
			n := h.calls[path]
			h.mu.Unlock()
			if st.failOn[n] {
				return fmt.Errorf("undo of %s refused (attempt %d)", path, n)
			}
			if key != "" {
				// A plain Undo writes blindly: over an outside writer's
				// value by design, but never over another entry of the
				// run still in place (the engine's resource blocking).
				if cur := h.get(key); cur != out.After {
					if w, ok := writerOf(cur); ok && w != path {
						h.violate("Undo of %s wrote over %q, the effect of %s still in place", path, cur, w)
					}
				}
				h.set(key, out.Before)
			}
			h.mu.Lock()
			h.oks[path]++
			h.mu.Unlock()
			return nil
		},
	}
	if key != "" {
		cfg.Resource = func(engine.Args, mOut) string { return key }
	}
	return engine.Step(st.name, cfg)
}

func (h *hist) prefixTag() string { return h.prefix[strings.LastIndex(h.prefix, ":")+1:] }

// forward computes the model's entries and resources after the forward run.
func (m *model) forward(h *hist) {
	ord := 0
	for _, st := range m.spec.steps {
		switch st.kind {
		case mCompose:
			ord++ // the compose entry
			cord := 0
			for _, c := range st.children {
				m.leaf(h, c, st.name+"/"+c.name, &cord, true)
			}
		case mFail:
			m.entries = append(m.entries, &mEntry{id: "fail#0", path: "fail", kind: mFail})
			for _, r := range st.clobber {
				h.writes++ // the step's own writes get the same values (runHistory)
				m.kv[h.key(r)] = "w:" + strconv.Itoa(h.writes)
			}
			if st.skew > 0 {
				m.skew = st.skew
			}
		default:
			m.leaf(h, st, st.name, &ord, false)
		}
	}
}

func (m *model) leaf(h *hist, st *mStep, path string, ord *int, child bool) {
	e := &mEntry{path: path, kind: st.kind, child: child, failOn: st.failOn, after: valueOf(path)}
	if st.kind == mNoUndo {
		e.id = path + "#0"
		m.entries = append(m.entries, e)
		return
	}
	*ord++
	e.id = path + "#" + strconv.Itoa(*ord)
	if st.res >= 0 {
		e.res, e.resName = h.key(st.res), "r"+strconv.Itoa(st.res)
		e.before = m.kv[e.res]
		m.kv[e.res] = e.after
	}
	m.entries = append(m.entries, e)
}

func runHistory(rdb redis.UniversalClient, basePrefix string, feats map[string]bool, seed int64) (out []divergence) {
	r := rand.New(rand.NewPCG(uint64(seed), 0x21))
	spec := genSpec(r, feats)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := &hist{ctx: ctx, rdb: rdb, prefix: basePrefix + ":h" + strconv.FormatInt(seed, 10),
		calls: map[string]int{}, oks: map[string]int{}}
	h.m = &model{kv: map[string]string{}, spec: spec}
	h.log = append(h.log, "definition: "+spec.String())
	seen := map[string]bool{}
	// add records a divergence once per history, with the history so far.
	add := func(c, det string) {
		if c == "" || seen[c] {
			return
		}
		seen[c] = true
		out = append(out, divergence{seed: seed, category: c, detail: det, history: strings.Join(h.log, "\n"),
			size: len(h.log) + len(spec.steps)})
	}
	defer func() {
		if p := recover(); p != nil {
			add("panic", fmt.Sprint(p))
		}
	}()
	eng, err := engine.NewEngine(ctx, engine.Config{Client: rdb, Prefix: h.prefix, Enqueuer: &wakeLog{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	h.eng = eng
	var parts []engine.Part
	if spec.window > 0 {
		parts = append(parts, engine.UndoWindow(spec.window))
	}
	for _, st := range spec.steps {
		parts = append(parts, h.part(st, st.name, spec.childWindow, seed))
	}
	def := engine.MustDefine(fmt.Sprintf("model-%s-%d", h.prefixTag(), seed), parts...)
	if err := eng.Register(def); err != nil {
		panic(err)
	}

	// The forward run: the model's writes are counted on a copy of the
	// writer's counter, the step's own on the real one.
	writes := h.writes
	h.m.forward(h)
	h.writes = writes
	res, err := eng.Run(ctx, def, nil)
	if err != nil {
		add("run error", err.Error())
		return out
	}
	h.runID = res.RunID
	h.m.status = engine.StatusCompleted
	if slices.ContainsFunc(spec.steps, func(s *mStep) bool { return s.kind == mFail }) {
		h.m.rollback(true)
		h.log = append(h.log, "run: fails, rolls back")
	} else {
		h.log = append(h.log, "run: completes")
	}
	if !h.check(add) {
		return out
	}
	for range 1 + r.IntN(5) {
		op, ok := h.pickOp(r, feats)
		if !ok {
			break
		}
		desc, c, det := op()
		h.log = append(h.log, desc)
		if c != "" {
			add(c, det)
			return out
		}
		if !h.check(add) {
			return out
		}
	}
	return out
}

// pickOp draws the next operation among those the features allow.
func (h *hist) pickOp(r *rand.Rand, f map[string]bool) (func() (desc, category, detail string), bool) {
	m := h.m
	var ops []func() (string, string, string)
	if f[fWriter] {
		ops = append(ops, func() (string, string, string) {
			res := r.IntN(m.spec.resources)
			h.writes++
			v := "w:" + strconv.Itoa(h.writes)
			h.set(h.key(res), v)
			m.kv[h.key(res)] = v
			return fmt.Sprintf("writer: r%d = %s", res, v), "", ""
		})
	}
	if f[fWindow] {
		ops = append(ops, func() (string, string, string) {
			m.skew += []time.Duration{40 * time.Minute, 75 * time.Minute}[r.IntN(2)]
			engine.SetServerClockSkew(h.eng, m.skew)
			return fmt.Sprintf("clock: now +%s", m.skew), "", ""
		})
	}
	if f[fUndo] && (m.status == engine.StatusCompleted || r.IntN(4) == 0) {
		undo := func() (string, string, string) {
			_, err := h.eng.Undo(h.ctx, h.runID)
			want := m.status == engine.StatusCompleted
			if want {
				m.rollback(false)
			}
			return "Undo", h.decision("Undo", want, err, engine.ErrNotUndoable), ""
		}
		ops = append(ops, undo, undo)
	}
	if f[fRetryRB] && (m.status != engine.StatusCompleted || r.IntN(4) == 0) {
		retry := func() (string, string, string) {
			_, err := h.eng.RetryRollback(h.ctx, h.runID)
			refusal := m.retryRollback()
			if c := h.decision("RetryRollback", refusal == nil, err, refusal); c != "" {
				return "RetryRollback", c, fmt.Sprintf("engine: %v; model: %v", err, refusal)
			}
			return "RetryRollback", "", ""
		}
		ops = append(ops, retry, retry)
	}
	if f[fResolve] {
		if open := m.unresolved(); len(open) > 0 {
			resolve := func() (string, string, string) {
				id := open[r.IntN(len(open))]
				i := slices.IndexFunc(m.entries, func(e *mEntry) bool { return e.id == id })
				e := m.entries[i]
				kind := engine.ResolvedManuallyReverted
				if r.IntN(2) == 0 {
					kind = engine.ResolvedLeftApplied
				}
				if kind == engine.ResolvedManuallyReverted {
					h.set(e.res, e.before) // the person puts it back
				}
				err := h.eng.Resolve(h.ctx, h.runID, id, kind, "checked by the model")
				m.resolve(e, kind)
				desc := fmt.Sprintf("Resolve %s %s", id, kind)
				if err != nil {
					return desc, "Resolve refused: " + errClass(err), err.Error()
				}
				if err := h.eng.Resolve(h.ctx, h.runID, id, kind, "again"); !errors.Is(err, engine.ErrAlreadyResolved) {
					return desc, "Resolve repeated: not ErrAlreadyResolved", fmt.Sprint(err)
				}
				return desc, "", ""
			}
			ops = append(ops, resolve, resolve, resolve)
		}
	}
	if f[fSteps] && (m.status == engine.StatusCompleted || r.IntN(6) == 0) {
		ops = append(ops, func() (string, string, string) {
			var names []string
			for _, st := range m.spec.steps {
				if st.kind == mFail {
					continue
				}
				names = append(names, st.name)
				for _, c := range st.children {
					names = append(names, st.name+"/"+c.name)
				}
			}
			r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
			names = names[:1+r.IntN(min(2, len(names)))]
			desc := fmt.Sprintf("UndoSteps %v", names)
			_, err := h.eng.UndoSteps(h.ctx, h.runID, names)
			refusal := m.undoSteps(names)
			if c := h.decision("UndoSteps", refusal == nil, err, refusal); c != "" {
				return desc, c, fmt.Sprintf("engine: %v; model: %v", err, refusal)
			}
			return desc, "", ""
		})
	}
	if f[fRetry] {
		ops = append(ops, func() (string, string, string) {
			_, err := h.eng.Retry(h.ctx, h.runID)
			want := m.retryAllowed()
			if want {
				m.retried = true
			}
			var se *engine.StatusError
			switch {
			case want && err != nil:
				return "Retry", "P4 Retry refused, model allows it: " + errClass(err), err.Error()
			case !want && err == nil:
				return "Retry", "P4 Retry allowed, model refuses it (" + h.inPlace() + ")", ""
			case !want && !errors.As(err, &se):
				return "Retry", "Retry refused without a StatusError", err.Error()
			}
			return "Retry", "", ""
		})
	}
	if len(ops) == 0 {
		return nil, false
	}
	return ops[r.IntN(len(ops))], true
}

// inPlace names the statuses that keep effects in place, for a category.
func (h *hist) inPlace() string {
	var s []string
	for _, e := range h.m.entries {
		switch e.status {
		case engine.RollbackFailed, engine.RollbackNeedsPerson, engine.RollbackBlocked,
			engine.RollbackLeftApplied, engine.RollbackOutOfWindow:
			if !slices.Contains(s, string(e.status)) {
				s = append(s, string(e.status))
			}
		}
	}
	slices.Sort(s)
	return "in place: " + strings.Join(s, ",")
}

// decision compares the engine's acceptance of an operation with the
// model's: want is the model's; refusal the sentinel the model expects.
func (h *hist) decision(op string, want bool, err, refusal error) string {
	switch {
	case want && err != nil:
		return op + " refused, model accepts it: " + errClass(err)
	case !want && err == nil:
		return fmt.Sprintf("%s accepted, model refuses it (%v)", op, refusal)
	case !want && refusal != nil && !errors.Is(err, refusal):
		return fmt.Sprintf("%s refused with %s, model: %v", op, errClass(err), refusal)
	}
	return ""
}

func errClass(err error) string {
	for _, s := range []error{engine.ErrNotUndoable, engine.ErrNoRollbackToRetry, engine.ErrNothingToRetry,
		engine.ErrResourceOrder, engine.ErrNotRetryable, engine.ErrAlreadyRetried, engine.ErrNoSuchConflict,
		engine.ErrAlreadyResolved, engine.ErrRollbackInProgress, engine.ErrClockBackwards} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "error " + err.Error()
}

// check compares the engine with the model after an operation, reporting
// divergences to add. It returns false after a divergence of state (the
// history cannot go on meaningfully); a summary outcome that differs while
// the entries agree is reported and the history goes on.
func (h *hist) check(add func(category, detail string)) bool {
	rep, c, det := h.checkState()
	if c != "" {
		add(c, det)
		return false
	}
	if rep != nil {
		if o := h.m.outcome(); rep.Summary.Outcome != o {
			add(fmt.Sprintf("P5 summary outcome: engine %s, model %s", rep.Summary.Outcome, o), statusSet(h.m.report))
		}
	}
	return true
}

// checkState compares everything but the summary outcome, and returns the
// engine's report (nil before any rollback).
func (h *hist) checkState() (rep *engine.RollbackReport, category, detail string) {
	m := h.m
	ctx := h.ctx
	h.mu.Lock()
	violations := slices.Clone(h.violations)
	calls, oks := maps.Clone(h.calls), maps.Clone(h.oks)
	h.mu.Unlock()
	// 1. no restore over somebody else's write.
	if len(violations) > 0 {
		return nil, "P1 restore over somebody else's write", strings.Join(violations, "; ")
	}
	// 2. no entry undone twice; calls as the model expects.
	for p, n := range oks {
		if n > 1 {
			return nil, "P2 an entry undone twice", fmt.Sprintf("%s: %d successful Undo/Restore calls", p, n)
		}
	}
	for _, e := range m.entries {
		if !e.ledger() {
			continue
		}
		if got := calls[e.path]; got != e.calls {
			return nil, fmt.Sprintf("P2 calls of %s: engine %s, model %s", kindName(e.kind), callsClass(got), callsClass(e.calls)),
				fmt.Sprintf("%s: engine called %d times, model %d (status: model %s)", e.path, got, e.calls, e.status)
		}
	}
	// What the resources hold.
	for i := range m.spec.resources {
		k := h.key(i)
		if got, want := h.get(k), m.kv[k]; got != want {
			return nil, "resources: engine and model hold different values", fmt.Sprintf("r%d: engine %q, model %q", i, got, want)
		}
	}
	run, err := h.eng.Get(ctx, h.runID)
	if err != nil {
		return nil, "Get failed", err.Error()
	}
	if run.Status != m.status {
		return nil, fmt.Sprintf("run status: engine %s, model %s", run.Status, m.status), ""
	}
	// 5. the per-entry report.
	rep, err = h.eng.RollbackReport(ctx, h.runID)
	switch {
	case m.gen == 0 && !errors.Is(err, engine.ErrNoRollback):
		return nil, "RollbackStatus of a run never rolled back", fmt.Sprint(err)
	case m.gen > 0 && err != nil:
		return nil, "RollbackStatus failed", err.Error()
	}
	if m.gen > 0 {
		var got, want []string
		for _, e := range rep.Entries {
			got = append(got, e.Step+"="+string(e.Status))
		}
		for _, e := range m.report {
			want = append(want, e.path+"="+string(e.status))
		}
		if !slices.Equal(got, want) {
			return nil, "P5 entries: " + reportDiff(rep.Entries, m.report), fmt.Sprintf("engine %v\n  model  %v", got, want)
		}
		for _, e := range rep.Entries {
			if e.Status != engine.RollbackBlocked {
				continue
			}
			i := slices.IndexFunc(m.entries, func(me *mEntry) bool { return me.path == e.Step })
			if i >= 0 && !slices.Contains(m.entries[i].blockers, e.BlockedBy) {
				return nil, "P5 blocked_by does not name a newer entry on the resource in place when it was blocked",
					fmt.Sprintf("%s blocked_by %q, model: one of %v", e.Step, e.BlockedBy, m.entries[i].blockers)
			}
		}
	}
	// 3. every conflict listed until resolved; its run never expires.
	open := m.unresolved()
	waiting, err := h.eng.NeedsHuman(ctx, 1000)
	if err != nil {
		return nil, "NeedsHuman failed", err.Error()
	}
	if listed := slices.Contains(waiting, h.runID); listed != (len(open) > 0) {
		return nil, fmt.Sprintf("P3 NeedsHuman lists the run: %v, model's open conflicts: %d", listed, len(open)), strings.Join(open, ",")
	}
	if len(open) > 0 {
		ttl, err := h.rdb.PTTL(ctx, h.prefix+":{run:"+h.runID+"}:ctx").Result()
		if err != nil {
			return nil, "PTTL failed", err.Error()
		}
		if ttl != -1 {
			return nil, "P3 a run with an open conflict expires", fmt.Sprintf("PTTL %s", ttl)
		}
	}
	if m.gen > 0 {
		var action []string
		for _, a := range rep.ActionRequired {
			action = append(action, a.ID)
		}
		slices.Sort(action)
		if !slices.Equal(action, open) {
			return nil, "P3 ActionRequired differs from the open conflicts", fmt.Sprintf("engine %v, model %v", action, open)
		}
	}
	return rep, "", ""
}

func kindName(k mkind) string {
	return map[mkind]string{mPlain: "plain Undo", mGuarded: "guarded Restore"}[k]
}

func callsClass(n int) string {
	if n > 1 {
		return "2+"
	}
	return strconv.Itoa(n)
}

func statusSet(es []*mEntry) string {
	var s []string
	for _, e := range es {
		s = append(s, e.path+"="+string(e.status))
	}
	return "model entries: " + strings.Join(s, " ")
}

// reportDiff names the first difference between the reports, by status
// only, so alike divergences group.
func reportDiff(got []engine.RollbackEntry, want []*mEntry) string {
	for i := range max(len(got), len(want)) {
		switch {
		case i >= len(got):
			return fmt.Sprintf("engine lacks an entry the model has (%s)", want[i].status)
		case i >= len(want):
			return fmt.Sprintf("engine has an entry the model lacks (%s)", got[i].Status)
		case got[i].Step != want[i].path:
			return "entries in another order"
		case got[i].Status != want[i].status:
			return fmt.Sprintf("engine %s, model %s", got[i].Status, want[i].status)
		}
	}
	return "equal"
}
