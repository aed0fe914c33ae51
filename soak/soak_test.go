package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// newTestSoak is a soak on a Redis of its own (the soak's key names are
// fixed) with an in-process worker instead of worker processes and chaos.
func newTestSoak(t *testing.T) *soak {
	t.Helper()
	srv := redistest.StartServer(t)
	ctx := context.Background()
	discard := slog.New(slog.DiscardHandler)
	s := &soak{cfg: config{seed: 1}, start: time.Now(), log: io.Discard, launches: map[string]*launch{}}
	s.rdb, s.rec = newClient(srv.Addr, 1, 0)
	t.Cleanup(func() { _ = s.rdb.Close() })
	var err error
	s.engine, err = newEngine(ctx, reactor.Config{Client: s.rdb, Enqueuer: worker.NewClient(s.rdb, queue),
		Logger: discard, Hooks: []reactor.Hook{s.rec.hook()}})
	require.NoError(t, err)
	s.defs = map[string]*reactor.Definition{}
	for _, d := range s.rec.definitions() {
		s.defs[d.Name()] = d
		require.NoError(t, s.engine.Register(d))
	}
	w := worker.New(s.engine, s.rdb, worker.Config{Concurrency: 4, Queues: map[string]int{queue: 1}, Logger: discard})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })
	return s
}

func (s *soak) runAll(t *testing.T, plans ...runPlan) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range plans {
		_, err := s.engine.Enqueue(ctx, s.defs[p.Shape.name()], p.inputs(), reactor.WithRunID(p.ID))
		require.NoError(t, err)
		s.launches[p.ID] = &launch{enqueued: true}
	}
	for _, p := range plans {
		res, err := s.engine.Wait(ctx, p.ID)
		require.NoError(t, err)
		require.Equal(t, p.uncancelled(), res.Status, "run %s", p.ID)
	}
}

// The checks pass on a clean workload, and each kind of damage to what
// Redis holds is reported: an undo missing, an undo three times, a claim
// twice, a repeat nobody cut short.
func TestChecksFindDamage(t *testing.T) {
	s := newTestSoak(t)
	ctx := context.Background()
	// Rolled back after its map: every element through a rollback job, in
	// 4 batches.
	back := runPlan{ID: "soak-back", Shape: shape{20, false}, Size: 70, FailAfter: true}
	// A partial map whose two failing elements roll themselves back.
	partial := runPlan{ID: "soak-partial", Shape: shape{20, true}, Size: 45, Failing: []int{3, 30}}
	s.runAll(t, back, partial)

	f := s.check(ctx, []runPlan{back, partial})
	require.Empty(t, f.violations)
	require.Equal(t, 1, f.statuses[reactor.StatusFailed])
	require.Equal(t, 1, f.statuses[reactor.StatusCompleted])
	require.Equal(t, 70+45, f.elements)
	require.Equal(t, 70*2+1+2, f.undone, "every element of the rolled back run, its prep, and the failing elements' a")
	require.Zero(t, f.undoTwice)

	// The claim audit saw every batch and signal of both directions once.
	backMap := mapstep.MapID(back.ID, mapStep)
	fields, err := s.rdb.HKeys(ctx, claimsKey(backMap)).Result()
	require.NoError(t, err)
	var claimed []string
	for _, fl := range fields {
		claimed = append(claimed, fl[:strings.LastIndexByte(fl, ':')])
	}
	require.ElementsMatch(t, []string{"fwd:0", "fwd:20", "fwd:40", "fwd:60", "fsig:0",
		"rb1:0", "rb1:20", "rb1:40", "rb1:60", "rsig1:0"}, claimed)

	// Damage.
	undo, err := s.rdb.HKeys(ctx, undoKey(back.ID)).Result()
	require.NoError(t, err)
	for _, fl := range undo {
		if strings.HasPrefix(fl, "5/a/") {
			require.NoError(t, s.rdb.HDel(ctx, undoKey(back.ID), fl).Err())
		}
	}
	require.NoError(t, s.rdb.HSet(ctx, undoKey(back.ID), "6/b/x1", "4242/1", "6/b/x2", "4242/2").Err())
	require.NoError(t, s.rdb.HSet(ctx, claimsKey(backMap), "fwd:20:again", "39/1/1").Err())
	require.NoError(t, s.rdb.HSet(ctx, fwdKey(partial.ID), "7/a/again", "4242/1").Err())
	// An effect of the failing step b left in place, and a compensation
	// of a step that completed.
	require.NoError(t, s.rdb.HSet(ctx, fwdKey(partial.ID), "3/b/lost", "4242/1").Err())
	require.NoError(t, s.rdb.HSet(ctx, compKey(back.ID), "6/a/x1", "4242/1").Err())

	f = s.check(ctx, []runPlan{back, partial})
	require.Equal(t, map[string]int{
		"soak-back element 5 step a completed and was never undone":    1,
		"soak-back element 6 step b was undone 3 times; call":          2,
		"map soak-back~fan: fwd:20 claimed 2 times":                    1,
		"soak-partial element 7 step a ran 2 times; call 1 was cut sh": 1,
		"soak-partial element 3 step b ran (pid 4242":                  1,
		"soak-back element 6 step a was compensated 1 time(s) althoug": 1,
	}, classify(f.violations), "%q", f.violations)

	// Repeats after a kill are what at-least-once allows (here the kill
	// comes right after the fake calls); the rest stays.
	s.kills = append(s.kills, kill{pid: 4242, at: time.UnixMilli(2)})
	f = s.check(ctx, []runPlan{back, partial})
	require.Equal(t, map[string]int{
		"soak-back element 5 step a completed and was never undone":    1,
		"map soak-back~fan: fwd:20 claimed 2 times":                    1,
		"soak-partial element 3 step b ran (pid 4242":                  1,
		"soak-back element 6 step a was compensated 1 time(s) althoug": 1,
	}, classify(f.violations), "%q", f.violations)
	require.True(t, slices.ContainsFunc(f.notes, func(n string) bool {
		return strings.HasPrefix(n, "soak-back element 6 step b was undone 3 times: pid 4242")
	}), "%q", f.notes)
}

