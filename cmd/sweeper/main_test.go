package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/promtest"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/version"
	"github.com/goreactor/goreactor/reactor"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func redisURL() string {
	if url := os.Getenv("REDIS_URL"); url != "" {
		return url
	}
	return "redis://" + redistest.Addr() + "/0"
}

func TestParseConfig(t *testing.T) {
	cfg, err := parseConfig(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.redis.String() != "redis://localhost:6379/0" || cfg.prefix != "goreactor" || cfg.queue != "goreactor" || cfg.once ||
		cfg.interval != 10*time.Second || cfg.staleAfter != 10*time.Second || cfg.runPage != 200 || cfg.mapPage != 100 ||
		cfg.leaderTTL != 30*time.Second || cfg.metricsAddr != "" || cfg.trimPage != 100 || cfg.retention != 7*24*time.Hour {
		t.Fatalf("defaults: %+v", cfg)
	}
	cfg, err = parseConfig([]string{"-once", "-interval", "2s"}, envOf(map[string]string{
		"GOREACTOR_PREFIX": "shop", "GOREACTOR_STALE_AFTER": "1m", "GOREACTOR_SWEEP_MAP_PAGE": "7",
		"GOREACTOR_SWEEP_TRIM_PAGE": "9", "GOREACTOR_RETENTION": "24h"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.once || cfg.interval != 2*time.Second || cfg.prefix != "shop" || cfg.staleAfter != time.Minute || cfg.mapPage != 7 ||
		cfg.trimPage != 9 || cfg.retention != 24*time.Hour {
		t.Fatalf("flags and env: %+v", cfg)
	}
	// The workers' queue list, as GOREACTOR_QUEUE holds it for them: the
	// first queue is swept.
	cfg, err = parseConfig(nil, envOf(map[string]string{"GOREACTOR_QUEUE": "critical:6, goreactor:3"}), io.Discard)
	if err != nil || cfg.queue != "critical" {
		t.Fatalf("GOREACTOR_QUEUE list: queue %q, err %v", cfg.queue, err)
	}
	if cfg, err = parseConfig([]string{"-queue", "billing"}, envOf(map[string]string{"GOREACTOR_QUEUE": "critical"}), io.Discard); err != nil || cfg.queue != "billing" {
		t.Fatalf("-queue over GOREACTOR_QUEUE: queue %q, err %v", cfg.queue, err)
	}
	for _, bad := range [][]string{{"-queue", "a:x"}, {"-queue", " , "}, {"-interval", "0s"}, {"-stale-after", "-1s"}, {"-map-page", "0"}, {"-trim-page", "0"}, {"-retention", "0s"}, {"-leader-ttl", "10ms"}, {"-prefix", ""}, {"extra"}, {"-redis-cluster", "redis://a:1/2"}, {"-redis", "r:1"}} {
		if _, err := parseConfig(bad, envOf(nil), io.Discard); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
	if _, err := parseConfig(nil, envOf(map[string]string{"GOREACTOR_SWEEP_RUN_PAGE": "many"}), io.Discard); err == nil {
		t.Error("a non-integer env var was accepted")
	}
	if code := run([]string{"-interval", "soon"}, envOf(nil), io.Discard, io.Discard); code != 2 {
		t.Errorf("bad flag: exit %d, want 2", code)
	}
}

// -version prints the version on stdout and exits 0, whatever the
// environment holds and with no Redis.
func TestVersion(t *testing.T) {
	var out strings.Builder
	bad := envOf(map[string]string{"GOREACTOR_SWEEP_RUN_PAGE": "many", "REDIS_URL": "redis://127.0.0.1:1/0"})
	if code := run([]string{"-version"}, bad, &out, io.Discard); code != 0 || out.String() != version.Line()+"\n" {
		t.Errorf("-version: exit %d, output %q, want 0 and %q", code, out.String(), version.Line()+"\n")
	}
}

func TestNoRedisExitsOne(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"-once", "-redis", "redis://127.0.0.1:1/0"}, envOf(nil), io.Discard, &out); code != 1 {
		t.Fatalf("exit %d, want 1; output:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "does not answer PING") {
		t.Errorf("output does not say why:\n%s", out.String())
	}
	// go-redis's own complaint about the dial is one of the JSON lines.
	goRedis := false
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("not a JSON line: %s", line)
		}
		goRedis = goRedis || m["component"] == "go-redis"
	}
	if !goRedis {
		t.Errorf("no go-redis line in the JSON logs:\n%s", out.String())
	}
}

// passLine returns the summary line of the pass logged in out.
func passLine(t *testing.T, out string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["event"] == "reactor.sweep.pass" {
			return m
		}
	}
	return nil
}

func TestOnceSweepsAndLogsASummary(t *testing.T) {
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	var out bytes.Buffer
	if code := run([]string{"-once", "-redis", redisURL(), "-prefix", prefix, "-queue", queue}, envOf(nil), io.Discard, &out); code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, out.String())
	}
	m := passLine(t, out.String())
	if m == nil {
		t.Fatalf("no pass summary logged:\n%s", out.String())
	}
	for _, k := range []string{"runs_examined", "runs_woken", "maps_examined", "elements", "rollbacks", "claims", "resumes", "total_recovered", "trim_examined", "trimmed", "total_trimmed"} {
		if _, ok := m[k]; !ok {
			t.Errorf("summary has no %q: %v", k, m)
		}
	}
}

