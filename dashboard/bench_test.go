package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/keys"
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
func seedRuns(b *testing.B, e *env, n int, base time.Time) {
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

// seedMap gives run "maprun" an inline map of n elements: a real map of 10
// elements, whose results hash and counters are then grown to n with the
// stored outcome of its element 0.
func seedMap(b *testing.B, e *env, n int) {
	ctx := context.Background()
	elem := echo("bench-elem")
	owner := reactor.MustDefine("bench-map", reactor.Input[[]string]("items"),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), Input: "note", Partial: true}))
	require.NoError(b, e.engine.Register(owner, elem))
	items := make([]string, 10)
	for i := range items {
		items[i] = strconv.Itoa(i)
	}
	res, err := e.engine.Run(ctx, owner, map[string]any{"items": items}, reactor.WithRunID("maprun"))
	require.NoError(b, err)
	require.Equal(b, reactor.StatusCompleted, res.Status)
	k := keys.New(e.prefix)
	mapID := mapstep.MapID("maprun", "each")
	one, err := e.rdb.HGet(ctx, k.MapResults(mapID), "0").Result()
	require.NoError(b, err)
	const batch = 5000
	for lo := 0; lo < n; lo += batch {
		vals := make([]any, 0, 2*batch)
		for i := lo; i < min(lo+batch, n); i++ {
			vals = append(vals, strconv.Itoa(i), one)
		}
		require.NoError(b, e.rdb.HSet(ctx, k.MapResults(mapID), vals...).Err())
	}
	require.NoError(b, e.rdb.HSet(ctx, k.MapMeta(mapID), "total", n, "settled", n).Err())
	require.NoError(b, e.rdb.Set(ctx, k.MapOffset(mapID), n, 0).Err())
}

// BenchmarkDashboard: the first page, a page deep in the list, filtered
// pages, and the detail (and element summary) of a run with a map as big as
// the listing, over HTTP on loopback. With GOREACTOR_DASHBOARD_BENCH_RUNS=
// 100000 each of the first four must answer in under 50 ms.
func BenchmarkDashboard(b *testing.B) {
	n := benchSize(b)
	e := newBenchEnv(b)
	base := time.Now().Add(-24 * time.Hour)
	seedRuns(b, e, n, base)
	seedMap(b, e, n)
	deep := fmt.Sprintf("run-%07d", n/10)
	score, err := e.rdb.ZScore(context.Background(), e.prefix+":idx:runs", deep).Result()
	require.NoError(b, err)
	cases := []struct {
		name, path string
		cold       bool
	}{
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