// classify counts violations by the prefix they start with; anything else
// counts under its own text.
func classify(violations []string) map[string]int {
	prefixes := []string{
		"soak-back element 5 step a completed and was never undone",
		"soak-back element 6 step b was undone 3 times; call",
		"map soak-back~fan: fwd:20 claimed 2 times",
		"soak-partial element 7 step a ran 2 times; call 1 was cut sh",
		"soak-partial element 3 step b ran (pid 4242",
		"soak-back element 6 step a was compensated 1 time(s) althoug",
	}
	out := map[string]int{}
	for _, v := range violations {
		key := v
		for _, p := range prefixes {
			if strings.HasPrefix(v, p) {
				key = p
				break
			}
		}
		out[key]++
	}
	return out
}

// A step's Compensate reverses its effect when one is on record, and
// records nothing when its Run never got to one.
func TestCompensateReversesOnlyAnEffect(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	rdb, rec := newClient(srv.Addr, 7, 0)
	t.Cleanup(func() { _ = rdb.Close() })
	const owner = "soak-c"
	require.NoError(t, rec.mark(ctx, fwdKey(owner), 1, "a"))
	require.NoError(t, rec.mark(ctx, fwdKey(owner), 11, "b"))
	require.NoError(t, rec.mark(ctx, fwdKey(owner), -1, "prep"))
	for _, c := range []struct {
		index int
		step  string
	}{{1, "a"}, {1, "b"}, {11, "a"}, {2, "a"}, {-1, "prep"}} {
		require.NoError(t, rec.compensate(ctx, owner, c.index, c.step, time.Millisecond))
	}
	comp, err := rdb.HGetAll(ctx, compKey(owner)).Result()
	require.NoError(t, err)
	got := slices.Sorted(maps.Keys(parseCalls(comp)))
	require.Equal(t, []string{"-1/prep", "1/a"}, got)
}

