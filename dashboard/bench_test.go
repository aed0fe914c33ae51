package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/store"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// benchSize is how many runs and map elements BenchmarkDashboard seeds:
// 2,000 by default, GOREACTOR_DASHBOARD_BENCH_RUNS (100000 for the
// acceptance figures; seeding takes about half a minute) otherwise.
func benchSize(b *testing.B) int {
	if s := os.Getenv("GOREACTOR_DASHBOARD_BENCH_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(b, err)
		return n
	}
	return 2000
}

// seedRuns stores n runs copied from the stored state of real runs (one
// completed, one failed; every tenth seeded run is a failed one of another
// reactor), indexed with the store's own index commands, in pipelines of
// 1,000 runs. Creation times are a millisecond apart, two runs per
// millisecond.
func seedRuns(b testing.TB, e *env, n int, base time.Time) {
	ctx := context.Background()
	ok, bad := echo("bench-ok"), failing("bench-bad")
	require.NoError(b, e.engine.Register(ok, bad))
	_, err := e.engine.Run(ctx, ok, map[string]any{"note": "template"}, reactor.WithRunID("tpl-ok"))
	require.NoError(b, err)
	_, err = e.engine.Run(ctx, bad, nil, reactor.WithRunID("tpl-bad"))
	require.NoError(b, err)
	k := keys.New(e.prefix)
	templates := map[string]map[string]any{}
	for _, id := range []string{"tpl-ok", "tpl-bad"} {
		raw, err := e.rdb.HGet(ctx, k.RunState(id), "d").Bytes()
		require.NoError(b, err)
		var st map[string]any
		require.NoError(b, codec.Unmarshal(raw, &st))
		templates[id] = st
	}
	st, err := store.New(ctx, e.rdb, k)
	require.NoError(b, err)
	const batch = 1000
	for lo := 0; lo < n; lo += batch {
		_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := lo; i < min(lo+batch, n); i++ {
				id := fmt.Sprintf("run-%07d", i)
				tpl, name, status := templates["tpl-ok"], "bench-ok", reactor.StatusCompleted
				if i%10 == 0 {
					tpl, name, status = templates["tpl-bad"], "bench-bad", reactor.StatusFailed
				}
				created := base.Add(time.Duration(i/2) * time.Millisecond)
				tpl["id"], tpl["c"], tpl["t"] = id, created.UnixMilli(), created.Add(40*time.Millisecond).UnixMilli()
				data, err := codec.Marshal(tpl)
				if err != nil {
					return err
				}
				st.QueueIndexStart(ctx, p, id, name, string(reactor.StatusRunning), created)
				p.HSet(ctx, k.RunState(id), "d", data, "v", 3)
				st.QueueMarkStatus(ctx, p, id, name, string(reactor.StatusRunning), string(status), true, created.Add(40*time.Millisecond))
			}
			return nil
		})
		require.NoError(b, err)
	}
}

// A seeded map: which run owns it, whether its settles kept the element
// states (a map started before they did has none: its summary reads the
// results hashes), and whether it rolled back (one generation that undid
// every element).
type mapSeed struct {
	run      string
	states   bool
	rollback bool
}

