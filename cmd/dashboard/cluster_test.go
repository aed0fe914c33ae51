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

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
)

// The dashboard on a Redis Cluster named by -redis-cluster lists the runs
// of every master in /api/runs, reads one, and queues an action's control
// task on the cluster.
func TestServeOnACluster(t *testing.T) {
	t.Parallel()
	addrs := redistest.StartCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	prefix, queue := "db", "db-q"
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer rdb.Close()
	e, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	def := reactor.MustDefine("cluster-shown", reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
		Run:  func(context.Context, reactor.Args) (string, error) { return "a", nil },
		Undo: func(context.Context, reactor.Args, string) error { return nil },
	}))
	ids := map[string]bool{}
	for range 6 { // their keys on every master, most likely
		res, err := e.Run(ctx, def, nil)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCompleted, res.Status)
		ids[res.RunID] = true
	}

	cfg, err := parseConfig([]string{"-addr", "127.0.0.1:0", "-redis-cluster", strings.Join(addrs, ","), "-prefix", prefix, "-queue", queue},
		env(map[string]string{"GOREACTOR_DASHBOARD_TOKEN": "tok"}), io.Discard)
	require.NoError(t, err)
	ready, done := make(chan string, 1), make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	go func() { done <- serve(sctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), ready) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	get := func(path string, into any) {
		t.Helper()
		res, err := http.Get("http://" + addr + path)
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		require.NoError(t, json.NewDecoder(res.Body).Decode(into))
	}

	var list struct {
		Runs []struct{ ID, Status string }
	}
	get("/api/runs", &list)
	listed := map[string]bool{}
	for _, r := range list.Runs {
		require.Equal(t, "completed", r.Status, r.ID)
		listed[r.ID] = true
	}
	require.Equal(t, ids, listed)
	var one struct{ ID, Status string }
	for id := range ids {
		get("/api/runs/"+id, &one)
		require.Equal(t, id, one.ID)
		break
	}
	var st map[string]any
	get("/api/stats", &st)
	require.Contains(t, st, "by_status")

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/api/runs/"+one.ID+"/undo", strings.NewReader(`{"reason":"cluster test"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer tok")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var action struct {
		TaskID string `json:"task_id"`
		Queue  string
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&action))
	res.Body.Close()
	require.Equal(t, http.StatusAccepted, res.StatusCode)
	require.Equal(t, queue, action.Queue)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	defer insp.Close()
	task, err := insp.GetTaskInfo(queue, action.TaskID)
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, task.State)

	stop()
	require.NoError(t, <-done)
}
