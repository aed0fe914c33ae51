package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/redisurl"
	"github.com/goreactor/goreactor/internal/version"
)

// TestMain doubles as the worker subprocess: with -procs > 0 the benchmark
// re-executes its own binary, which under `go test` is this test binary.
func TestMain(m *testing.M) {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(workerMain(spec, os.Stdin, os.Stdout, os.Stderr))
	}
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	code := m.Run()
	if err := redistest.CheckLeftovers(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = max(code, 1)
	}
	redistest.Shutdown()
	if code == 0 {
		if n := liveChildren.Load(); n != 0 {
			fmt.Fprintf(os.Stderr, "%d worker process(es) still running after the tests\n", n)
			code = 1
		} else if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// runMainEnv makes the test binary the bench command (main), for tests of
// its exit status.
const runMainEnv = "GOREACTOR_TEST_RUN_BENCH_MAIN"

// -version prints the version and exits 0 without touching Redis.
func TestVersionFlag(t *testing.T) {
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-version")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "REDIS_URL=redis://127.0.0.1:1/0")
	out, err := cmd.Output()
	require.NoError(t, err)
	require.Equal(t, version.Line()+"\n", string(out))
}

// tiny is a benchmark configuration small enough for a test. It reports
// missed targets without failing (-no-fail): the speed targets are set for
// the default run, and a loaded machine misses them.
func tiny(t *testing.T) config {
	t.Helper()
	opts := redistest.Options()
	return config{
		elements:     60,
		workers:      2,
		procs:        0,
		batch:        20,
		undoLatency:  time.Millisecond,
		workLatency:  2 * time.Millisecond,
		rounds:       2,
		redis:        redisurl.Target{URL: fmt.Sprintf("redis://%s/%d", opts.Addr, opts.DB), URLFrom: redisurl.URLFlag},
		json:         true,
		sweepWorkers: []int{1, 2},
		doubleUndo:   -1,
		noFail:       true,
	}
}

// runJSON runs the benchmark and decodes its JSON report.
func runJSON(t *testing.T, ctx context.Context, cfg config) (map[string]any, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(ctx, cfg, &stdout, &stderr)
	var out map[string]any
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &out), "stdout: %s\nstderr: %s", stdout.String(), stderr.String())
	return out, stderr.String(), err
}

// requireNoKeys checks that the run deleted its keys and queue.
func requireNoKeys(t *testing.T, out map[string]any) {
	t.Helper()
	requireNoKeysAt(t, redistest.Client(t), out)
}

// requireNoKeysAt is requireNoKeys on the Redis rdb.
func requireNoKeysAt(t *testing.T, rdb redis.UniversalClient, out map[string]any) {
	t.Helper()
	ctx := context.Background()
	prefix, queue := out["key_prefix"].(string), out["queue"].(string)
	require.NotEmpty(t, prefix)
	for _, pattern := range []string{prefix + ":*", "asynq:{" + queue + "*"} {
		keys, err := redistest.ScanKeys(ctx, rdb, pattern) // every master of a cluster
		require.NoError(t, err)
		require.Empty(t, keys, "keys left behind matching %s", pattern)
	}
}