// seedMaps gives each seed's run an inline map of n elements: a real map
// of 10 elements, whose results hash and counters are then grown to n with
// the stored outcome of its element 0, with the element states the settle
// scripts would have kept (or none), and maybe a settled rollback.
func seedMaps(b *testing.B, e *env, n int, seeds ...mapSeed) {
	ctx := context.Background()
	elem := echo("bench-elem")
	owner := reactor.MustDefine("bench-map", reactor.Input[[]string]("items"),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), Input: "note", Partial: true}))
	require.NoError(b, e.engine.Register(owner, elem))
	items := make([]string, 10)
	for i := range items {
		items[i] = strconv.Itoa(i)
	}
	k := keys.New(e.prefix)
	for _, sd := range seeds {
		res, err := e.engine.Run(ctx, owner, map[string]any{"items": items}, reactor.WithRunID(sd.run))
		require.NoError(b, err)
		require.Equal(b, reactor.StatusCompleted, res.Status)
		mapID := mapstep.MapID(sd.run, "each")
		one, err := e.rdb.HGet(ctx, k.MapResults(mapID), "0").Result()
		require.NoError(b, err)
		const batch = 5000
		for lo := 0; lo < n; lo += batch {
			vals := make([]any, 0, 2*batch)
			var rb []any
			for i := lo; i < min(lo+batch, n); i++ {
				vals = append(vals, strconv.Itoa(i), one)
				if sd.rollback {
					o, err := codec.Marshal(map[string]any{"i": n - 1 - i, "o": "undone"})
					require.NoError(b, err)
					rb = append(rb, strconv.Itoa(i), o)
				}
			}
			require.NoError(b, e.rdb.HSet(ctx, k.MapResults(mapID), vals...).Err())
			if sd.rollback {
				require.NoError(b, e.rdb.HSet(ctx, k.MapRbResults(mapID, 1), rb...).Err())
			}
		}
		require.NoError(b, e.rdb.HSet(ctx, k.MapMeta(mapID), "total", n, "settled", n).Err())
		require.NoError(b, e.rdb.Set(ctx, k.MapOffset(mapID), n, 0).Err())
		// Forward class 1 (ok) in each byte's high nibble, rollback class
		// 1 (undone) in its low one (mapcore's batch.lua, noteState).
		state := byte(0x10)
		if sd.rollback {
			require.NoError(b, e.rdb.HSet(ctx, k.MapMeta(mapID), "rbgen", 1).Err())
			require.NoError(b, e.rdb.HSet(ctx, k.MapRbMeta(mapID, 1), "total", n, "batch_size", 100, "settled", n, "failed", 0, "gen", 1).Err())
			require.NoError(b, e.rdb.Set(ctx, k.MapRbOffset(mapID, 1), n, 0).Err())
			state = 0x11
		}
		if sd.states {
			require.NoError(b, e.rdb.Set(ctx, k.MapStates(mapID), strings.Repeat(string(state), n), 0).Err())
		} else {
			require.NoError(b, e.rdb.Del(ctx, k.MapStates(mapID)).Err())
		}
	}
}

// BenchmarkDashboard: the first page, a page deep in the list, filtered
// pages, a time range, a failure text (found, and not found: the scan
// budget), a count for "select all matching" at its bound, and the detail
// (and element summary) of a run with a map as big as the listing, over
// HTTP on loopback. With GOREACTOR_DASHBOARD_BENCH_RUNS=100000 each of the
// listing pages must answer in under 50 ms.
func BenchmarkDashboard(b *testing.B) {
	n := benchSize(b)
	e := newBenchEnv(b)
	base := time.Now().Add(-24 * time.Hour)
	seedRuns(b, e, n, base)
	seedMaps(b, e, n, mapSeed{run: "maprun", states: true})
	deep := fmt.Sprintf("run-%07d", n/10)
	score, err := e.rdb.ZScore(context.Background(), e.prefix+":idx:runs", deep).Result()
	require.NoError(b, err)
	// A time range a tenth of the seeded span, from the middle.
	msAt := func(i int) string {
		return strconv.FormatInt(base.Add(time.Duration(i/2)*time.Millisecond).UnixMilli(), 10)
	}
	rng := "from=" + msAt(n/2) + "&to=" + msAt(n/2+n/10)
	cases := []struct {
		name, path string
		cold       bool
	}{
		{"time_range_page", "/api/runs?" + rng, false},
		{"failure_text_page", "/api/runs?status=failed&failure=declined", false},
		// A text nothing has: the request reads scanBudget entries and
		// answers partial.
		{"failure_text_miss", "/api/runs?failure=no+such+text", false},
		// Counting a filter that matches more than maxMatching (every
		// failed run): the most a count or a matching batch reads.
		{"matching_count_max", "/api/matching?status=failed", false},
		{"first_page", "/api/runs", false},
		{"deep_page", "/api/runs?cursor=" + dashboard.Cursor(score, deep), false},
		{"filtered_page", "/api/runs?status=failed&reactor=bench-bad", false},
		{"status_page", "/api/runs?status=completed&limit=100", false},
		{"map_run_detail", "/api/runs/maprun", false},
		{"map_elements_summary", "/api/runs/maprun/maps/each/elements", false},
		{"map_elements_summary_cold", "/api/runs/maprun/maps/each/elements", true},
		{"stats", "/api/stats", false},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if c.cold {
					dashboard.ForgetSummaries(e.dash)
				}
				res, err := http.Get(e.srv.URL + c.path)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					b.Fatalf("%s: %d", c.path, res.StatusCode)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/op")
		})
	}
}

