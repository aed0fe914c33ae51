package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
)

// A -once pass on a Redis Cluster named by -redis-cluster wakes the runs
// whose wake-ups were lost, whichever master holds each, and enqueues
// their wake-ups on the cluster.
func TestOnceOnACluster(t *testing.T) {
	addrs := redistest.StartCluster(t)
	ctx := t.Context()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer rdb.Close()
	prefix, queue := "sw", "sw-q"
	api, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: dropEnqueuer{},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	def := reactor.MustDefine("cluster-lost", reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "a", nil },
	}))
	srv, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	hourAgo := srv.Add(-time.Hour).UnixMilli()
	k := keys.New(prefix)
	const lost = 6 // runs on every master, most likely
	for range lost {
		res, err := api.Enqueue(ctx, def, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZAdd(ctx, k.Active(), redis.Z{Score: float64(hourAgo), Member: res.RunID}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.HSet(ctx, k.RunState(res.RunID), "at", hourAgo).Err(); err != nil {
			t.Fatal(err)
		}
	}

	var out bytes.Buffer
	args := []string{"-once", "-redis-cluster", strings.Join(addrs, ","), "-prefix", prefix, "-queue", queue, "-stale-after", "1s"}
	if code := run(args, envOf(nil), io.Discard, &out); code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, out.String())
	}
	if m := passLine(t, out.String()); m == nil || m["runs_woken"] != float64(lost) {
		t.Fatalf("the pass did not wake %d runs:\n%s", lost, out.String())
	}
	if !strings.Contains(out.String(), `"cluster":true`) {
		t.Errorf("the start line does not say cluster:\n%s", out.String())
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)
	defer insp.Close()
	info, err := insp.GetQueueInfo(queue)
	if err != nil {
		t.Fatal(err)
	}
	if info.Pending != lost {
		t.Errorf("%d wake-ups pending on the cluster, want %d", info.Pending, lost)
	}
}

// A URL and cluster seeds both named is a bad command line, refused
// before anything connects.
func TestURLAndClusterIsAmbiguous(t *testing.T) {
	var out bytes.Buffer
	code := run([]string{"-once", "-redis-cluster", "127.0.0.1:1"}, envOf(map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"}), io.Discard, &out)
	if code != 2 || !strings.Contains(out.String(), "ambiguous") {
		t.Fatalf("exit %d, want 2 and the ambiguity; output:\n%s", code, out.String())
	}
}
