package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/goreactor/goreactor/internal/keys"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

// tierFix is the guarded-undo fixture of the needs-human tests: an element
// reactor whose guarded step sets one account's tier to gold, and an owner
// that maps it inline over accounts 0 and 1, then fails; with input clobber
// true, somebody else changes account 1 first, so its element's undo
// conflicts and the element and its owner wait for a person.
type tierFix struct {
	e            *env
	owner, elDef *reactor.Definition
}

func newTierFix(e *env, name string) *tierFix {
	f := &tierFix{e: e}
	guard := reactor.Guarded(reactor.GuardConfig[string]{
		Probe: f.get,
		Restore: func(ctx context.Context, k, before, _ string) (reactor.RestoreResult, error) {
			return reactor.RestoreWritten, e.rdb.Set(ctx, k, before, 0).Err()
		},
	})
	type elIn struct {
		N   int    `json:"n"`
		Run string `json:"run"`
	}
	f.elDef = reactor.MustDefine(name+"-el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Input[string]("run", reactor.Required()),
		reactor.Step("upgrade", reactor.StepConfig[elIn, string]{
			Args:  reactor.Bindings{"n": reactor.FromInput("item"), "run": reactor.FromInput("run")},
			Guard: guard,
			Run: func(ctx context.Context, in elIn) (string, error) {
				k := f.key(in.Run, in.N)
				before, err := f.get(ctx, k)
				if err != nil {
					return "", err
				}
				if err := e.rdb.Set(ctx, k, "gold", 0).Err(); err != nil {
					return "", err
				}
				return "gold", reactor.RecordVerifiedEffect(ctx, reactor.Effect{Resource: k, Before: before, After: "gold", Label: "tier"})
			},
		}))
	type declineIn struct {
		Run     string `json:"run"`
		Clobber bool   `json:"clobber"`
	}
	f.owner = reactor.MustDefine(name+"-owner",
		reactor.Input[string]("run", reactor.Required()),
		reactor.Input[bool]("clobber", reactor.Required()),
		mapstep.Map("each", mapstep.Config{Element: f.elDef, Items: reactor.Const([]int{0, 1}),
			With: reactor.Bindings{"run": reactor.FromInput("run")}}),
		reactor.Step("decline", reactor.StepConfig[declineIn, string]{
			After: []string{"each"},
			Args:  reactor.Bindings{"run": reactor.FromInput("run"), "clobber": reactor.FromInput("clobber")},
			Run: func(ctx context.Context, in declineIn) (string, error) {
				if in.Clobber {
					if err := e.rdb.Set(ctx, f.key(in.Run, 1), "platinum (support desk)", 0).Err(); err != nil {
						return "", err
					}
				}
				return "", reactor.Permanent(errors.New("declined"))
			},
		}))
	return f
}

func (f *tierFix) key(run string, n int) string {
	return fmt.Sprintf("%s:acct:%s:%d", f.e.prefix, run, n)
}

func (f *tierFix) get(ctx context.Context, k string) (string, error) {
	v, err := f.e.rdb.Get(ctx, k).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

// run runs the owner as run id in this process; it fails, rolled back.
func (f *tierFix) run(ctx context.Context, id string, clobber bool) {
	f.e.t.Helper()
	res, err := f.e.engine.Run(ctx, f.owner, map[string]any{"run": id, "clobber": clobber}, reactor.WithRunID(id))
	require.NoError(f.e.t, err)
	require.Equal(f.e.t, reactor.StatusFailed, res.Status)
}

// element is the id of element i of run id's map.
func element(id string, i int) string { return mapstep.ElementID(mapstep.MapID(id, "each"), i) }

func (e *env) needsHumanKey() string { return e.prefix + ":idx:needs_human" }

// oldScore is a needs-human score the trim examines at once: older than
// StaleAfter and its clock margin by the server's clock.
func (e *env) oldScore(ctx context.Context) float64 {
	e.t.Helper()
	srv, err := e.rdb.Time(ctx).Result()
	require.NoError(e.t, err)
	return float64(srv.Add(-time.Hour).UnixMilli())
}

// list adds ids to the needs-human index at score, as an add whose run's
// terminal write failed, or whose removal after a settling write failed,
// leaves them.
func (e *env) list(ctx context.Context, score float64, ids ...string) {
	e.t.Helper()
	for _, id := range ids {
		require.NoError(e.t, e.rdb.ZAdd(ctx, e.needsHumanKey(), redis.Z{Score: score, Member: id}).Err())
	}
}

// expire makes key expire now, as a retention does, and waits until it is
// gone.
func (e *env) expire(ctx context.Context, key string) {
	e.t.Helper()
	require.True(e.t, e.rdb.PExpire(ctx, key, time.Millisecond).Val(), "%s exists", key)
	require.Eventually(e.t, func() bool { return e.rdb.Exists(ctx, key).Val() == 0 }, 5*time.Second, time.Millisecond)
}

// waitOld waits until the needs-human entries of ids are old enough for the
// trim (its StaleAfter plus a millisecond's margin, by the server's clock).
func (e *env) waitOld(ctx context.Context, ids ...string) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		srv, err := e.rdb.Time(ctx).Result()
		require.NoError(e.t, err)
		for _, id := range ids {
			score, err := e.rdb.ZScore(ctx, e.needsHumanKey(), id).Result()
			require.NoError(e.t, err, "%s is listed", id)
			if srv.Sub(time.UnixMilli(int64(score))) <= e.stale+time.Millisecond {
				return false
			}
		}
		return true
	}, 5*time.Second, 5*time.Millisecond)
}

