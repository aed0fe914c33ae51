package dashboard_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

type actionItem struct {
	ID        string   `json:"id"`
	Run       string   `json:"run"`
	Step      string   `json:"step"`
	Resource  string   `json:"resource"`
	Label     string   `json:"label"`
	Expected  string   `json:"expected"`
	Observed  string   `json:"observed"`
	RestoreTo string   `json:"restore_to"`
	Why       string   `json:"why"`
	Blocked   []string `json:"blocked"`
}

type rbStatus struct {
	RunID      string `json:"run_id"`
	RollbackID string `json:"rollback_id"`
	Generation int    `json:"generation"`
	Status     string `json:"status"`
	Summary    struct {
		Outcome string `json:"outcome"`
	} `json:"summary"`
	Entries []struct {
		ID        string `json:"id"`
		Step      string `json:"step"`
		Status    string `json:"status"`
		Attempts  int    `json:"attempts"`
		Resource  string `json:"resource"`
		Expected  string `json:"expected"`
		Observed  string `json:"observed"`
		RestoreTo string `json:"restore_to"`
		BlockedBy string `json:"blocked_by"`
	} `json:"entries"`
	ActionRequired     []actionItem `json:"action_required"`
	ActionRequiredText string       `json:"action_required_text"`
}

func (s rbStatus) entry(t *testing.T, step string) (id, status, blockedBy string) {
	t.Helper()
	for _, e := range s.Entries {
		if e.Step == step {
			return e.ID, e.Status, e.BlockedBy
		}
	}
	t.Fatalf("no entry of step %s in %+v", step, s.Entries)
	return "", "", ""
}

type needsHumanPage struct {
	Runs []struct {
		ID             string       `json:"id"`
		Reactor        string       `json:"reactor"`
		Status         string       `json:"status"`
		RollbackID     string       `json:"rollback_id"`
		ActionRequired []actionItem `json:"action_required"`
	} `json:"runs"`
	More bool `json:"more"`
}

func (p needsHumanPage) ids() []string {
	var out []string
	for _, r := range p.Runs {
		out = append(out, r.ID)
	}
	return out
}

// resolvePath is the resolve endpoint of entry of run id, the entry id
// path-escaped as one segment.
func resolvePath(id, entry string) string {
	return "/api/runs/" + url.PathEscape(id) + "/entries/" + url.PathEscape(entry) + "/resolve"
}