func TestDefaultRunJSON(t *testing.T) {
	for _, procs := range []int{0, 1} {
		t.Run(fmt.Sprintf("procs=%d", procs), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cfg := tiny(t)
			cfg.procs = procs
			// A Redis of its own: the commands per element are read from
			// the server's INFO commandstats, which the other packages'
			// tests, running at the same time on a shared server, would
			// add to (a negative slope once, under load).
			srv := redistest.StartServer(t)
			cfg.redis = redisurl.Target{URL: "redis://" + srv.Addr + "/0", URLFrom: redisurl.URLFlag}
			out, stderr, err := runJSON(t, ctx, cfg)
			require.NoError(t, err, stderr)
			require.Equal(t, true, out["ok"], "check failures: %v", out["check_failures"])
			require.Empty(t, out["check_failures"])
			for _, f := range []string{"elements", "workers", "procs", "batch_size", "undo_latency_ms", "inline_seconds", "fanout_seconds",
				"speedup", "asynq_baseline_tasks_per_sec", "fanout_elements_per_sec", "baseline_ratio", "roundtrips_per_element_forward",
				"roundtrips_per_element_rollback", "redis_cmds_per_element_forward", "redis_cmds_per_element_rollback", "max_burst", "max_waiting"} {
				require.Contains(t, out, f)
			}
			require.EqualValues(t, 60, out["elements"])
			require.EqualValues(t, 2, out["workers"])
			require.EqualValues(t, procs, out["procs"])
			require.EqualValues(t, 20, out["batch_size"])
			require.EqualValues(t, 1, out["undo_latency_ms"])
			for _, f := range []string{"inline_seconds", "fanout_seconds", "speedup", "asynq_baseline_tasks_per_sec", "fanout_elements_per_sec", "baseline_ratio"} {
				require.Greater(t, out[f].(float64), 0.0, f)
			}
			// 60 elements x 1 ms of undo cannot take less than 60 ms inline.
			require.GreaterOrEqual(t, out["inline_seconds"].(float64), 0.06)
			require.InDelta(t, out["inline_seconds"].(float64)/out["fanout_seconds"].(float64), out["speedup"].(float64), 1e-9)
			// goreactor's round trips per element: 2 forward and 2 rollback
			// today (mapstep/bench_test.go); a slope over a few dozen
			// elements wobbles a little.
			require.InDelta(t, 2, out["roundtrips_per_element_forward"].(float64), 1)
			require.InDelta(t, 2, out["roundtrips_per_element_rollback"].(float64), 1)
			require.Greater(t, out["redis_cmds_per_element_forward"].(float64), out["roundtrips_per_element_forward"].(float64))
			// The owner's start enqueues batch 0 whole, and no action
			// enqueues more: exactly B.
			require.EqualValues(t, 20, out["max_burst"], "action %v", out["max_burst_action"])
			require.NotEmpty(t, out["max_burst_action"])
			waiting := out["max_waiting"].(float64)
			require.Greater(t, waiting, 0.0)
			require.LessOrEqual(t, waiting, 30.0) // B + B/2
			requireVersusBareAsynq(t, out, cfg)
			require.Len(t, out["targets"], 7)
			shaped := map[string]bool{"speedup": true, "fanout_vs_bare_asynq_rollback": true, "fanout_vs_bare_asynq_forward": true}
			for _, tg := range out["targets"].([]any) {
				tg := tg.(map[string]any)
				// The timing targets are set for 10 workers, 10 ms and
				// 2,000 elements: not this run's.
				require.Equal(t, !shaped[tg["name"].(string)], tg["enforced"], "%v", tg)
			}
			own := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer own.Close()
			requireNoKeysAt(t, own, out)
		})
	}
}

// TestWrongResultFails injects an element undone twice: the run must say
// so and fail.
func TestWrongResultFails(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := tiny(t)
	cfg.doubleUndo = 7
	out, stderr, err := runJSON(t, ctx, cfg)
	require.ErrorIs(t, err, errChecks)
	require.Equal(t, false, out["ok"])
	failures := fmt.Sprint(out["check_failures"])
	require.Contains(t, failures, "inline map: 1 element(s) undone more than once, e.g. [7] (element 7: 2 times)")
	require.Contains(t, failures, "fan-out map: 1 element(s) undone more than once")
	require.Contains(t, stderr, "WRONG RESULT")
	requireNoKeys(t, out)
}

// TestBurstOverBatchFails makes the action that runs element 0 of each map
// forward (in the worker subprocess) count B+1 enqueues: the per-action
// check must see it across the process boundary and fail the run.
func TestBurstOverBatchFails(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := tiny(t)
	cfg.procs, cfg.fakeBurst = 1, 21
	out, stderr, err := runJSON(t, ctx, cfg)
	require.ErrorIs(t, err, errChecks)
	require.Equal(t, false, out["ok"])
	failures := fmt.Sprint(out["check_failures"])
	require.Contains(t, failures, "fan-out map: back pressure: one action (el:fo-")
	require.Contains(t, failures, "enqueued 21 tasks, more than the batch size 20")
	require.EqualValues(t, 21, out["max_burst"])
	require.Contains(t, stderr, "WRONG RESULT")
	requireNoKeys(t, out)
}

