package sweeper_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/store"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// Every Lua script of goreactor is cluster-safe: the test runs each one,
// on random ids, through the code paths that call it (a fan-out map forward
// and back through a worker, a lost batch trigger in each direction that
// the map sweeper claims again, a rollback that finds an element locked, a
// task whose worker's lease ran out, a cancel, a run sweeper pass, a
// dashboard listing; what no such path reaches without long waits is
// called the way its caller calls it), on a server of its own watched by
// MONITOR, and checks that
//   - the keys of every call share one hash slot (redistest.ScriptCheck):
//     a Redis Cluster refuses a call whose keys span slots;
//   - every key a script's commands touch is one its call passed in KEYS,
//     and a shard channel it publishes on is in their slot
//     (redistest.Undeclared): a cluster routes a call by its KEYS, so a key
//     the script builds itself may live on another node;
//   - every .lua file of the module ran, so a new script is checked too, or
//     this test fails until a path here runs it.
//
// The self-checks of both checks (a call with keys of two slots, a script
// that builds a key) are in internal/redistest.
func TestEveryScriptKeepsToItsKeysInOneSlot(t *testing.T) {
	if testing.Short() {
		t.Skip("drives maps, rollbacks and sweeps under MONITOR")
	}
	srv := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	check := redistest.NewScriptCheck()
	rdb.AddHook(check)
	mon := redistest.MonitorScripts(t, srv.Addr)

	t.Run("fan-out map with a lost batch trigger", func(t *testing.T) {
		m := newMapEnv(t, rdb)
		id := randomID("fwd")
		mapID := m.start(id, false)
		lostTriggerClaimed(m, mapID, elPrefix(mapID), elTask, m.keys.MapOffset(mapID))
		m.requireCompleted(m.finish(id))
	})

	t.Run("rollback with a locked element and a lost batch trigger", func(t *testing.T) {
		m := newMapEnv(t, rdb)
		id := randomID("rb")
		mapID := m.start(id, true)
		m.toRollback(id, mapID)
		// Rollback position 0 is the newest element: its lock is held
		// elsewhere, so its job waits (a snooze) and notes the wait.
		lock := m.keys.ElemLock(mapstep.ElementID(mapID, mapItems-1))
		require.NoError(t, rdb.Set(m.ctx, lock, "someone-else", time.Minute).Err())
		info, err := m.insp.GetTaskInfo(m.queue, rbTask(mapID, 0))
		require.NoError(t, err)
		var snooze *worker.SnoozeError
		require.ErrorAs(t, m.handler.ProcessTask(m.ctx, asynq.NewTask(info.Type, info.Payload)), &snooze)
		require.NoError(t, rdb.Del(m.ctx, lock).Err())
		lostTriggerClaimed(m, mapID, rbPrefix(mapID), rbTask, m.keys.MapRbOffset(mapID, 1))
		m.requireRolledBack(m.finish(id))
	})

	t.Run("active task of a dead worker, cancel, run sweep, listing", func(t *testing.T) {
		m := newMapEnv(t, rdb)
		id := randomID("dead")
		mapID := m.start(id, false)
		// 2, the trigger, is active on a worker whose lease ran out: the
		// pass watches the lease.
		m.deliverAll(elPrefix(mapID), 0, 1, 3, 4)
		m.activate(elTask(mapID, 2), time.Now().Add(-time.Second))
		m.waitMapStale(mapID)
		m.sweep()
		// A cancel of a run another process holds is a request it reads
		// at its next checkpoint.
		require.NoError(t, rdb.Set(m.ctx, m.lockKey(id), "someone-else", time.Minute).Err())
		require.NoError(t, m.engine.Cancel(m.ctx, id))
		// An operator's request goes to the run's audit (note.lua).
		require.NoError(t, m.engine.RecordRequest(m.ctx, id, reactor.OperatorRequest{Action: "cancel", Operator: "alice", Reason: "scripts test"}))
		// The run sweeper drops an active entry whose run is gone.
		require.NoError(t, rdb.ZAdd(m.ctx, m.activeKey(), redis.Z{Score: 1, Member: randomID("gone")}).Err())
		rep, err := m.sweeper.Sweep(m.ctx)
		require.NoError(t, err)
		require.Positive(t, rep.Dropped, "%+v", rep)

		dash, err := dashboard.New(dashboard.Config{Client: rdb, Prefix: m.prefix, Queues: []string{m.queue}, Logger: discard})
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		dash.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/api/runs", nil))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.Contains(t, rec.Body.String(), id)
	})

	t.Run("interrupt with a correlation id, paused run sweep, continue", func(t *testing.T) {
		m := newMapEnv(t, rdb)
		def := reactor.MustDefine("scripts_interrupt",
			reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{
				Correlation: func(reactor.Args) (string, error) { return randomID("order"), nil },
			}))
		require.NoError(t, m.engine.Register(def))
		// The pause claims the correlation id (corr.lua) and opens the
		// interrupt (interrupt.lua).
		res, err := m.engine.Run(m.ctx, def, nil, reactor.NoWait())
		require.NoError(t, err)
		require.Equal(t, reactor.StatusPaused, res.Status)
		// A pass finds it waiting and moves its entry ahead, if unchanged
		// (touch_if.lua).
		require.NoError(t, rdb.ZAdd(m.ctx, m.activeKey(), redis.Z{Score: 1, Member: res.RunID}).Err())
		rep, err := m.sweeper.Sweep(m.ctx)
		require.NoError(t, err)
		require.Equal(t, 1, rep.Paused, "%+v", rep)
		run := m.awaitPaused(m.ctx, res.RunID)
		_, err = m.engine.ContinueByCorrelation(m.ctx, run.Paused.Correlation, approval{By: "scripts"})
		require.NoError(t, err)
	})

	t.Run("task steps through a worker, forward and back", func(t *testing.T) {
		m := newMapEnv(t, rdb)
		task := func(name string, fail bool) reactor.Part {
			return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
				Task: true,
				Run: func(context.Context, reactor.Args) (string, error) {
					if fail {
						return "", reactor.Permanent(errors.New("declined"))
					}
					return name, nil
				},
				Undo: func(context.Context, reactor.Args, string) error { return nil },
			})
		}
		def := reactor.MustDefine("scripts_task", task("reserve", false), task("charge", true))
		require.NoError(t, m.engine.Register(def))
		w := worker.New(m.engine, rdb, worker.Config{Queues: map[string]int{m.queue: 1}, Logger: discard})
		require.NoError(t, w.Start(m.ctx))
		t.Cleanup(func() { _ = w.Stop(context.Background()) })
		// Each attempt begins and settles (steptask.lua); the owner looks
		// at the record when it resumes; the undo task stops the step.
		res, err := m.engine.Enqueue(m.ctx, def, nil)
		require.NoError(t, err)
		final, err := m.engine.Wait(m.ctx, res.RunID)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusFailed, final.Status)
	})

	t.Run("direct calls", func(t *testing.T) {
		ctx := ctxTimeout(t, 10*time.Second)
		k := keys.New(redistest.Prefix(t))
		st, err := store.New(ctx, rdb, k)
		require.NoError(t, err)
		// What an element holds after its rollbacks (resolve.go and
		// mapcore record it when a person must look at an element).
		_, err = st.SetHeld(ctx, randomID("map"), 3, store.Held{Failed: 1})
		require.NoError(t, err)
		// A run that waits for a definition no worker has yet.
		require.NoError(t, st.SetWaiting(ctx, randomID("run"), []byte(`{"reactor":"x"}`), time.Minute))
		// The server's clock, read on a run's node (a step's time window).
		_, err = st.ServerTime(ctx, st.RunTarget(randomID("run")))
		require.NoError(t, err)
		// A step's limits: a leased slot (slot.lua) and a rate window
		// (rate.lua).
		slots := k.Slots("scripts-test", randomID("key"))
		g, err := st.AcquireSlot(ctx, slots, "holder", "run|step", 1, time.Second)
		require.NoError(t, err)
		require.True(t, g.Held)
		_, err = st.RenewSlot(ctx, slots, "holder", time.Second)
		require.NoError(t, err)
		_, err = st.ParkSlot(ctx, slots, "holder") // a run's own limit while the run waits
		require.NoError(t, err)
		require.NoError(t, st.ReleaseSlot(ctx, slots, "holder"))
		ok, _, err := st.Admit(ctx, k.Rate("scripts-test", randomID("key")), "a", []store.Window{{N: 1, Per: time.Second}})
		require.NoError(t, err)
		require.True(t, ok)
		holder, _, err := st.ClaimPeriod(ctx, k.Once("scripts-test", randomID("key")), "run", time.Minute)
		require.NoError(t, err)
		require.Empty(t, holder)
		// A run's place at enqueue (place.lua), in a queue of its own.
		require.NoError(t, st.PlaceOrdered(ctx, k.Slots("scripts-test", randomID("key")), "run|(run)", 1, time.Second))
		g, err = st.AcquireOrdered(ctx, k.Slots("scripts-test", randomID("key")), "holder", "run|step", 1, 1, time.Second)
		require.NoError(t, err)
		require.True(t, g.Held)
		// A fair-shared limit (fair.lua): a grant, a refusal, a renewal
		// and a release.
		fair := k.Fair(randomID("scripts-test"))
		g, err = st.AcquireFair(ctx, fair, "holder", "a", "run|step", 1, time.Second)
		require.NoError(t, err)
		require.True(t, g.Held)
		g, err = st.AcquireFair(ctx, fair, "other", "b", "run2|step", 1, time.Second)
		require.NoError(t, err)
		require.False(t, g.Held)
		_, err = st.RenewFair(ctx, fair, "holder", time.Second)
		require.NoError(t, err)
		require.NoError(t, st.ReleaseFair(ctx, fair, "holder"))
		// A step task's lease renewed, and a retry (steptask.lua).
		ref := store.StepTask{Owner: randomID("run"), Token: "tok"}
		require.NoError(t, st.StartStepTask(ctx, ref, "label", []byte("args")))
		_, err = st.BeginStepAttempt(ctx, ref, 1, "holder", time.Minute)
		require.NoError(t, err)
		_, err = st.RenewStepLease(ctx, ref, "holder", time.Minute)
		require.NoError(t, err)
		_, err = st.RetryStep(ctx, ref, "holder", 2)
		require.NoError(t, err)
	})

	runs, err := mon.Stop()
	require.NoError(t, err)
	require.NoError(t, check.Err())

	files, err := redistest.ModuleLua()
	require.NoError(t, err)
	ran, asynqBuilt := map[string]int{}, 0
	for _, r := range runs {
		if len(r.Commands) == 0 {
			continue // an EVALSHA refused with NOSCRIPT: Script.Run sends the EVAL next
		}
		name := r.Script()
		for _, part := range strings.Split(name, "+") {
			ran[part]++
		}
		bad, err := redistest.Undeclared(context.Background(), rdb, r)
		require.NoError(t, err)
		if !isModuleScript(files, name) && asynqKeys(r.Keys) {
			// asynq's scripts build task keys from their queue's keys
			// and the task id: in the queue's slot, which is all a
			// cluster needs. Another slot would break asynq there.
			asynqBuilt += len(bad)
			for _, a := range bad {
				require.Equal(t, redistest.Slot(r.Keys[0]), redistest.Slot(a.Key), "asynq's %s: %s", name, a)
			}
			continue
		}
		require.Empty(t, bad, "%s touches what its call did not pass in KEYS %q", name, r.Keys)
	}
	var missing []string
	for _, f := range files {
		if ran[path.Base(f.Path)] == 0 {
			missing = append(missing, f.Path)
		}
	}
	require.Empty(t, missing, "scripts no path of this test ran (scripts seen: %v): run each from one", ran)
	t.Logf("%d script calls checked: %v; asynq's touched %d keys of their queue's slot they did not declare",
		len(runs), ran, asynqBuilt)
}

