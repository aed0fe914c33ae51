package worker

import (
	"errors"
	"flag"
	"io"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"
)

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestParseSettingsDefaults(t *testing.T) {
	t.Parallel()
	cfg, err := parseSettings(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.redis.String() != "redis://localhost:6379/0" || cfg.prefix != "goreactor" || cfg.firstQueue != "goreactor" ||
		!maps.Equal(cfg.queues, map[string]int{"goreactor": 1}) || cfg.concurrency != 10 ||
		cfg.lockExpiry != 3*time.Second || cfg.shutdownTimeout != 10*time.Second ||
		cfg.logLevel != slog.LevelInfo || cfg.sweepInterval != time.Second || cfg.staleAfter != 2*time.Second {
		t.Errorf("defaults: %+v", cfg)
	}
	// The defaults recover a killed worker's run within 5 s: its lock
	// expires, then the next pass wakes it (a run it saw locked is looked
	// at again when the lock would expire). StaleAfter must not add to
	// that for a run killed just after a write.
	if recovery := DefaultLockExpiry + DefaultSweepInterval; recovery >= 5*time.Second || DefaultStaleAfter > DefaultLockExpiry {
		t.Errorf("defaults recover in %s (stale after %s): want under 5 s", recovery, DefaultStaleAfter)
	}
}

func TestParseSettingsEnvThenFlags(t *testing.T) {
	t.Parallel()
	env := envOf(map[string]string{
		"REDIS_URL":                  "redis://r:6379/2",
		"GOREACTOR_PREFIX":           "shop",
		"GOREACTOR_QUEUE":            "critical:6, goreactor:3,low",
		"GOREACTOR_CONCURRENCY":      "4",
		"GOREACTOR_LOCK_EXPIRY":      "20s",
		"GOREACTOR_SHUTDOWN_TIMEOUT": "30s",
		"GOREACTOR_LOG_LEVEL":        "debug",
		"GOREACTOR_SWEEP_INTERVAL":   "1m",
		"GOREACTOR_STALE_AFTER":      "30s",
	})
	cfg, err := parseSettings(nil, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.redis.String() != "redis://r:6379/2" || cfg.prefix != "shop" || cfg.firstQueue != "critical" ||
		!maps.Equal(cfg.queues, map[string]int{"critical": 6, "goreactor": 3, "low": 1}) || cfg.concurrency != 4 ||
		cfg.lockExpiry != 20*time.Second || cfg.shutdownTimeout != 30*time.Second ||
		cfg.logLevel != slog.LevelDebug || cfg.sweepInterval != time.Minute || cfg.staleAfter != 30*time.Second {
		t.Errorf("from env: %+v", cfg)
	}
	cfg, err = parseSettings([]string{"-redis", "redis://x:1/0", "-queue", "q", "-concurrency", "2", "-log-level", "warn", "-sweep-interval", "0"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.redis.String() != "redis://x:1/0" || cfg.firstQueue != "q" || len(cfg.queues) != 1 || cfg.concurrency != 2 ||
		cfg.logLevel != slog.LevelWarn || cfg.sweepInterval != 0 || cfg.prefix != "shop" {
		t.Errorf("flags over env: %+v", cfg)
	}
	// Cluster seeds stand in for the default URL, from the environment or
	// the command line.
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{env: map[string]string{"REDIS_CLUSTER_ADDRS": "a:7000, b:7001"}},
		{args: []string{"-redis-cluster", "a:7000,b:7001"}},
		{args: []string{"-redis", "", "-redis-cluster", "a:7000,b:7001"}, env: map[string]string{"REDIS_URL": "redis://r:1/0"}},
	} {
		cfg, err := parseSettings(tc.args, envOf(tc.env), io.Discard)
		if err != nil || !cfg.redis.IsCluster() || cfg.redis.Addr() != "a:7000,b:7001" {
			t.Errorf("%v %v: cluster %v at %q, err %v", tc.args, tc.env, err == nil && cfg.redis.IsCluster(), cfg.redis, err)
		}
	}
}

// Every malformed setting is a *UsageError naming it; -h is flag.ErrHelp.
func TestParseSettingsRejects(t *testing.T) {
	t.Parallel()
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
		{args: []string{"-shutdown-timeout", "0s"}, want: "shutdown-timeout"},
		{args: []string{"-sweep-interval", "-1s"}, want: "sweep-interval"},
		{args: []string{"-stale-after", "0s"}, want: "stale-after"},
		{args: []string{"-prefix", ""}, want: "prefix"},
		{args: []string{"-no-such-flag"}, want: "no-such-flag"},
		{args: []string{"extra"}, want: "unexpected"},
		{env: map[string]string{"GOREACTOR_SWEEP_INTERVAL": "often"}, want: "GOREACTOR_SWEEP_INTERVAL"},
		{env: map[string]string{"GOREACTOR_CONCURRENCY": "many"}, want: "GOREACTOR_CONCURRENCY"},
		{args: []string{"-redis", "localhost:6379"}, want: "-redis localhost:6379"},
		{env: map[string]string{"REDIS_URL": "redis://:pw@r:1/0", "REDIS_CLUSTER_ADDRS": "a:1,b:2"}, want: "ambiguous"},
		{args: []string{"-redis-cluster", "a:1"}, env: map[string]string{"REDIS_URL": "redis://r:1/0"}, want: "ambiguous"},
		{args: []string{"-redis", "redis://r:1/0", "-redis-cluster", "a:1"}, want: "ambiguous"},
		{env: map[string]string{"REDIS_CLUSTER_ADDRS": "redis://a:1/3"}, want: "only db 0"},
		{args: []string{"-redis-cluster", "a:1,redis://b:2"}, want: "mixes URLs"},
	} {
		_, err := parseSettings(tc.args, envOf(tc.env), io.Discard)
		var usage *UsageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "-h") ||
			strings.Contains(err.Error(), ":pw@") {
			t.Errorf("%v %v: error %v, want a *UsageError mentioning %q and -h", tc.args, tc.env, err, tc.want)
		}
	}
	var out strings.Builder
	if _, err := parseSettings([]string{"-h"}, envOf(nil), &out); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: error %v, want flag.ErrHelp", err)
	}
	for _, name := range []string{"-redis", "-redis-cluster", "-prefix", "-queue", "-concurrency", "-lock-expiry", "-shutdown-timeout", "-log-level", "-sweep-interval", "-stale-after", "REDIS_URL", "REDIS_CLUSTER_ADDRS"} {
		if !strings.Contains(out.String(), name) {
			t.Errorf("-h does not mention %s:\n%s", name, out.String())
		}
	}
}

