package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/store"
	"github.com/goreactor/goreactor/reactor"
)

// The API's shape of GET /api/limits, as a client decodes it.
type limitWaitersDoc struct {
	Recorded bool   `json:"recorded"`
	RedisKey string `json:"redis_key"`
	Count    int64  `json:"count"`
	Waiters  []struct {
		RunID       string `json:"run_id"`
		Step        string `json:"step"`
		LastRefused string `json:"last_refused"`
		AgoMS       int64  `json:"ago_ms"`
		Holds       bool   `json:"holds"`
	} `json:"waiters"`
}

type limitsDoc struct {
	Name        string `json:"name"`
	Key         string `json:"key"`
	Now         string `json:"now"`
	Concurrency struct {
		RedisKey string `json:"redis_key"`
		Held     int    `json:"held"`
		Expired  int    `json:"expired"`
		Holders  []struct {
			RunID       string `json:"run_id"`
			Step        string `json:"step"`
			Holder      string `json:"holder"`
			LeaseEnds   string `json:"lease_ends"`
			LeaseLeftMS int64  `json:"lease_left_ms"`
			Expired     bool   `json:"expired"`
		} `json:"holders"`
		Truncated bool            `json:"truncated"`
		Waiters   limitWaitersDoc `json:"waiters"`
	} `json:"concurrency"`
	Rate struct {
		RedisKey     string `json:"redis_key"`
		Last1s       int64  `json:"last_1s"`
		Last10s      int64  `json:"last_10s"`
		Last60s      int64  `json:"last_60s"`
		Kept         int64  `json:"kept"`
		LastAdmitted string `json:"last_admitted"`
		Recent       []struct {
			RunID string `json:"run_id"`
			Step  string `json:"step"`
			At    string `json:"at"`
		} `json:"recent"`
		Waiters limitWaitersDoc `json:"waiters"`
	} `json:"rate"`
}

func limitsPath(name, key string) string {
	return "/api/limits?" + url.Values{"name": {name}, "key": {key}}.Encode()
}

