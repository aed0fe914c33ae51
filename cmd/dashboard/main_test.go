package main

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/version"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseConfig(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig(nil, env(nil), io.Discard)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8080", cfg.addr, "loopback by default")
	require.Equal(t, "redis://localhost:6379/0", cfg.redis.String())
	require.Equal(t, "goreactor", cfg.prefix)
	require.Empty(t, cfg.token)
	require.Equal(t, "goreactor", cfg.control)
	require.Equal(t, []string{"goreactor"}, cfg.queues, "the -queue list")
	require.Empty(t, cfg.deprecated)

	cfg, err = parseConfig([]string{"--addr", ":9000", "-queues", "a, b,,"}, env(map[string]string{
		"GOREACTOR_DASHBOARD_TOKEN": "tok", "GOREACTOR_PREFIX": "p", "REDIS_URL": "redis://r:1/2"}), io.Discard)
	require.NoError(t, err)
	require.Equal(t, ":9000", cfg.addr)
	require.Equal(t, []string{"a", "b"}, cfg.queues)
	require.Equal(t, "tok", cfg.token)
	require.Equal(t, "p", cfg.prefix)
	require.Equal(t, "redis://r:1/2", cfg.redis.String())

	for _, args := range [][]string{{"-queue", "a:x"}, {"-queue", " , "}, {"-queues", "*,a"}, {"-addr", "nohost"}, {"-log-level", "loud"}, {"-prefix", ""}, {"extra"}, {"-nope"},
		{"-redis", "redis://r:1/0", "-redis-cluster", "a:1"}, {"-redis-cluster", "redis://a:1/2"}, {"-redis", "r:1"}} {
		_, err := parseConfig(args, env(nil), io.Discard)
		require.Error(t, err, "%q", args)
	}
	require.Equal(t, 2, run([]string{"-addr", "x"}, env(nil), io.Discard, io.Discard))
}

// -queue and GOREACTOR_QUEUE are the workers' queue list: actions on runs
// that recorded no queue go to the first, /api/stats reports them all
// unless -queues says otherwise. The deprecated -control-queue and
// GOREACTOR_CONTROL_QUEUE still work where the new names are not set, and
// are named for the startup warning.
func TestParseConfigQueue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		args       []string
		env        map[string]string
		control    string
		queues     []string
		deprecated []string
	}{
		{name: "env list", env: map[string]string{"GOREACTOR_QUEUE": "critical:6, goreactor:3"},
			control: "critical", queues: []string{"critical", "goreactor"}},
		{name: "flag over env", args: []string{"-queue", "billing"}, env: map[string]string{"GOREACTOR_QUEUE": "critical"},
			control: "billing", queues: []string{"billing"}},
		{name: "-queues reports others", args: []string{"-queue", "billing", "-queues", "billing,low"},
			control: "billing", queues: []string{"billing", "low"}},
		{name: "every queue", args: []string{"-queues", "*"}, control: "goreactor", queues: []string{"*"}},
		{name: "deprecated flag", args: []string{"-control-queue", "old"},
			control: "old", queues: []string{"old"}, deprecated: []string{"-control-queue"}},
		{name: "deprecated flag loses to -queue", args: []string{"-control-queue", "old", "-queue", "new"},
			control: "new", queues: []string{"new"}, deprecated: []string{"-control-queue"}},
		{name: "deprecated env", env: map[string]string{"GOREACTOR_CONTROL_QUEUE": "old"},
			control: "old", queues: []string{"old"}, deprecated: []string{"GOREACTOR_CONTROL_QUEUE"}},
		{name: "deprecated env loses to GOREACTOR_QUEUE", env: map[string]string{"GOREACTOR_CONTROL_QUEUE": "old", "GOREACTOR_QUEUE": "new"},
			control: "new", queues: []string{"new"}, deprecated: []string{"GOREACTOR_CONTROL_QUEUE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseConfig(tc.args, env(tc.env), io.Discard)
			require.NoError(t, err)
			require.Equal(t, tc.control, cfg.control)
			require.Equal(t, tc.queues, cfg.queues)
			require.Equal(t, tc.deprecated, cfg.deprecated)
		})
	}
	var usage strings.Builder
	_, err := parseConfig([]string{"-h"}, env(nil), &usage)
	require.ErrorIs(t, err, flag.ErrHelp)
	require.Contains(t, usage.String(), "DEPRECATED: use -queue")
	require.Contains(t, usage.String(), "GOREACTOR_QUEUE")
}