// -queue-shards and GOREACTOR_QUEUE_SHARDS: 1 by default, the flag over
// the variable, 0, negative, above 64 and non-integers refused naming the
// setting; the worker serves the shards of its first queue.
func TestParseSettingsQueueShards(t *testing.T) {
	t.Parallel()
	cfg, err := parseSettings(nil, envOf(nil), io.Discard)
	if err != nil || cfg.shards != 1 {
		t.Fatalf("default: %d shards, err %v", cfg.shards, err)
	}
	cfg, err = parseSettings(nil, envOf(map[string]string{"GOREACTOR_QUEUE_SHARDS": "3"}), io.Discard)
	if err != nil || cfg.shards != 3 {
		t.Fatalf("env: %d shards, err %v", cfg.shards, err)
	}
	cfg, err = parseSettings([]string{"-queue-shards", "8"}, envOf(map[string]string{"GOREACTOR_QUEUE_SHARDS": "3"}), io.Discard)
	if err != nil || cfg.shards != 8 {
		t.Fatalf("flag over env: %d shards, err %v", cfg.shards, err)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"-queue-shards", "0"}, want: "-queue-shards (GOREACTOR_QUEUE_SHARDS): 0 shards: must be at least 1"},
		{args: []string{"-queue-shards", "-2"}, want: "must be at least 1"},
		{args: []string{"-queue-shards", "65"}, want: "65 shards: at most 64"},
		{args: []string{"-queue-shards", "x"}, want: "queue-shards"},
		{env: map[string]string{"GOREACTOR_QUEUE_SHARDS": "many"}, want: "GOREACTOR_QUEUE_SHARDS=\"many\": not an integer"},
		{env: map[string]string{"GOREACTOR_QUEUE_SHARDS": "0"}, want: "GOREACTOR_QUEUE_SHARDS): 0 shards"},
	} {
		_, err := parseSettings(tc.args, envOf(tc.env), io.Discard)
		var usage *UsageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: error %v, want a *UsageError mentioning %q", tc.args, tc.env, err, tc.want)
		}
	}
}