// The sweeper's Enqueuer reports a pass that enqueues more than a batch for
// a map, and an enqueue for an element whose lock is held.
func TestSweepEnqueuerFlags(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	k := keys.New(prefix)
	const mapID = "soak-x~fan"
	require.NoError(t, rdb.HSet(ctx, k.MapMeta(mapID), "batch_size", 2).Err())
	require.NoError(t, rdb.Set(ctx, k.ElemLock(mapstep.ElementID(mapID, 1)), "someone", time.Minute).Err())

	q := newSweepEnqueuer(rdb)
	q.begin()
	for i := range 2 {
		require.NoError(t, maptask.MustAdapt(q).EnqueueElement(ctx, maptask.ElementTask{MapID: mapID, Index: i}))
	}
	q.end(ctx, sweeper.Report{Leader: true}, nil)
	got, err := rdb.LRange(ctx, violationsKey, 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.True(t, strings.HasPrefix(got[0], fmt.Sprintf("sweeper enqueued element task el:%s:1 while its lock was held (a live run; lock expires in ", mapID)), got[0])

	q.begin()
	for i := 2; i < 5; i++ {
		require.NoError(t, maptask.MustAdapt(q).EnqueueElement(ctx, maptask.ElementTask{MapID: mapID, Index: i}))
	}
	q.end(ctx, sweeper.Report{Leader: true}, nil)
	got, err = rdb.LRange(ctx, violationsKey, 1, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"sweeper enqueued 3 tasks for map " + mapID + " in one pass (batch size 2)"}, got)

	// An owner's resume enqueued while its lock is held is flagged, unless
	// the run sweeper's wake-up of it is queued: both recover the same lost
	// resume, and that is noted.
	const owner = "soak-y"
	require.NoError(t, rdb.Set(ctx, k.RunLock(owner), "someone", time.Minute).Err())
	q.begin()
	require.NoError(t, q.Enqueue(ctx, reactor.Wake{ID: "resume:" + owner + ":rb:" + owner + "~fan:1", RunID: owner, Reactor: "r"}))
	q.end(ctx, sweeper.Report{Leader: true}, nil)
	got, err = rdb.LRange(ctx, violationsKey, 2, -1).Result()
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.True(t, strings.HasPrefix(got[0], "sweeper enqueued run "+owner+" (task resume:"+owner+":rb:"+owner+"~fan:1) while its lock was held"), got[0])

	wake := "resume:" + owner + ":sweep:4"
	require.NoError(t, worker.NewClient(rdb, queue).Enqueue(ctx, reactor.Wake{ID: wake, RunID: owner, Reactor: "r"}))
	q.begin()
	require.NoError(t, q.Enqueue(ctx, reactor.Wake{ID: "resume:" + owner + ":fwd:" + owner + "~fan:r1", RunID: owner, Reactor: "r"}))
	q.end(ctx, sweeper.Report{Leader: true}, nil)
	n, err := rdb.LLen(ctx, violationsKey).Result()
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "no new violation")
	notes, err := rdb.LRange(ctx, notesKey, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"map sweeper resumed " + owner + " (resume:" + owner + ":fwd:" + owner + "~fan:r1) while the run sweeper's wake-up " +
		wake + " was pending"}, notes)
}

func TestPlansFollowTheSeed(t *testing.T) {
	a, b := makePlans(7, 30, time.Minute), makePlans(7, 30, time.Minute)
	require.Equal(t, a, b)
	require.NotEqual(t, a, makePlans(8, 30, time.Minute))
	for _, p := range a {
		require.GreaterOrEqual(t, p.Size, minElements)
		require.LessOrEqual(t, p.Size, maxElements)
		require.Less(t, p.LaunchAt, time.Minute)
		for _, i := range p.Failing {
			require.True(t, p.fails(i))
		}
	}
}

func TestReplacedIDs(t *testing.T) {
	require.Equal(t, []string{"el:m:3"}, replaced("el:m:3", "r1"))
	require.Equal(t, []string{"el:m:3", "el:m:3:r1", "el:m:3:r2"}, replaced("el:m:3", "r3"))
	require.Equal(t, []string{"x"}, replaced("x", "s17"))
	m := mapFresh.FindStringSubmatch("resume:soak-001:fwd:soak-001~fan:r2")
	require.Equal(t, []string{"resume:soak-001:fwd:soak-001~fan", "r2"}, m[1:])
	require.Nil(t, mapFresh.FindStringSubmatch("resume:soak-001:sweep:12"))
	require.Equal(t, "resume:soak-001:sweep:12", runFresh.FindStringSubmatch("resume:soak-001:sweep:12:1733")[1])
}