// Holders seeded through the store's own scripts: the live one with its
// lease, the one whose lease ended marked so (the next acquire drops it);
// admissions counted by 1, 10 and 60 s windows; waiters "not recorded"
// until the record exists, then listed, the one that got in since marked.
func TestLimitsHoldersRatesAndWaiters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	k := keys.New(e.prefix)
	st, err := store.New(ctx, e.rdb, k)
	require.NoError(t, err)

	var empty limitsDoc
	e.get(limitsPath("partner-api", "acme"), http.StatusOK, &empty)
	assert.Equal(t, "partner-api", empty.Name)
	assert.Equal(t, "acme", empty.Key)
	assert.Empty(t, empty.Concurrency.Holders)
	assert.NotNil(t, empty.Concurrency.Holders, "[] not null")
	assert.Zero(t, empty.Rate.Last60s)
	assert.False(t, empty.Concurrency.Waiters.Recorded)
	assert.False(t, empty.Rate.Waiters.Recorded)
	assert.Equal(t, k.Slots("partner-api", "acme"), empty.Concurrency.RedisKey)
	assert.Equal(t, k.Slots("partner-api", "acme")+":w", empty.Concurrency.Waiters.RedisKey)

	slots := k.Slots("partner-api", "acme")
	g, err := st.AcquireSlot(ctx, slots, "order-1|book/charge|aa11", "order-1|book/charge", 3, 20*time.Second)
	require.NoError(t, err)
	require.True(t, g.Held)
	g, err = st.AcquireSlot(ctx, slots, "order-2|charge|bb22", "order-2|charge", 3, 30*time.Millisecond)
	require.NoError(t, err)
	require.True(t, g.Held)
	time.Sleep(60 * time.Millisecond) // order-2's lease ends; nothing acquires since
	// Another key of the same limit is not this one's.
	_, err = st.AcquireSlot(ctx, k.Slots("partner-api", "globex"), "order-9|charge|cc33", "order-9|charge", 3, 20*time.Second)
	require.NoError(t, err)

	rate := k.Rate("partner-api", "acme")
	for i := range 3 {
		ok, _, err := st.Admit(ctx, rate, fmt.Sprintf("order-%d|charge|r%d", 10+i, i), []store.Window{{N: 100, Per: time.Minute}})
		require.NoError(t, err)
		require.True(t, ok)
	}
	now, err := e.rdb.Time(ctx).Result()
	require.NoError(t, err)
	ms := now.UnixMilli()
	// Older admissions, as the script scores them (server ms).
	require.NoError(t, e.rdb.ZAdd(ctx, rate, redis.Z{Score: float64(ms - 5_000), Member: "order-20|charge|o1"},
		redis.Z{Score: float64(ms - 30_000), Member: "order-21|charge|o2"}).Err())

	var got limitsDoc
	e.get(limitsPath("partner-api", "acme"), http.StatusOK, &got)
	c := got.Concurrency
	require.Len(t, c.Holders, 2, "%+v", c.Holders)
	assert.Equal(t, 1, c.Held)
	assert.Equal(t, 1, c.Expired)
	// Soonest lease end first: the ended one.
	assert.Equal(t, "order-2", c.Holders[0].RunID)
	assert.Equal(t, "charge", c.Holders[0].Step)
	assert.True(t, c.Holders[0].Expired)
	assert.Zero(t, c.Holders[0].LeaseLeftMS)
	assert.Equal(t, "order-1", c.Holders[1].RunID)
	assert.Equal(t, "book/charge", c.Holders[1].Step)
	assert.Equal(t, "order-1|book/charge|aa11", c.Holders[1].Holder)
	assert.False(t, c.Holders[1].Expired)
	assert.InDelta(t, 20_000, c.Holders[1].LeaseLeftMS, 5_000)
	ends, err := time.Parse(time.RFC3339Nano, c.Holders[1].LeaseEnds)
	require.NoError(t, err)
	assert.WithinDuration(t, now.Add(20*time.Second), ends, 5*time.Second)
	assert.False(t, c.Truncated)

	r := got.Rate
	assert.Equal(t, int64(3), r.Last1s)
	assert.Equal(t, int64(4), r.Last10s)
	assert.Equal(t, int64(5), r.Last60s)
	assert.Equal(t, int64(5), r.Kept)
	require.Len(t, r.Recent, 5)
	assert.Equal(t, "order-21", r.Recent[4].RunID, "newest first")
	assert.Equal(t, "charge", r.Recent[4].Step)
	assert.NotEmpty(t, r.LastAdmitted)
	assert.False(t, c.Waiters.Recorded, "no worker records waiters yet")
	assert.Empty(t, c.Waiters.Waiters)

	// The record a worker would keep: member <run id>|<step>, score the
	// server ms of the last refusal.
	require.NoError(t, e.rdb.ZAdd(ctx, slots+":w", redis.Z{Score: float64(ms - 2_000), Member: "order-3|charge"},
		redis.Z{Score: float64(ms - 9_000), Member: "order-1|book/charge"}).Err())
	require.NoError(t, e.rdb.ZAdd(ctx, rate+":w", redis.Z{Score: float64(ms - 1_000), Member: "order-30|charge"}).Err())
	e.get(limitsPath("partner-api", "acme"), http.StatusOK, &got)
	w := got.Concurrency.Waiters
	require.True(t, w.Recorded)
	assert.Equal(t, int64(2), w.Count)
	require.Len(t, w.Waiters, 2)
	assert.Equal(t, "order-3", w.Waiters[0].RunID, "latest refusal first")
	assert.Equal(t, "charge", w.Waiters[0].Step)
	assert.False(t, w.Waiters[0].Holds)
	assert.InDelta(t, 2_000, w.Waiters[0].AgoMS, 1_500)
	assert.Equal(t, "order-1", w.Waiters[1].RunID)
	assert.True(t, w.Waiters[1].Holds, "it holds a slot now")
	rw := got.Rate.Waiters
	require.True(t, rw.Recorded)
	require.Len(t, rw.Waiters, 1)
	assert.Equal(t, "order-30", rw.Waiters[0].RunID)

	// The limit without a Key: key "".
	_, err = st.AcquireSlot(ctx, k.Slots("one-lock", ""), "order-5|sync|dd44", "order-5|sync", 1, 20*time.Second)
	require.NoError(t, err)
	var lock limitsDoc
	e.get("/api/limits?name=one-lock", http.StatusOK, &lock)
	require.Len(t, lock.Concurrency.Holders, 1)
	assert.Equal(t, "order-5", lock.Concurrency.Holders[0].RunID)
}

// More holders than the answer lists: the soonest to end are listed, the
// rest counted.
func TestLimitsManyHoldersTruncated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	k := keys.New(e.prefix)
	slots := k.Slots("wide", "x")
	now, err := e.rdb.Time(ctx).Result()
	require.NoError(t, err)
	zs := make([]redis.Z, 250)
	for i := range zs {
		zs[i] = redis.Z{Score: float64(now.UnixMilli() + 60_000 + int64(i)), Member: fmt.Sprintf("r-%03d|s|t", i)}
	}
	require.NoError(t, e.rdb.ZAdd(ctx, slots, zs...).Err())
	var got limitsDoc
	e.get(limitsPath("wide", "x"), http.StatusOK, &got)
	assert.True(t, got.Concurrency.Truncated)
	assert.Len(t, got.Concurrency.Holders, 200)
	assert.Equal(t, 250, got.Concurrency.Held)
	assert.Equal(t, "r-000", got.Concurrency.Holders[0].RunID)
}