func (e *env) listed(ctx context.Context) []string {
	e.t.Helper()
	ids, err := e.rdb.ZRange(ctx, e.needsHumanKey(), 0, -1).Result()
	require.NoError(e.t, err)
	return ids
}

func (e *env) trimmer(page int) *sweeper.IndexTrimmer {
	e.t.Helper()
	trim, err := sweeper.NewIndexTrimmer(sweeper.TrimConfig{Engine: e.engine, StaleAfter: e.stale, ClockMargin: time.Millisecond,
		Page: page, Logger: discard})
	require.NoError(e.t, err)
	return trim
}

// TestTrimNeedsHuman: the trim of idx:needs_human removes the entries of
// runs that no longer wait for a person (an expired root run, an expired
// map element run, a settled element and its owner, an element that never
// waited) and keeps those of runs that still wait, root and element runs
// alike (an element's state is found under its element keys), and that of a
// run whose state it cannot read.
func TestTrimNeedsHuman(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	f := newTierFix(e, "nh")
	f.run(ctx, "waits", true)
	f.run(ctx, "settles", true)
	f.run(ctx, "expires", false)

	waits, waitsEl := "waits", element("waits", 1)
	settles, settlesEl := "settles", element("settles", 1)
	listed, err := e.engine.NeedsHuman(ctx, 100)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{waits, waitsEl, settles, settlesEl}, listed,
		"the conflicted elements and their owners wait, as the engine listed them")

	// settles: a person resolves its element's conflict, and the removal
	// of the two entries after the settling writes is lost.
	scores := map[string]float64{}
	for _, id := range []string{settles, settlesEl} {
		scores[id] = e.rdb.ZScore(ctx, e.needsHumanKey(), id).Val()
	}
	require.NoError(t, e.engine.Resolve(ctx, settlesEl, "upgrade#1", reactor.ResolvedLeftApplied, "keep the desk's value"))
	require.NotContains(t, e.listed(ctx), settlesEl)
	for id, s := range scores {
		e.list(ctx, s, id)
	}
	// expires: listed by adds whose terminal writes failed, then its state
	// and its element's expire.
	old := e.oldScore(ctx)
	e.list(ctx, old, "expires", element("expires", 0))
	e.expire(ctx, e.prefix+":{run:expires}:ctx")
	e.expire(ctx, keys.New(e.prefix).ElemState(element("expires", 0)))
	// An element whose undo went through, which never waited.
	neverWaited := element("waits", 0)
	e.list(ctx, old, neverWaited)
	require.Equal(t, int64(1), e.rdb.Exists(ctx, keys.New(e.prefix).ElemState(neverWaited)).Val(), "its state exists")
	// A state the engine cannot decode: nobody can tell it no longer
	// waits.
	require.NoError(t, e.rdb.HSet(ctx, e.prefix+":{run:unreadable}:ctx", "v", 1, "d", "\xc1").Err())
	e.list(ctx, old, "unreadable")
	e.waitOld(ctx, waits, waitsEl, settles, settlesEl)

	rep, err := e.trimmer(100).Trim(ctx)
	require.NoError(t, err)
	stay := []string{waits, waitsEl, "unreadable"}
	require.ElementsMatch(t, stay, e.listed(ctx), "only the runs that still wait stay")
	require.Equal(t, 5, rep.Trimmed, "settles, its element, expires, its element, the element that never waited")
	require.GreaterOrEqual(t, rep.Examined, 8)

	again, err := e.trimmer(100).Trim(ctx)
	require.NoError(t, err)
	require.Zero(t, again.Trimmed)
	require.ElementsMatch(t, stay, e.listed(ctx), "a later pass keeps them too")
}