// A conflicted guarded undo in a composed child, listed under needs-human,
// resolved through every answer of the resolve endpoint, then re-triggered:
// the blocked entry is restored.
func TestResolveConflictedEntry(t *testing.T) {
	t.Parallel()
	const token = "resolve-token"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 60*time.Second)
	fx := dashboard.NewGuardFixture(e.rdb, "clobber", e.prefix+":user:42/email")
	other := dashboard.NewGuardFixture(e.rdb, "clobber-other", e.prefix+":user:43/email")
	e.startControlWorker(fx.Def, other.Def) // the re-triggered rollback is carried out
	id, err := fx.Run(ctx, e.engine, "clobber-1")
	require.NoError(t, err)
	require.Equal(t, dashboard.GuardClobbered, fx.Get(ctx), "the rollback left the concurrent write alone")
	_, err = other.Run(ctx, e.engine, "clobber-2")
	require.NoError(t, err)

	var page needsHumanPage
	e.get("/api/needs-human", http.StatusOK, &page)
	require.Equal(t, []string{"clobber-2", "clobber-1"}, page.ids(), "newest first")
	require.False(t, page.More)
	require.Equal(t, "clobber", page.Runs[1].Reactor)
	require.Equal(t, "failed", page.Runs[1].Status)
	require.Equal(t, "clobber-1:rb:1", page.Runs[1].RollbackID)
	require.Len(t, page.Runs[1].ActionRequired, 1)
	item := page.Runs[1].ActionRequired[0]
	require.Equal(t, "book/fix2#2", item.ID, "a composed child's entry id: a slash and a '#'")
	require.Equal(t, fx.Key, item.Resource)
	require.Equal(t, []string{"book/fix1#1"}, item.Blocked)
	require.True(t, strings.HasPrefix(item.Observed, "sha256:") || item.Observed != "", item.Observed)
	require.NotEqual(t, item.Expected, item.Observed)
	// The run page: the compose step completed, but its child's entry
	// waits for a person; the finished child is listed with its entries.
	var d struct {
		Steps []struct {
			Name       string `json:"name"`
			Status     string `json:"status"`
			NeedsHuman bool   `json:"needs_human"`
		} `json:"steps"`
		Children []struct {
			Step    string `json:"step"`
			RunID   string `json:"run_id"`
			Entries []struct {
				Step, Status string
			} `json:"entries"`
		} `json:"children"`
	}
	e.get("/api/runs/clobber-1", http.StatusOK, &d)
	needs := map[string]bool{}
	for _, st := range d.Steps {
		needs[st.Name] = st.NeedsHuman
	}
	require.True(t, needs["book"], "the compose step is not painted as done: %+v", d.Steps)
	require.Len(t, d.Children, 1)
	require.Equal(t, "book", d.Children[0].Step)
	require.Empty(t, d.Children[0].RunID, "folded into the run")
	var entries []string
	for _, en := range d.Children[0].Entries {
		entries = append(entries, en.Step+":"+en.Status)
	}
	require.Contains(t, entries, "book/fix2:needs_human")
	e.get("/api/needs-human?limit=1", http.StatusOK, &page)
	require.Equal(t, []string{"clobber-2"}, page.ids())
	require.True(t, page.More)
	var eb errBody
	for _, q := range []string{"0", "501", "x"} {
		e.get("/api/needs-human?limit="+q, http.StatusBadRequest, &eb)
		require.Contains(t, eb.Error, "limit")
	}

	var st rbStatus
	e.get("/api/runs/"+id+"/rollback-status", http.StatusOK, &st)
	require.Equal(t, "needs_human", st.Summary.Outcome)
	fix2, status, _ := st.entry(t, "book/fix2")
	require.Equal(t, item.ID, fix2)
	require.Equal(t, "needs_human", status)
	_, status, by := st.entry(t, "book/fix1")
	require.Equal(t, "blocked", status)
	require.Equal(t, item.ID, by)
	require.Contains(t, st.ActionRequiredText, item.ID)
	require.Contains(t, st.ActionRequiredText, item.Observed)
	require.Contains(t, st.ActionRequiredText, fx.Key)

	path := resolvePath(id, item.ID)
	require.Contains(t, path, "book%2Ffix2%232")
	body := `{"kind":"manually_reverted","note":"put the address back to ada@new.test after checking with the support desk"}`
	// The token, the method, the body.
	decodeInto(t, e.do(http.MethodPost, path, "", body), http.StatusUnauthorized, &eb)
	res := e.do(http.MethodGet, path, token, "")
	require.Equal(t, http.StatusMethodNotAllowed, res.code)
	for bad, want := range map[string]string{
		`not json`: "body must be JSON",
		`{"kind":"manually_reverted","note":"x","extra":1}`: "body must be JSON",
		`{"kind":"undone","note":"x"}`:                      `kind "undone" is not "manually_reverted"`,
		`{"kind":"","note":"x"}`:                            `kind "" is not`,
		`{"kind":"left_applied","note":"   "}`:              "note is empty",
		`{"kind":"left_applied"}`:                           "note is empty",
	} {
		decodeInto(t, e.do(http.MethodPost, path, token, bad), http.StatusBadRequest, &eb)
		require.Contains(t, eb.Error, want, bad)
	}
	decodeInto(t, e.do(http.MethodPost, resolvePath("a{b", item.ID), token, body), http.StatusBadRequest, &eb)
	huge := `{"kind":"left_applied","note":"` + strings.Repeat("x", 70<<10) + `"}`
	decodeInto(t, e.do(http.MethodPost, path, token, huge), http.StatusRequestEntityTooLarge, &eb)
	// Unknown run, unknown entry (the answer names the waiting ones).
	decodeInto(t, e.do(http.MethodPost, resolvePath("nope", item.ID), token, body), http.StatusNotFound, &eb)
	require.Contains(t, eb.Error, "no run nope")
	decodeInto(t, e.do(http.MethodPost, resolvePath(id, "book/fix1#1"), token, body), http.StatusNotFound, &eb)
	require.Contains(t, eb.Error, reactor.ErrNoSuchConflict.Error())
	require.Contains(t, eb.Error, "waiting: book/fix2#2")
	// Another process holds the run's lock: 409 with the engine's text.
	lockKey := e.prefix + ":{run:" + id + "}:lock"
	require.NoError(t, e.rdb.Set(ctx, lockKey, "someone-else", time.Minute).Err())
	decodeInto(t, e.do(http.MethodPost, path, token, body), http.StatusConflict, &eb)
	require.Contains(t, eb.Error, reactor.ErrRunLocked.Error())
	require.NoError(t, e.rdb.Del(ctx, lockKey).Err())
	e.get("/api/runs/"+id+"/rollback-status", http.StatusOK, &st)
	require.Len(t, st.ActionRequired, 1, "nothing was recorded by the refused requests")

	// The person puts the address back to fix2's before state and says so.
	require.NoError(t, e.rdb.Set(ctx, fx.Key, dashboard.GuardNew, 0).Err())
	decodeInto(t, e.do(http.MethodPost, path, token, body), http.StatusOK, &st)
	require.Equal(t, id, st.RunID)
	_, status, _ = st.entry(t, "book/fix2")
	require.Equal(t, "manually_reverted", status)
	require.Empty(t, st.ActionRequired)
	require.Empty(t, st.ActionRequiredText)
	decodeInto(t, e.do(http.MethodPost, path, token, body), http.StatusConflict, &eb)
	require.Contains(t, eb.Error, reactor.ErrAlreadyResolved.Error())
	e.get("/api/needs-human", http.StatusOK, &page)
	require.Equal(t, []string{"clobber-2"}, page.ids(), "resolved: off the list")

	// An unescaped slash in the entry id reaches the same entry.
	decodeInto(t, e.do(http.MethodPost, "/api/runs/clobber-2/entries/book/fix2%232/resolve", token,
		`{"kind":"left_applied","note":"the corrected address stays"}`), http.StatusOK, &st)
	_, status, _ = st.entry(t, "book/fix1")
	require.Equal(t, "left_applied", status, "left applied: the blocked entry is kept for good")
	e.get("/api/needs-human", http.StatusOK, &page)
	require.Empty(t, page.Runs)

	// The existing re-trigger: a worker retries the rollback, and the
	// entry the conflict blocked is restored.
	var a accepted
	decodeInto(t, e.do(http.MethodPost, "/api/runs/"+id+"/rollback", token, `{"reason":"test"}`), http.StatusAccepted, &a)
	require.Eventually(t, func() bool {
		var st rbStatus
		e.get("/api/runs/"+id+"/rollback-status", http.StatusOK, &st)
		_, s, _ := st.entry(t, "book/fix1")
		return s == "compensated" && st.Summary.Outcome == "reverted"
	}, 20*time.Second, 20*time.Millisecond, "the blocked entry is undone")
	require.Equal(t, dashboard.GuardOld, fx.Get(ctx), "fix1 restored the address it found")
	require.Equal(t, dashboard.GuardClobbered, other.Get(ctx), "left applied: untouched")
}