// A run whose step is limited, run by a worker: while its attempt runs the
// page lists it as the holder with its step; a second run for the same key
// waits (not a holder); once released both complete and the holders are
// gone.
func TestLimitsHolderOfARunningStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 60*time.Second)
	release := make(chan struct{})
	def := reactor.MustDefine("dash-limited",
		reactor.Input[string]("partner", reactor.Required()),
		reactor.Step("call", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"partner": reactor.FromInput("partner")},
			Limits: []reactor.Limit{reactor.Lock("dash-partner", func(a reactor.Args) (string, error) {
				return reactor.Arg[string](a, "partner")
			})},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return "ok", nil
			},
		}),
	)
	e.startWorker(def)
	first, err := e.engine.Enqueue(ctx, def, map[string]any{"partner": "acme"}, reactor.WithRunID("lim-1"))
	require.NoError(t, err)
	var got limitsDoc
	require.Eventually(t, func() bool {
		e.get(limitsPath("dash-partner", "acme"), http.StatusOK, &got)
		return len(got.Concurrency.Holders) == 1
	}, 20*time.Second, 10*time.Millisecond)
	h := got.Concurrency.Holders[0]
	assert.Equal(t, first.RunID, h.RunID)
	assert.Equal(t, "call", h.Step)
	assert.False(t, h.Expired)
	assert.Equal(t, 1, got.Concurrency.Held)
	assert.True(t, strings.HasPrefix(h.Holder, "lim-1|call|"), h.Holder)

	second, err := e.engine.Enqueue(ctx, def, map[string]any{"partner": "acme"}, reactor.WithRunID("lim-2"))
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond) // it tries, and waits
	e.get(limitsPath("dash-partner", "acme"), http.StatusOK, &got)
	require.Len(t, got.Concurrency.Holders, 1, "a lock has one holder")
	assert.Equal(t, "lim-1", got.Concurrency.Holders[0].RunID)

	close(release)
	for _, id := range []string{first.RunID, second.RunID} {
		final, err := e.engine.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	}
	e.get(limitsPath("dash-partner", "acme"), http.StatusOK, &got)
	assert.Empty(t, got.Concurrency.Holders)
}

func TestLimitsRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	for path, want := range map[string]string{
		"/api/limits":                 "name is empty",
		"/api/limits?key=acme":        "name is empty",
		"/api/limits?name=a%7Bb":      "limit name",
		"/api/limits?name=a&tenant=b": "is not one of name, key",
		"/api/limits?name=a&key=" + strings.Repeat("k", 1025): "longer than 1024",
	} {
		res := e.get(path, http.StatusBadRequest, nil)
		assert.Contains(t, string(res.body), want, path)
	}
	res := e.do(http.MethodPost, "/api/limits?name=a", "", "")
	assert.Equal(t, http.StatusMethodNotAllowed, res.code)
	assert.Equal(t, "GET, HEAD", res.header.Get("Allow"))

	page := e.do(http.MethodGet, "/limits?name=a&key=b", "", "")
	require.Equal(t, http.StatusOK, page.code)
	assert.Contains(t, string(page.body), `data-page="limits"`)
	assert.Contains(t, string(page.body), "/static/limits.js?v=")
	assert.Contains(t, string(page.body), `id="nav-limits"`)
	assert.Equal(t, http.StatusMethodNotAllowed, e.do(http.MethodPost, "/limits", "", "").code)
}