// A -once pass trims the listing entries of runs long gone and says so in
// its summary line.
func TestHardeningOnceTrimsTheListingIndexes(t *testing.T) {
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	rdb := redistest.Client(t)
	k := keys.New(prefix)
	srv, err := rdb.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	old := float64(srv.Add(-48 * time.Hour).UnixMilli())
	for _, key := range []string{k.Runs(), k.Status("completed")} {
		if err := rdb.ZAdd(t.Context(), key, redis.Z{Score: old, Member: "gone"}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if code := run([]string{"-once", "-retention", "24h", "-redis", redisURL(), "-prefix", prefix, "-queue", queue}, envOf(nil), io.Discard, &out); code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, out.String())
	}
	m := passLine(t, out.String())
	if m == nil || m["trimmed"] != float64(2) {
		t.Fatalf("summary does not report 2 trimmed entries:\n%s", out.String())
	}
	if n := rdb.ZCard(t.Context(), k.Runs()).Val() + rdb.ZCard(t.Context(), k.Status("completed")).Val(); n != 0 {
		t.Fatalf("%d entries left", n)
	}
}

func TestOnceSkipsWhileAnotherSweeperLeads(t *testing.T) {
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	rdb := redistest.Client(t)
	lease, err := lock.New(rdb, 10*time.Second).TryAcquire(t.Context(), keys.New(prefix).SweeperLeader())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	var out bytes.Buffer
	if code := run([]string{"-once", "-log-level", "debug", "-redis", redisURL(), "-prefix", prefix, "-queue", queue}, envOf(nil), io.Discard, &out); code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, out.String())
	}
	if passLine(t, out.String()) != nil || !strings.Contains(out.String(), "reactor.sweep.skipped") {
		t.Fatalf("swept while another sweeper held the leader lock:\n%s", out.String())
	}
}

// dropEnqueuer loses every wake-up: the runs it is given wait for a sweeper.
type dropEnqueuer struct{}

func (dropEnqueuer) Enqueue(context.Context, reactor.Wake) error { return nil }