func TestSweepWritesChart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := tiny(t)
	cfg.sweep, cfg.procs = true, 1
	cfg.plot = filepath.Join(t.TempDir(), "sweep.svg")
	out, stderr, err := runJSON(t, ctx, cfg)
	require.NoError(t, err, stderr)
	require.Equal(t, true, out["ok"], "check failures: %v", out["check_failures"])
	points := out["points"].([]any)
	require.Len(t, points, 2)
	for i, w := range []float64{1, 2} {
		p := points[i].(map[string]any)
		require.Equal(t, w, p["workers"])
		require.Equal(t, w, p["ideal"])
		require.Greater(t, p["speedup"].(float64), 0.0)
		require.EqualValues(t, 20, p["max_burst"])
		require.LessOrEqual(t, p["max_waiting"].(float64), 30.0)
	}
	svg, err := os.ReadFile(cfg.plot)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(svg), "<svg"), "not an SVG: %.80s", svg)
	require.Contains(t, string(svg), "ideal (speedup = workers)")
	requireNoKeys(t, out)
}

// The -interrupts run, small: every run pauses holding no task or worker
// slot, a sweeper pass leaves them all paused and the next examines none,
// and every continue completes its run.
func TestInterruptsRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := tiny(t)
	cfg.interrupts, cfg.continuers, cfg.idleWindow = 40, 4, 200*time.Millisecond
	srv := redistest.StartServer(t) // commandstats of its own
	cfg.redis = redisurl.Target{URL: "redis://" + srv.Addr + "/0", URLFrom: redisurl.URLFlag}
	out, stderr, err := runJSON(t, ctx, cfg)
	require.NoError(t, err, stderr)
	require.Equal(t, true, out["ok"], "check failures: %v", out["check_failures"])
	require.EqualValues(t, 40, out["paused"])
	require.EqualValues(t, 0, out["active_tasks"])
	require.EqualValues(t, 0, out["busy_worker_slots"])
	require.EqualValues(t, 40, out["sweep_pass1_left_paused"])
	require.EqualValues(t, 0, out["sweep_pass2_examined"])
	require.Greater(t, out["continues_per_second"].(float64), 0.0)
	require.Greater(t, out["completed_per_second"].(float64), 0.0)
	require.Greater(t, out["bare_asynq_enqueue_per_second"].(float64), 0.0)
	require.Greater(t, out["commands_per_continued_run"].(float64), 0.0)
	require.EqualValues(t, 40, out["continue_alone_runs"])
	require.Greater(t, out["server_commands_per_continue_call"].(float64), 3.0)
	requireNoKeysAt(t, redis.NewClient(&redis.Options{Addr: srv.Addr}), out)
}

func TestHeapCompare(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := tiny(t)
	cfg.heap = []int{20, 60}
	out, stderr, err := runJSON(t, ctx, cfg)
	require.NoError(t, err, stderr)
	require.Equal(t, true, out["ok"], "check failures: %v", out["check_failures"])
	sizes := out["sizes"].([]any)
	require.Len(t, sizes, 2)
	for _, s := range sizes {
		p := s.(map[string]any)
		require.Greater(t, p["inline_rollback_heap_inuse_bytes"].(float64), 0.0)
		require.Greater(t, p["fanout_rollback_heap_inuse_bytes"].(float64), 0.0)
	}
	require.Greater(t, out["inline_heap_ratio"].(float64), 0.0)
	require.Greater(t, out["fanout_heap_ratio"].(float64), 0.0)
	// Each size ran on keys of its own, under the run's prefix, with
	// Redis persistence watched through each run.
	seen := map[string]bool{}
	for _, s := range sizes {
		p := s.(map[string]any)
		prefix, queue := p["key_prefix"].(string), p["queue"].(string)
		require.True(t, strings.HasPrefix(prefix, out["key_prefix"].(string)+":"), prefix)
		require.True(t, strings.HasPrefix(queue, out["queue"].(string)+"-"), queue)
		require.False(t, seen[prefix], "two sizes on prefix %s", prefix)
		seen[prefix] = true
		for _, side := range []string{"inline_redis_persistence", "fanout_redis_persistence"} {
			a, ok := p[side].(map[string]any)
			require.True(t, ok, "%s: %v", side, p[side])
			require.GreaterOrEqual(t, a["samples"].(float64), 2.0, side)
			if d, ok := a["rdb_changes_delta"].(float64); ok { // null when a save ran (the Redis is shared)
				require.Greater(t, d, 0.0, "%s: a rollback writes", side)
			}
		}
		require.Greater(t, p["redis_used_memory_start_bytes"].(float64), 0.0)
	}
	requireNoKeys(t, out)
}