// TestTrimNeedsHumanPages: the trim reads the index a page at a time and
// reaches every entry over its passes; the waiting run among them stays.
func TestTrimNeedsHumanPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	f := newTierFix(e, "nhp")
	f.run(ctx, "waits", true)
	old := e.oldScore(ctx)
	for i := range 7 {
		e.list(ctx, old+float64(i%3), fmt.Sprintf("gone-%d", i))
	}
	e.waitOld(ctx, "waits", element("waits", 1))
	trim := e.trimmer(2)
	trimmed := 0
	for pass := 0; pass < 5 && trimmed < 7; pass++ {
		rep, err := trim.Trim(ctx)
		require.NoError(t, err)
		require.LessOrEqual(t, rep.Trimmed, 2, "a page at most per pass")
		trimmed += rep.Trimmed
	}
	require.Equal(t, 7, trimmed)
	require.ElementsMatch(t, []string{"waits", element("waits", 1)}, e.listed(ctx))
}

// TestTrimNeedsHumanKeepsAnEntryAddedAgain: an entry listed again between
// the trim's check of its run and its removal (a run that came to wait
// again: a new score) stays; a live run's entry stays while it holds its
// lock, and goes once it finished without waiting.
func TestTrimNeedsHumanKeepsAnEntryAddedAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	def := reactor.MustDefine("nh-live", reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "", reactor.Permanent(errors.New("no")) },
	}))
	res, err := e.engine.Run(ctx, def, nil, reactor.WithRunID("again"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	old := e.oldScore(ctx)
	e.list(ctx, old, "again")

	trim := e.trimmer(100)
	var hooked int
	sweeper.SetTrimBeforeRemove(trim, func(key, id string) {
		if key == e.needsHumanKey() && id == "again" {
			hooked++
			e.list(ctx, old+1, "again")
		}
	})
	rep, err := trim.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, hooked, "the trim meant to remove it")
	require.Zero(t, rep.Trimmed)
	require.Equal(t, old+1, e.rdb.ZScore(ctx, e.needsHumanKey(), "again").Val(), "the entry added again stays")

	sweeper.SetTrimBeforeRemove(trim, nil)
	rep, err = trim.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Trimmed, "without the re-add it goes")
	require.Empty(t, e.listed(ctx))

	// A live run: listed while it holds its lock, as between the add and
	// the terminal write.
	started, release := make(chan struct{}), make(chan struct{})
	live := reactor.MustDefine("nh-live2", reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
		Run: func(ctx context.Context, _ reactor.Args) (string, error) {
			close(started)
			select {
			case <-release:
				return "done", nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		},
	}))
	done := make(chan error, 1)
	go func() {
		_, err := e.engine.Run(ctx, live, nil, reactor.WithRunID("live"))
		done <- err
	}()
	<-started
	e.list(ctx, old, "live")
	rep, err = trim.Trim(ctx)
	require.NoError(t, err)
	require.Zero(t, rep.Trimmed)
	require.Equal(t, []string{"live"}, e.listed(ctx), "a run holding its lock keeps its entry")
	close(release)
	require.NoError(t, <-done)
	rep, err = trim.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Trimmed, "finished without waiting: it goes")
	require.Empty(t, e.listed(ctx))
}

// TestNeedsHumanSkipsGoneRuns: Engine.NeedsHuman never lists a run whose
// state is gone, even before a trim, and still finds limit runs behind more
// gone entries than it reads at once.
func TestNeedsHumanSkipsGoneRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	f := newTierFix(e, "nhl")
	f.run(ctx, "waits", true)
	waits, waitsEl := "waits", element("waits", 1)
	srv, err := e.rdb.Time(ctx).Result()
	require.NoError(t, err)
	newer := float64(srv.Add(time.Hour).UnixMilli())
	for i := range 250 {
		id := fmt.Sprintf("gone-%03d", i)
		if i%2 == 1 {
			id = element("gone", i)
		}
		e.list(ctx, newer+float64(i), id)
	}

	all, err := e.engine.NeedsHuman(ctx, 100)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{waits, waitsEl}, all, "the gone runs are not listed")
	first, err := e.engine.NeedsHuman(ctx, 1)
	require.NoError(t, err)
	require.Len(t, first, 1)
	require.Contains(t, []string{waits, waitsEl}, first[0], "the newest run that exists")
	require.Len(t, e.listed(ctx), 252, "the listing removes nothing: that is the trim's")
}