// lostTriggerClaimed drives the first batch of a map's direction (task
// names prefix, task ids task, offset key offset) so that its trigger's
// claim of the second batch is lost, and has one map sweeper pass claim it
// again (claim.lua). The second batch is then pending.
func lostTriggerClaimed(m *mapEnv, mapID, prefix string, task func(string, int) string, offset string) {
	m.t.Helper()
	m.deliverAll(prefix, 0, 1, 2, 3, 4) // 2, the trigger, claimed [5,9]
	second := taskIDs(task, mapID, positions(5, 9))
	require.Equal(m.t, second, m.pending())
	m.drop(second...)
	// The claim undone after the fact: the settle script claims with the
	// trigger's outcome, atomically.
	require.NoError(m.t, m.rdb.Set(m.ctx, offset, 5, 0).Err())
	m.waitMapStale(mapID)
	require.Equal(m.t, 1, m.sweep().Claims)
	require.Equal(m.t, second, m.pending())
}

// isModuleScript reports whether name (redistest.ScriptName's) names one
// or more of files.
func isModuleScript(files []redistest.LuaFile, name string) bool {
	for _, part := range strings.Split(name, "+") {
		if !slices.ContainsFunc(files, func(f redistest.LuaFile) bool { return path.Base(f.Path) == part }) {
			return false
		}
	}
	return true
}

// asynqKeys reports whether keys are asynq's: a script of asynq's, not of
// goreactor's (whose inline scripts have no .lua file to name them).
func asynqKeys(keys []string) bool {
	for _, k := range keys {
		if !strings.HasPrefix(k, "asynq:") {
			return false
		}
	}
	return len(keys) > 0
}

func randomID(kind string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return kind + "-" + hex.EncodeToString(b[:])
}