// A run rolling back (its process died mid-rollback, the lock is gone)
// refuses a resolution with 409 and the run's status.
func TestResolveRefusedWhileRollingBack(t *testing.T) {
	t.Parallel()
	const token = "rb-token"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 30*time.Second)
	// An engine whose lock keeper notices soon that the lock was taken (the
	// Undo below hands it to "other"), so the "crashed" run stops; a second
	// leaves a loaded machine room to save the rollback decision first.
	eng, err := reactor.NewEngine(ctx, reactor.Config{Client: e.rdb, Prefix: e.prefix, LockExpiry: time.Second, Logger: discard})
	require.NoError(t, err)
	lockKey := e.prefix + ":{run:dying-1}:lock"
	def := reactor.MustDefine("dying",
		reactor.Step("a", reactor.StepConfig[reactor.Args, int]{
			Run: func(context.Context, reactor.Args) (int, error) { return 1, nil },
			Undo: func(ctx context.Context, _ reactor.Args, _ int) error {
				e.rdb.Set(context.Background(), lockKey, "other", time.Minute)
				<-ctx.Done()
				return ctx.Err()
			},
		}),
		reactor.Step("b", reactor.StepConfig[reactor.Args, int]{After: []string{"a"},
			Run: func(context.Context, reactor.Args) (int, error) { return 0, errors.New("boom") }}))
	_, err = eng.Run(ctx, def, nil, reactor.WithRunID("dying-1"))
	require.ErrorIs(t, err, reactor.ErrLockLost)
	require.NoError(t, e.rdb.Del(ctx, lockKey).Err())
	var eb errBody
	decodeInto(t, e.do(http.MethodPost, resolvePath("dying-1", "a#1"), token, `{"kind":"left_applied","note":"n"}`), http.StatusConflict, &eb)
	require.Equal(t, "rolling_back", eb.Status)
	require.Contains(t, eb.Error, reactor.ErrRollbackInProgress.Error())
}