// -version prints the version on stdout and exits 0, before anything else
// is read or checked (a malformed environment, no Redis).
func TestVersion(t *testing.T) {
	var out strings.Builder
	bad := env(map[string]string{"GOREACTOR_DASHBOARD_ADDR": "nohost", "REDIS_URL": "redis://127.0.0.1:1/0"})
	require.Equal(t, 0, run([]string{"-version"}, bad, &out, io.Discard))
	require.Equal(t, version.Line()+"\n", out.String())
	require.Regexp(t, `^goreactor \S+\n$`, out.String())
}

// A Redis that does not answer exits 1, and every line written is JSON,
// go-redis's own complaint about the dial included; a deprecated setting is
// warned about first.
func TestNoRedisExitsOne(t *testing.T) {
	var out strings.Builder
	require.Equal(t, 1, run([]string{"-redis", "redis://127.0.0.1:1/0", "-addr", "127.0.0.1:0", "-control-queue", "old"},
		env(nil), io.Discard, &out))
	require.Contains(t, out.String(), "does not answer PING")
	require.Contains(t, out.String(), `"msg":"-control-queue is deprecated: use -queue or GOREACTOR_QUEUE`)
	require.Contains(t, out.String(), `"level":"WARN"`)
	goRedis := false
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "not a JSON line: %s", line)
		goRedis = goRedis || m["component"] == "go-redis"
	}
	require.True(t, goRedis, "no go-redis line in the JSON logs:\n%s", out.String())
}

// The binary serves the API against a real Redis and shuts down when its
// context ends.
func TestServe(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg, err := parseConfig([]string{"-addr", "127.0.0.1:0", "-redis", "redis://" + redistest.Addr() + "/0",
		"-prefix", redistest.Prefix(t), "-queues", redistest.Queue(t)}, env(nil), io.Discard)
	require.NoError(t, err)
	ready, done := make(chan string, 1), make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	go func() { done <- serve(sctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), ready) }()
	addr := <-ready
	res, err := http.Get("http://" + addr + "/api/stats")
	require.NoError(t, err)
	var st map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&st))
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, st, "by_status")
	res, err = http.Post("http://"+addr+"/api/runs/x/undo", "application/json", strings.NewReader(""))
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusForbidden, res.StatusCode, "no token: actions refused")
	stop()
	require.NoError(t, <-done)
}

// -queue-shards (GOREACTOR_QUEUE_SHARDS) is the workers' shard count of the
// first -queue: 1 by default, refused outside 1..64 with exit status 2.
func TestParseConfigQueueShards(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig(nil, env(nil), io.Discard)
	require.NoError(t, err)
	require.Equal(t, 1, cfg.shards)
	cfg, err = parseConfig([]string{"-queue-shards", "5"}, env(map[string]string{"GOREACTOR_QUEUE_SHARDS": "3"}), io.Discard)
	require.NoError(t, err)
	require.Equal(t, 5, cfg.shards)
	for _, bad := range []string{"0", "-1", "65"} {
		_, err := parseConfig(nil, env(map[string]string{"GOREACTOR_QUEUE_SHARDS": bad}), io.Discard)
		require.ErrorContains(t, err, "-queue-shards (GOREACTOR_QUEUE_SHARDS): "+bad+" shards", bad)
	}
	require.Equal(t, 2, run([]string{"-queue-shards", "99"}, env(nil), io.Discard, io.Discard))
}

// -stall-after (GOREACTOR_DASHBOARD_STALL_AFTER) is the dashboard's
// StallAfter: 2 minutes by default, the flag over the environment, and
// never zero or negative.
func TestParseConfigStallAfter(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig(nil, env(nil), io.Discard)
	require.NoError(t, err)
	require.Equal(t, dashboard.DefaultStallAfter, cfg.stallAfter)
	cfg, err = parseConfig(nil, env(map[string]string{"GOREACTOR_DASHBOARD_STALL_AFTER": "45s"}), io.Discard)
	require.NoError(t, err)
	require.Equal(t, 45*time.Second, cfg.stallAfter)
	cfg, err = parseConfig([]string{"-stall-after", "5m"}, env(map[string]string{"GOREACTOR_DASHBOARD_STALL_AFTER": "45s"}), io.Discard)
	require.NoError(t, err)
	require.Equal(t, 5*time.Minute, cfg.stallAfter)
	for _, args := range [][]string{{"-stall-after", "0s"}, {"-stall-after", "-1m"}, {"-stall-after", "soon"}} {
		_, err := parseConfig(args, env(nil), io.Discard)
		require.Error(t, err, "%q", args)
	}
	_, err = parseConfig(nil, env(map[string]string{"GOREACTOR_DASHBOARD_STALL_AFTER": "soon"}), io.Discard)
	require.Error(t, err)
}