// BenchmarkElementSummary: the Redis time of one poll of the element
// summary of a live map of GOREACTOR_DASHBOARD_BENCH_RUNS elements (2,000
// by default, 100000 for the acceptance figure: under 5 ms), read from its
// element states and, for a map started before the settle scripts kept
// them, from its results hashes (the path every map took before), forward
// and after a rollback. A live map's counters move between polls, so each
// poll reads its summary again (the cache is dropped). On a redis-server
// of its own, so that INFO commandstats counts only the polls.
func BenchmarkElementSummary(b *testing.B) {
	n := benchSize(b)
	srv := redistest.StartServer(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = rdb.Close() })
	e := newTBEnvOn(b, rdb, "")
	seedMaps(b, e, n, mapSeed{run: "fwd-states", states: true}, mapSeed{run: "fwd-results"},
		mapSeed{run: "rb-states", states: true, rollback: true}, mapSeed{run: "rb-results", rollback: true})
	for _, c := range []struct{ name, run string }{
		{"forward/states", "fwd-states"}, {"forward/results_hashes", "fwd-results"},
		{"rolled_back/states", "rb-states"}, {"rolled_back/results_hashes", "rb-results"},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			path := e.srv.URL + "/api/runs/" + c.run + "/maps/each/elements"
			before := redisUsec(b, rdb)
			for b.Loop() {
				dashboard.ForgetSummaries(e.dash)
				res, err := http.Get(path)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					b.Fatalf("%s: %d", path, res.StatusCode)
				}
			}
			used := redisUsec(b, rdb) - before
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/op")
			b.ReportMetric(float64(used)/float64(b.N)/1000, "redis-ms/op")
		})
	}
}

// redisUsec is the Redis time (µs) the server spent in commands so far, by
// INFO commandstats: the sum over commands, less INFO (the measurement's
// own) and EXEC, EVAL and EVALSHA (whose commands are counted once already,
// each under its own name).
func redisUsec(b *testing.B, rdb *redis.Client) int64 {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(b, err)
	var sum int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		switch strings.TrimPrefix(name, "cmdstat_") {
		case "info", "exec", "eval", "evalsha":
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				require.NoError(b, err)
				sum += n
			}
		}
	}
	return sum
}

// BenchmarkUpdatedIndexCost measures what an index of runs by their last
// update would cost (docs/dashboard.md, "Finding runs"): an in-process run
// of 10 steps, as is and with one ZADD to such an index per step (the
// command every state write would add; a cluster could not put it in the
// write's script, the index being in another slot). Not in make
// bench-dashboard: run it by name.
func BenchmarkUpdatedIndexCost(b *testing.B) {
	e := newBenchEnv(b)
	ctx := context.Background()
	updated := e.prefix + ":idx:updated"
	def := func(name string, zadd bool) *reactor.Definition {
		parts := make([]reactor.Part, 10)
		for i := range parts {
			var after []string
			if i > 0 {
				after = []string{"s" + strconv.Itoa(i-1)}
			}
			parts[i] = reactor.Step("s"+strconv.Itoa(i), reactor.StepConfig[reactor.Args, int]{After: after,
				Run: func(ctx context.Context, _ reactor.Args) (int, error) {
					if zadd {
						return i, e.rdb.ZAdd(ctx, updated, redis.Z{Score: float64(time.Now().UnixMilli()), Member: name}).Err()
					}
					return i, nil
				}})
		}
		return reactor.MustDefine(name, parts...)
	}
	seq := 0
	for _, c := range []struct {
		name string
		zadd bool
	}{{"as_is", false}, {"with_updated_index", true}} {
		d := def("upd-"+c.name, c.zadd)
		require.NoError(b, e.engine.Register(d))
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				seq++ // a new run each time, across -count too
				if _, err := e.engine.Run(ctx, d, nil, reactor.WithRunID(fmt.Sprintf("%s-%d", c.name, seq))); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/run")
		})
	}
}