// With Config.Definitions, the answer lists the limits their steps
// declare, and /api/limits without a name lists only those.
func TestLimitsDeclaredByTheDefinitions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	def := reactor.MustDefine("declared-limits",
		reactor.Input[string]("tenant"),
		reactor.Step("call", reactor.StepConfig[reactor.Args, int]{
			Args: reactor.Bindings{"tenant": reactor.FromInput("tenant")},
			Limits: []reactor.Limit{{Name: "partner", Concurrency: 5, Rates: []reactor.Rate{{N: 100, Per: time.Second}},
				Key: func(a reactor.Args) (string, error) { return reactor.Arg[string](a, "tenant") }}},
			Run: func(context.Context, reactor.Args) (int, error) { return 0, nil },
		}),
		reactor.Step("report", reactor.StepConfig[reactor.Args, int]{
			Limits: []reactor.Limit{{Name: "daily", OncePer: 24 * time.Hour}},
			Run:    func(context.Context, reactor.Args) (int, error) { return 0, nil },
		}),
	)
	dash, err := dashboard.New(dashboard.Config{Client: e.rdb, Prefix: e.prefix, Queues: []string{e.queue}, Logger: discard,
		Definitions: []*reactor.Definition{def}})
	require.NoError(t, err)
	e.dash, e.srv = dash, httptest.NewServer(dash)
	t.Cleanup(e.srv.Close)

	var only struct {
		Declared []struct {
			Name        string   `json:"name"`
			Concurrency int      `json:"concurrency"`
			Rates       []string `json:"rates"`
			OncePer     string   `json:"once_per"`
			Keyed       bool     `json:"keyed"`
			Steps       []string `json:"steps"`
		} `json:"declared"`
	}
	e.get("/api/limits", http.StatusOK, &only)
	require.Len(t, only.Declared, 2)
	assert.Equal(t, "partner", only.Declared[0].Name)
	assert.Equal(t, 5, only.Declared[0].Concurrency)
	assert.Equal(t, []string{"100 per 1s"}, only.Declared[0].Rates)
	assert.True(t, only.Declared[0].Keyed)
	assert.Equal(t, []string{"declared-limits/call"}, only.Declared[0].Steps)
	assert.Equal(t, "24h0m0s", only.Declared[1].OncePer)
	var one struct {
		Name     string `json:"name"`
		Declared []any  `json:"declared"`
	}
	e.get("/api/limits?name=partner&key=acme", http.StatusOK, &one)
	assert.Equal(t, "partner", one.Name)
	assert.Len(t, one.Declared, 2)
}

// A fair-shared limit's view: every key's slots and waiters, the holders
// with the key each holds for, and the waiters with theirs; a limit whose
// fair-shared keys hold nothing has no fair view.
func TestLimitsFairShare(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	k := keys.New(e.prefix)
	st, err := store.New(ctx, e.rdb, k)
	require.NoError(t, err)
	type fairDoc struct {
		Fair *struct {
			RedisKey string `json:"redis_key"`
			Held     int    `json:"held"`
			Tenants  []struct {
				Key     string `json:"key"`
				Holds   int    `json:"holds"`
				Waiting int    `json:"waiting"`
			} `json:"tenants"`
			Holders []struct {
				RunID string `json:"run_id"`
				Step  string `json:"step"`
				Key   string `json:"key"`
			} `json:"holders"`
			Waiters struct {
				Recorded bool `json:"recorded"`
				Waiters  []struct {
					RunID string `json:"run_id"`
					Key   string `json:"key"`
				} `json:"waiters"`
			} `json:"waiters"`
		} `json:"fair"`
	}
	var none fairDoc
	e.get(limitsPath("tenants", "big"), http.StatusOK, &none)
	assert.Nil(t, none.Fair, "no fair-shared slot held or wanted")

	fair := k.Fair("tenants")
	for i := range 2 {
		g, err := st.AcquireFair(ctx, fair, fmt.Sprintf("big-%d|call|t%d", i, i), "big", fmt.Sprintf("big-%d|call", i), 2, 20*time.Second)
		require.NoError(t, err)
		require.True(t, g.Held)
	}
	g, err := st.AcquireFair(ctx, fair, "small-0|call|s0", "small", "small-0|call", 2, 20*time.Second)
	require.NoError(t, err)
	require.False(t, g.Held, "full")

	var got fairDoc
	e.get(limitsPath("tenants", "small"), http.StatusOK, &got)
	require.NotNil(t, got.Fair)
	f := got.Fair
	assert.Equal(t, fair, f.RedisKey)
	assert.Equal(t, 2, f.Held)
	require.Len(t, f.Tenants, 2)
	assert.Equal(t, "big", f.Tenants[0].Key)
	assert.Equal(t, 2, f.Tenants[0].Holds)
	assert.Equal(t, "small", f.Tenants[1].Key)
	assert.Equal(t, 1, f.Tenants[1].Waiting)
	require.Len(t, f.Holders, 2)
	for _, h := range f.Holders {
		assert.Equal(t, "big", h.Key)
		assert.Equal(t, "call", h.Step)
	}
	require.True(t, f.Waiters.Recorded)
	require.Len(t, f.Waiters.Waiters, 1)
	assert.Equal(t, "small-0", f.Waiters.Waiters[0].RunID)
	assert.Equal(t, "small", f.Waiters.Waiters[0].Key)
}