// TestLoopServesMetricsAndStops: the loop serves /metrics over HTTP from
// package metrics (parsed with expfmt): after its first pass, which wakes a
// run whose wake-up was lost, it counts one pass, its duration, one run
// recovered and none of the other kinds, the run live as pending, and the
// Go runtime and process collectors. A cancelled loop stops.
func TestLoopServesMetricsAndStops(t *testing.T) {
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	rdb := redistest.Client(t)
	api, err := reactor.NewEngine(t.Context(), reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: dropEnqueuer{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	def := reactor.MustDefine("metrics-lost", reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "a", nil },
	}))
	res, err := api.Enqueue(t.Context(), def, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The run went without progress for an hour, as far as the sweeper
	// can tell.
	srv, err := rdb.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	hourAgo := srv.Add(-time.Hour).UnixMilli()
	k := keys.New(prefix)
	if err := rdb.ZAdd(t.Context(), k.Active(), redis.Z{Score: float64(hourAgo), Member: res.RunID}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(t.Context(), k.RunState(res.RunID), "at", hourAgo).Err(); err != nil {
		t.Fatal(err)
	}

	cfg, err := parseConfig([]string{"-redis", redisURL(), "-prefix", prefix, "-queue", queue, "-interval", "1h", "-stale-after", "1s",
		"-metrics-addr", "127.0.0.1:0"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{grew: make(chan struct{}, 1)}
	loop, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- serve(loop, t.Context(), cfg, slog.New(slog.NewJSONHandler(logs, nil))) }()

	// Wait for the metrics address and the first pass, both in the log.
	var addr string
	timeout := time.After(10 * time.Second)
	for addr == "" || !strings.Contains(logs.String(), `"event":"reactor.sweep.pass"`) {
		select {
		case <-logs.grew:
		case <-timeout:
			t.Fatalf("no metrics address or pass logged:\n%s", logs.String())
		}
		for _, line := range strings.Split(logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["event"] == "sweeper.metrics" {
				addr, _ = m["addr"].(string)
			}
		}
	}
	fams := promtest.Scrape(t, "http://"+addr+"/metrics")
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"goreactor_sweeper_passes_total", nil, 1},
		{"goreactor_sweeper_pass_duration_seconds", nil, 1},
		{"goreactor_sweeper_pass_errors_total", nil, 0},
		{"goreactor_sweeper_recoveries_total", []string{"kind", "run"}, 1},
		{"goreactor_sweeper_recoveries_total", []string{"kind", "element"}, 0},
		{"goreactor_sweeper_recoveries_total", []string{"kind", "rollback"}, 0},
		{"goreactor_sweeper_recoveries_total", []string{"kind", "owner_resume"}, 0},
		{"goreactor_sweeper_recoveries_total", []string{"kind", "claim"}, 0},
		{"goreactor_sweeper_index_trimmed_total", nil, 0},
		{"goreactor_runs", []string{"status", "pending"}, 1},
		{"goreactor_runs", []string{"status", "rolling_back"}, 0},
	} {
		if got := fams.Value(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if fams.Value(name) <= 0 {
			t.Errorf("no %s: the Go runtime and process collectors are missing", name)
		}
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not stop after its context ended")
	}
	if !strings.Contains(logs.String(), `"event":"sweeper.stopped"`) {
		t.Errorf("no stop logged:\n%s", logs.String())
	}
}

// syncBuffer is a log buffer safe across goroutines; grew, when set, is
// signalled (without blocking) after each write.
type syncBuffer struct {
	mu   sync.Mutex
	b    bytes.Buffer
	grew chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.grew != nil {
		select {
		case s.grew <- struct{}{}:
		default:
		}
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// -queue-shards (GOREACTOR_QUEUE_SHARDS) is the workers' shard count: 1 by
// default, refused outside 1..64 with exit status 2.
func TestParseConfigQueueShards(t *testing.T) {
	cfg, err := parseConfig(nil, envOf(nil), io.Discard)
	if err != nil || cfg.shards != 1 {
		t.Fatalf("default: %d shards, err %v", cfg.shards, err)
	}
	cfg, err = parseConfig(nil, envOf(map[string]string{"GOREACTOR_QUEUE_SHARDS": "4"}), io.Discard)
	if err != nil || cfg.shards != 4 {
		t.Fatalf("env: %d shards, err %v", cfg.shards, err)
	}
	for _, bad := range []string{"0", "-1", "65", "x"} {
		if _, err := parseConfig([]string{"-queue-shards", bad}, envOf(nil), io.Discard); err == nil ||
			!strings.Contains(err.Error(), "queue-shards") {
			t.Errorf("-queue-shards %s: error %v", bad, err)
		}
	}
	if code := run([]string{"-queue-shards", "0"}, envOf(nil), io.Discard, io.Discard); code != 2 {
		t.Errorf("-queue-shards 0: exit %d, want 2", code)
	}
}
