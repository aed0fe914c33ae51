package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goreactor/goreactor/examples"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := parseConfig(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.redisURL != "redis://localhost:6379/0" || cfg.prefix != "goreactor" || cfg.firstQueue != "goreactor" ||
		!maps.Equal(cfg.queues, map[string]int{"goreactor": 1}) || cfg.concurrency != 10 ||
		cfg.lockExpiry != 15*time.Second || cfg.shutdownTimeout != 10*time.Second ||
		cfg.logLevel != slog.LevelInfo || cfg.sweepInterval != 0 {
		t.Errorf("defaults: %+v", cfg)
	}
}

func TestParseConfigEnvThenFlags(t *testing.T) {
	env := envOf(map[string]string{
		"REDIS_URL":                  "redis://r:6379/2",
		"GOREACTOR_PREFIX":           "shop",
		"GOREACTOR_QUEUE":            "critical:6, goreactor:3,low",
		"GOREACTOR_CONCURRENCY":      "4",
		"GOREACTOR_LOCK_EXPIRY":      "20s",
		"GOREACTOR_SHUTDOWN_TIMEOUT": "30s",
		"GOREACTOR_LOG_LEVEL":        "debug",
		"GOREACTOR_SWEEP_INTERVAL":   "1m",
	})
	cfg, err := parseConfig(nil, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.redisURL != "redis://r:6379/2" || cfg.prefix != "shop" || cfg.firstQueue != "critical" ||
		!maps.Equal(cfg.queues, map[string]int{"critical": 6, "goreactor": 3, "low": 1}) || cfg.concurrency != 4 ||
		cfg.lockExpiry != 20*time.Second || cfg.shutdownTimeout != 30*time.Second ||
		cfg.logLevel != slog.LevelDebug || cfg.sweepInterval != time.Minute {
		t.Errorf("from env: %+v", cfg)
	}
	cfg, err = parseConfig([]string{"-redis", "redis://x:1/0", "-queue", "q", "-concurrency", "2", "-log-level", "warn", "-sweep-interval", "0"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.redisURL != "redis://x:1/0" || cfg.firstQueue != "q" || len(cfg.queues) != 1 || cfg.concurrency != 2 ||
		cfg.logLevel != slog.LevelWarn || cfg.sweepInterval != 0 || cfg.prefix != "shop" {
		t.Errorf("flags over env: %+v", cfg)
	}
}

func TestParseConfigRejects(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"-queue", "a:0"}, want: "priority"},
		{args: []string{"-queue", "a,a:2"}, want: "twice"},
		{args: []string{"-queue", " , "}, want: "no queue"},
		{args: []string{"-concurrency", "0"}, want: "at least 1"},
		{args: []string{"-log-level", "loud"}, want: "log-level"},
		{args: []string{"-lock-expiry", "10ms"}, want: "lock-expiry"},
		{args: []string{"extra"}, want: "unexpected"},
		{env: map[string]string{"GOREACTOR_SWEEP_INTERVAL": "often"}, want: "GOREACTOR_SWEEP_INTERVAL"},
	} {
		if _, err := parseConfig(tc.args, envOf(tc.env), io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: error %v, want one mentioning %q", tc.args, tc.env, err, tc.want)
		}
	}
}

func TestServeFailsWithoutRedis(t *testing.T) {
	cfg, err := parseConfig([]string{"-redis", "redis://127.0.0.1:1/0"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	err = serve(t.Context(), func() {}, cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "does not answer PING") {
		t.Fatalf("serve: %v", err)
	}
}

// TestServe runs the worker with its sweeper, hands it a Checkout the way an
// API process would, and stops it.
func TestServe(t *testing.T) {
	url := os.Getenv("REDIS_URL")
	if url == "" {
		url = "redis://" + redistest.Addr() + "/0"
	}
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	cfg, err := parseConfig([]string{"-redis", url, "-prefix", prefix, "-queue", queue + ":2", "-sweep-interval", "50ms"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	logs := &syncBuffer{}
	go func() { served <- serve(ctx, func() {}, cfg, slog.New(slog.NewJSONHandler(logs, nil))) }()

	rdb := redistest.Client(t)
	e, err := reactor.NewEngine(t.Context(), reactor.Config{Client: rdb, Prefix: prefix, Logger: slog.New(slog.DiscardHandler), Enqueuer: worker.NewClient(rdb, queue)})
	if err != nil {
		t.Fatal(err)
	}
	order := "w-" + reactor.NewRunID()[:8]
	res, err := e.Enqueue(t.Context(), examples.Checkout, map[string]any{"order": order, "item": "book"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer wcancel()
	res, err = e.Wait(wctx, res.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != reactor.StatusCompleted {
		t.Errorf("status %s, failure %v", res.Status, res.Failure)
	}
	// The in-process sweeper runs its passes (each logs a summary).
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), `"event":"reactor.sweep.pass"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no sweeper pass logged:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not return after its context ended")
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's and the test's
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestHardeningRedisURLNotAnswering: a REDIS_URL that does not answer exits
// 1 with a message naming the URL.
func TestHardeningRedisURLNotAnswering(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "redis://" + ln.Addr().String() + "/0"
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := run(nil, envOf(map[string]string{"REDIS_URL": url}), &out); code != 1 {
		t.Fatalf("exit %d, want 1; output:\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), url) {
		t.Fatalf("output does not name %s:\n%s", url, out.String())
	}
}
