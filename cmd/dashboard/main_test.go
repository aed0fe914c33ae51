package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
	require.Equal(t, "redis://localhost:6379/0", cfg.redisURL)
	require.Equal(t, "goreactor", cfg.prefix)
	require.Empty(t, cfg.token)
	require.Empty(t, cfg.queues)

	cfg, err = parseConfig([]string{"--addr", ":9000", "-queues", "a, b,,"}, env(map[string]string{
		"GOREACTOR_DASHBOARD_TOKEN": "tok", "GOREACTOR_PREFIX": "p", "REDIS_URL": "redis://r:1/2"}), io.Discard)
	require.NoError(t, err)
	require.Equal(t, ":9000", cfg.addr)
	require.Equal(t, []string{"a", "b"}, cfg.queues)
	require.Equal(t, "tok", cfg.token)
	require.Equal(t, "p", cfg.prefix)
	require.Equal(t, "redis://r:1/2", cfg.redisURL)

	for _, args := range [][]string{{"-addr", "nohost"}, {"-log-level", "loud"}, {"-prefix", ""}, {"extra"}, {"-nope"}} {
		_, err := parseConfig(args, env(nil), io.Discard)
		require.Error(t, err, "%q", args)
	}
	require.Equal(t, 2, run([]string{"-addr", "x"}, env(nil), io.Discard, io.Discard))
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