// A conflict inside a fan-out map's element run: needs-human lists the
// element run (with its owner), and it is resolved by its element run id.
func TestResolveElementRun(t *testing.T) {
	t.Parallel()
	const token = "elem-token"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 60*time.Second)
	owner, element, key := dashboard.TierDefs(e.rdb, e.prefix)
	for n := range 3 {
		require.NoError(t, e.rdb.Set(ctx, key(n), "basic", 0).Err())
	}
	e.startWorker(owner, element)
	_, err := e.engine.Enqueue(ctx, owner, map[string]any{"items": []int{0, 1, 2}}, reactor.WithRunID("tiers"))
	require.NoError(t, err)
	final, err := e.engine.Wait(ctx, "tiers")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)

	// The element run waits, and so does its owner, whose item names the
	// element run to resolve it on: one conflict, listed once, under the
	// owner (the overview's tile counts it once).
	var page needsHumanPage
	e.get("/api/needs-human", http.StatusOK, &page)
	require.Len(t, page.Runs, 1, "%+v", page)
	elemID := mapstep.MapID("tiers", "each") + ".1"
	ownerRun := page.Runs[0]
	require.Equal(t, "tiers", ownerRun.ID)
	require.Len(t, ownerRun.ActionRequired, 1)
	require.Equal(t, "upgrade#1", ownerRun.ActionRequired[0].ID)
	require.Equal(t, elemID, ownerRun.ActionRequired[0].Run, "the owner's item says where to resolve it")
	// The element run's own report is what its page shows.
	var elStatus rbStatus
	e.get("/api/runs/"+url.PathEscape(elemID)+"/rollback-status", http.StatusOK, &elStatus)
	_, elEntry, _ := elStatus.entry(t, "upgrade")
	require.Equal(t, "needs_human", elEntry)
	// The element run's page is served like any run's.
	res := e.do(http.MethodGet, "/runs/"+url.PathEscape(elemID), "", "")
	require.Equal(t, http.StatusOK, res.code)

	var st rbStatus
	decodeInto(t, e.do(http.MethodPost, resolvePath(elemID, "upgrade#1"), token, `{"kind":"left_applied","note":"platinum stays"}`), http.StatusOK, &st)
	require.Equal(t, elemID, st.RunID)
	_, status, _ := st.entry(t, "upgrade")
	require.Equal(t, "left_applied", status)
	e.get("/api/needs-human", http.StatusOK, &page)
	require.Empty(t, page.Runs)
}