// TestPersistenceWatch watches a Redis of its own (so every write is the
// test's, and a save disturbs no one): the writes are counted exactly, and
// a background save or AOF rewrite is reported as such.
func TestPersistenceWatch(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--appendonly", "yes")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	ctx := t.Context()

	stop := watchPersistence(rdb)
	for i := range 100 {
		require.NoError(t, rdb.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err())
	}
	a := stop()
	require.NotNil(t, a)
	require.NotNil(t, a.RDBChanges)
	require.EqualValues(t, 100, *a.RDBChanges)
	require.EqualValues(t, 0, a.RDBSaves)
	require.False(t, a.disturbed(), "%+v", a)
	require.True(t, a.AOFEnabled)
	require.NotNil(t, a.AOFBytes)
	require.Greater(t, *a.AOFBytes, int64(0), "100 SETs appended to the AOF")
	require.GreaterOrEqual(t, a.Samples, 2) // before and after at least
	require.Same(t, a, stop(), "stop is idempotent")

	// settled waits until no save or rewrite runs, reading the state (no
	// fixed sleep).
	settled := func() {
		require.Eventually(t, func() bool {
			p, err := readPersistence(ctx, rdb)
			return err == nil && !p.rdbBgsave && !p.aofRewrite
		}, 10*time.Second, 10*time.Millisecond)
	}
	settled() // an AOF rewrite may follow start-up
	stop = watchPersistence(rdb)
	require.NoError(t, rdb.Set(ctx, "k", 1, 0).Err())
	require.NoError(t, rdb.BgSave(ctx).Err())
	settled()
	a = stop()
	require.EqualValues(t, 1, a.RDBSaves)
	require.Nil(t, a.RDBChanges, "a save resets the counter: no delta")
	require.Equal(t, "ok", a.LastBgsaveStatus)
	require.True(t, a.disturbed())

	stop = watchPersistence(rdb)
	require.NoError(t, rdb.BgRewriteAOF(ctx).Err())
	settled()
	a = stop()
	require.EqualValues(t, 1, a.AOFRewrites)
	require.True(t, a.disturbed())
	require.Equal(t, "ok", a.AOFLastRewriteStatus)
}

// A Redis before 7.0 has no rdb_saves: a moved rdb_last_save_time counts
// as one save. A reply without the fields every Redis has is an error.
func TestPersistenceActivity(t *testing.T) {
	t.Parallel()
	before, err := parsePersistence("# Persistence\r\nrdb_changes_since_last_save:40\r\nrdb_bgsave_in_progress:0\r\n" +
		"rdb_last_save_time:1000\r\nrdb_last_bgsave_status:ok\r\naof_enabled:0\r\naof_rewrite_in_progress:0\r\n")
	require.NoError(t, err)
	require.EqualValues(t, -1, before.rdbSaves)
	after := before
	after.rdbChanges = 55
	a := activity(before, after, false, false, 2)
	require.EqualValues(t, 15, *a.RDBChanges)
	require.False(t, a.disturbed())
	after.rdbLastSaveTime, after.rdbChanges = 1010, 3
	a = activity(before, after, false, false, 2)
	require.EqualValues(t, 1, a.RDBSaves)
	require.Nil(t, a.RDBChanges)
	require.True(t, activity(before, before, true, false, 3).disturbed(), "a save seen in progress")

	_, err = parsePersistence("# Persistence\r\nrdb_bgsave_in_progress:0\r\n")
	require.ErrorContains(t, err, "rdb_changes_since_last_save missing")
}

// TestCancelStopsWorkers interrupts a run (as Ctrl-C does): it returns
// promptly, its worker processes are gone and its keys deleted.
func TestCancelStopsWorkers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := tiny(t)
	cfg.procs, cfg.elements, cfg.undoLatency = 1, 5000, 5*time.Millisecond
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, &stdout, &stderr) }()
	time.Sleep(1500 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.Error(t, err, "an interrupted run is not a result")
	case <-time.After(20 * time.Second):
		t.Fatal("the run did not stop within 20 s of its cancel")
	}
}

// A missed enforced target fails the run after the report, naming the
// target; -no-fail, a target not enforced, or a report without targets
// (the sweep) do not.
func TestMissedTargetsFail(t *testing.T) {
	t.Parallel()
	r := &report{Targets: []targetCheck{
		{Name: "speedup", Want: ">= 8", Got: 2, Note: "the target is set for 10 workers, 10 ms, 2,000 elements: not enforced"},
		{Name: "baseline_ratio", Want: ">= 0.33", Got: 0.21, Enforced: true},
		{Name: "roundtrips_per_element_forward", Want: "<= 6", Got: 5, Met: true, Enforced: true},
	}}
	err := missedTargets(r, false)
	var missed *missedError
	require.ErrorAs(t, err, &missed)
	require.Equal(t, []string{"baseline_ratio 0.21 (want >= 0.33)"}, missed.targets)
	require.EqualError(t, err, "performance target(s) missed: baseline_ratio 0.21 (want >= 0.33) (-no-fail reports them without failing)")
	require.NoError(t, missedTargets(r, true))
	r.Targets[1].Met = true
	require.NoError(t, missedTargets(r, false))

	h := &heapReport{InlineRatio: 1.1, FanoutRatio: 1.4, Target: heapTarget}
	require.EqualError(t, missedTargets(h, false), "performance target(s) missed: fanout_heap_ratio 1.40 (want <= 1.25) (-no-fail reports them without failing)")
	require.NoError(t, missedTargets(h, true))
	require.NoError(t, missedTargets(&sweepReport{}, false))
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	cfg, err := parseFlags(nil, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, 2000, cfg.elements)
	require.Equal(t, 10, cfg.workers)
	require.Equal(t, 1, cfg.procs)
	require.Equal(t, 50, cfg.batch)
	require.Equal(t, 10*time.Millisecond, cfg.undoLatency)
	require.Equal(t, 10*time.Millisecond, cfg.workLatency)
	require.Equal(t, 5, cfg.rounds)
	require.Equal(t, defaultSweep, cfg.sweepWorkers)
	require.False(t, cfg.noFail)

	cfg, err = parseFlags([]string{"-no-fail"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.True(t, cfg.noFail)
	// -version needs nothing else, and wins over flags it makes moot.
	cfg, err = parseFlags([]string{"-version", "-heap", "5"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.True(t, cfg.version)

	// -limited defaults to 50 workers, limit 20, 10 ms elements; -workers wins.
	cfg, err = parseFlags([]string{"-limited", "10000"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, 10000, cfg.limited)
	require.Equal(t, 50, cfg.workers)
	require.Equal(t, 20, cfg.limit)
	require.Equal(t, 10*time.Millisecond, cfg.elementWork)
	require.Equal(t, 5, cfg.workerSets)
	cfg, err = parseFlags([]string{"-limited", "100", "-workers", "8"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, 8, cfg.workers)

	cfg, err = parseFlags([]string{"-heap", "10000, 100000"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, []int{10000, 100000}, cfg.heap)

	for args, want := range map[string]string{
		"-plot x.svg":                 "-plot charts the sweep",
		"-heap 10000":                 "give at least two",
		"-heap 1,x":                   "want positive sizes",
		"-workers 0":                  "-workers 0",
		"-batch 0":                    "-batch 0",
		"-elements 1":                 "-elements 1",
		"-sweep -heap 1,2":            "choose one",
		"-undo-latency -1ms":          "cannot be negative",
		"-procs -1":                   "cannot be negative",
		"-work-latency -1ms":          "cannot be negative",
		"-rounds 0":                   "-rounds 0",
		"-interrupts -1":              "cannot be negative",
		"-interrupts 5 -sweep":        "a run of its own",
		"-interrupts 5 -continuers 0": "-continuers >= 1",
		"-limited -1":                 "cannot be negative",
		"-limited 5 -interrupts 5":    "a run of its own",
		"-limited 5 -limit 0":         "-limit >= 1",
		"-limited 5 -element-ms 0":    "-element-ms >= 1",
		"-fair -1":                    "cannot be negative",
		"-fair 5 -limited 5":          "a run of its own",
		"-fair 5 -fair-rounds 0":      "-fair-rounds >= 1",
		"-elements 10 extra":          "unexpected arguments",
		"-redis redis://x -nb":        "flag provided but not defined",
	} {
		_, err := parseFlags(strings.Fields(args), &bytes.Buffer{})
		require.ErrorContains(t, err, want, args)
	}
	_, err = parseFlags([]string{"-h"}, &bytes.Buffer{})
	require.ErrorIs(t, err, flag.ErrHelp)
}

// TestHardeningRedisURLNotAnswering: a Redis named by -redis or REDIS_URL
// that does not answer is an error naming the URL, never a fallback.
func TestHardeningRedisURLNotAnswering(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "redis://" + ln.Addr().String() + "/0"
	require.NoError(t, ln.Close())
	cfg, err := parseFlags([]string{"-redis", url}, &bytes.Buffer{})
	require.NoError(t, err)
	_, err = pick(t.Context(), cfg.redis)
	require.ErrorContains(t, err, url)
	require.ErrorContains(t, err, "-redis")
	t.Setenv("REDIS_URL", url)
	cfg, err = parseFlags(nil, &bytes.Buffer{})
	require.NoError(t, err)
	_, err = pick(t.Context(), cfg.redis)
	require.ErrorContains(t, err, url)
	require.ErrorContains(t, err, "REDIS_URL")
}

// requireVersusBareAsynq checks the bare asynq comparisons of a default
// run's report against each other: every ratio is the quotient of the
// figures it reports beside it, and the spreads hold their rounds.
func requireVersusBareAsynq(t *testing.T, out map[string]any, cfg config) {
	t.Helper()
	num := func(k string) float64 {
		v, ok := out[k].(float64)
		require.True(t, ok, "%s: %v", k, out[k])
		return v
	}
	require.InDelta(t, ms(cfg.workLatency), num("work_latency_ms"), 1e-9)
	for _, side := range []struct{ ratio, fan, bare string }{
		{"fanout_vs_bare_asynq_rollback", "fanout_seconds", "bare_asynq_rollback_seconds"},
		{"fanout_vs_bare_asynq_forward", "fanout_forward_work_seconds", "bare_asynq_forward_seconds"},
	} {
		require.Greater(t, num(side.bare), 0.0, side.bare)
		require.InDelta(t, num(side.fan)/num(side.bare), num(side.ratio), 1e-9, side.ratio)
	}
	// n tasks of latency L on W workers cannot finish sooner than n*L/W,
	// on either side.
	floor := (time.Duration(cfg.elements) * cfg.workLatency / time.Duration(cfg.workers)).Seconds()
	require.GreaterOrEqual(t, num("bare_asynq_forward_seconds"), floor)
	require.GreaterOrEqual(t, num("fanout_forward_work_seconds"), floor)
	floor = (time.Duration(cfg.elements) * cfg.undoLatency / time.Duration(cfg.workers)).Seconds()
	require.GreaterOrEqual(t, num("bare_asynq_rollback_seconds"), floor)

	require.EqualValues(t, cfg.rounds, num("throughput_rounds"))
	sp := func(k string) spread {
		raw, err := json.Marshal(out[k])
		require.NoError(t, err)
		var s spread
		require.NoError(t, json.Unmarshal(raw, &s))
		require.Len(t, s.Values, cfg.rounds, k)
		require.Equal(t, median(s.Values), s.Median, k)
		require.LessOrEqual(t, s.Min, s.Median, k)
		require.LessOrEqual(t, s.Median, s.Max, k)
		require.Greater(t, s.Min, 0.0, k)
		return s
	}
	fan, bare, per := sp("fanout_elements_per_sec_rounds"), sp("bare_asynq_tasks_per_sec_rounds"), sp("throughput_ratio_rounds")
	require.InDelta(t, fan.Median/bare.Median, num("throughput_ratio_of_medians"), 1e-9)
	for i := range per.Values {
		require.InDelta(t, fan.Values[i]/bare.Values[i], per.Values[i], 1e-9, "round %d", i)
	}
}

// TestSpread pins the summaries the repeated rounds are reported by: an
// even count's median is the mean of the middle two, and the values keep
// the order they were measured in.
func TestSpread(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in               []float64
		median, min, max float64
	}{
		{in: []float64{3}, median: 3, min: 3, max: 3},
		{in: []float64{5, 1, 3}, median: 3, min: 1, max: 5},
		{in: []float64{4, 1, 3, 2}, median: 2.5, min: 1, max: 4},
		{in: []float64{2600, 2400, 9000, 2500, 2550}, median: 2550, min: 2400, max: 9000},
	} {
		s := summarize(tc.in)
		require.Equal(t, tc.median, s.Median, "%v", tc.in)
		require.Equal(t, tc.min, s.Min, "%v", tc.in)
		require.Equal(t, tc.max, s.Max, "%v", tc.in)
		require.Equal(t, tc.in, s.Values)
	}
	require.Equal(t, spread{Values: []float64{}}, summarize(nil))
	in := []float64{3, 1, 2}
	summarize(in)
	require.Equal(t, []float64{3, 1, 2}, in, "summarize must not sort its input")
	require.Equal(t, []float64{2, 0.5}, ratios([]float64{4, 1, 7}, []float64{2, 2}))
}

// The -limited run, small: the map completes, every element runs once, and
// no more than the limit run at once, in Redis or in-process; a step that
// declares a looser limit than the run checks fails it.
func TestLimitedRun(t *testing.T) {
	t.Parallel()
	for _, slack := range []int{0, 3} {
		t.Run(fmt.Sprintf("slack=%d", slack), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cfg := tiny(t)
			cfg.limited, cfg.limit, cfg.elementWork, cfg.workers, cfg.workerSets = 150, 3, 5*time.Millisecond, 10, 2
			cfg.limitSlack = slack
			out, stderr, err := runJSON(t, ctx, cfg)
			requireNoKeys(t, out)
			require.EqualValues(t, 150, out["elements_run_once"], stderr)
			require.Greater(t, out["elements_per_second"].(float64), 0.0)
			require.EqualValues(t, 600, out["ideal_per_second"])
			require.Greater(t, out["samples"].(float64), 0.0)
			require.Greater(t, out["limit_waits"].(float64), 0.0, "10 workers on 3 slots wait")
			if slack == 0 {
				require.NoError(t, err, stderr)
				require.Equal(t, true, out["ok"], "check failures: %v", out["check_failures"])
				require.LessOrEqual(t, out["max_in_flight_redis"].(float64), 3.0)
				require.LessOrEqual(t, out["max_in_flight_in_process"].(float64), 3.0)
				require.GreaterOrEqual(t, out["max_in_flight_in_process"].(float64), 2.0)
				return
			}
			require.ErrorIs(t, err, errChecks)
			require.Equal(t, false, out["ok"])
			require.Greater(t, out["max_in_flight_in_process"].(float64), 3.0)
		})
	}
}

// The -fair run, small: both limits' small maps complete alone and under
// the big map, every element runs once, and no more than the limit hold
// its slots in Redis or run in-process.
func TestFairRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cfg := tiny(t)
	cfg.fair, cfg.fairSmall, cfg.fairRounds = 300, 4, 2
	cfg.limit, cfg.elementWork, cfg.workers, cfg.workerSets, cfg.batch = 3, 5*time.Millisecond, 10, 2, 3
	out, stderr, err := runJSON(t, ctx, cfg)
	require.NoError(t, err, stderr)
	requireNoKeys(t, out)
	require.Equal(t, true, out["ok"], "check failures: %v", out["check_failures"])
	for _, c := range []string{"fair", "plain"} {
		fc := out[c].(map[string]any)
		require.Len(t, fc["alone_ms"], 2, c)
		require.Len(t, fc["under_load_ms"], 2, c)
		require.Greater(t, fc["ratio"].(float64), 0.0, c)
		require.LessOrEqual(t, fc["max_held_redis"].(float64), 3.0, c)
		require.Greater(t, fc["max_held_redis"].(float64), 0.0, c)
	}
	require.LessOrEqual(t, out["max_in_flight_in_process"].(float64), 3.0)
}
