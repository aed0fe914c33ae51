package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// env is one test's engine (with a worker on its own queue), dashboard and
// HTTP server, on the shared Redis under a prefix of its own.
type env struct {
	t      testing.TB
	rdb    redis.UniversalClient
	prefix string
	queue  string
	ctl    string // the dashboard's control queue
	engine *reactor.Engine
	dash   *dashboard.Handler
	srv    *httptest.Server
	// workers are the workers started for the test (stopWorkers).
	workers []*worker.Worker
}

func newEnv(t *testing.T, token string) *env { return newTBEnv(t, token) }

// newBenchEnv is newEnv for a benchmark (no token).
func newBenchEnv(b *testing.B) *env { return newTBEnv(b, "") }

func newTBEnv(t testing.TB, token string) *env {
	t.Helper()
	return newTBEnvOn(t, redistest.Client(t), token)
}

// newTBEnvOn is newTBEnv on the Redis of rdb.
func newTBEnvOn(t testing.TB, rdb redis.UniversalClient, token string) *env {
	t.Helper()
	prefix, queue, ctl := redistest.Prefix(t), redistest.Queue(t), redistest.Queue(t)
	engine, err := reactor.NewEngine(context.Background(), reactor.Config{Client: rdb, Prefix: prefix,
		Enqueuer: worker.NewClient(rdb, queue), Logger: discard})
	require.NoError(t, err)
	// Runs enqueued record the queue, so the actions on them go there;
	// the dashboard's control queue gets only the actions on runs that
	// recorded none (in-process runs), and only a test that wants those
	// carried out serves it (startControlWorker).
	dash, err := dashboard.New(dashboard.Config{Client: rdb, Prefix: prefix, Token: token, Queues: []string{queue},
		ControlQueue: ctl, Logger: discard})
	require.NoError(t, err)
	srv := httptest.NewServer(dash)
	t.Cleanup(srv.Close)
	return &env{t: t, rdb: rdb, prefix: prefix, queue: queue, ctl: ctl, engine: engine, dash: dash, srv: srv}
}

// startWorker runs a worker for the env's engine until the test ends.
func (e *env) startWorker(defs ...*reactor.Definition) {
	e.t.Helper()
	e.serve(map[string]int{e.queue: 1}, defs...)
}

// startControlWorker is startWorker serving the dashboard's control queue
// too: the actions are carried out.
func (e *env) startControlWorker(defs ...*reactor.Definition) {
	e.t.Helper()
	e.serve(map[string]int{e.queue: 1, e.ctl: 1}, defs...)
}

func (e *env) serve(queues map[string]int, defs ...*reactor.Definition) {
	e.t.Helper()
	require.NoError(e.t, e.engine.Register(defs...))
	w := worker.New(e.engine, e.rdb, worker.Config{Queues: queues, ShutdownTimeout: 5 * time.Second,
		Logger: discard, Concurrency: 4})
	require.NoError(e.t, w.Start(context.Background()))
	e.workers = append(e.workers, w)
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			e.t.Errorf("worker stop: %v", err)
		}
	})
}

// stopWorkers stops the workers started so far: from now on nothing
// carries out the actions, which stay queued, and asynq's server registry
// no longer lists the workers' queues as served.
func (e *env) stopWorkers() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, w := range e.workers {
		require.NoError(e.t, w.Stop(ctx))
	}
}

// waitIndexed waits until finished run id is listed under status: Wait
// returns on the terminal state write, and the worker moves the run's index
// entries (idx:status:<s>, idx:rs:<reactor>:<s>) only after it, so a listing
// by status read right after Wait can miss the run. The signal is the run
// leaving the active index, the last command of the pipeline that moves
// them (store.QueueMarkStatus); the status entry is checked as well.
func (e *env) waitIndexed(ctx context.Context, id string, status reactor.Status) {
	e.t.Helper()
	k := keys.New(e.prefix)
	for {
		var listed, active *redis.FloatCmd
		_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			listed = p.ZScore(ctx, k.Status(string(status)), id)
			active = p.ZScore(ctx, k.Active(), id)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			require.NoError(e.t, err, "run %s: waiting for its %s index entry", id, status)
		}
		if listed.Err() == nil && errors.Is(active.Err(), redis.Nil) {
			return
		}
		select {
		case <-ctx.Done():
			e.t.Fatalf("run %s: not indexed as %s (listed: %v, still active: %v): %v",
				id, status, listed.Err(), active.Err(), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

type response struct {
	code   int
	header http.Header
	body   []byte
}

func (e *env) do(method, path, token, body string) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	require.NoError(e.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	return response{code: res.StatusCode, header: res.Header, body: b}
}

// get GETs path, requires code, and decodes the JSON body into out.
func (e *env) get(path string, code int, out any) response {
	e.t.Helper()
	res := e.do(http.MethodGet, path, "", "")
	require.Equal(e.t, code, res.code, "GET %s: %s", path, res.body)
	require.Equal(e.t, "application/json", res.header.Get("Content-Type"))
	if out != nil {
		require.NoError(e.t, json.Unmarshal(res.body, out), "%s", res.body)
	}
	return res
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// The API's JSON shapes, as a client decodes them.
type runSummary struct {
	ID        string `json:"id"`
	Reactor   string `json:"reactor"`
	Status    string `json:"status"`
	CreatedAt string `json:"created_at"`
	UpdatedAt string `json:"updated_at"`
	ElapsedMS int64  `json:"elapsed_ms"`
	Failure   *struct {
		Step    string `json:"step"`
		Message string `json:"message"`
	} `json:"failure"`
}

type runList struct {
	Runs       []runSummary `json:"runs"`
	NextCursor string       `json:"next_cursor"`
}

type progress struct {
	Total       int `json:"total"`
	Settled     int `json:"settled"`
	Outstanding int `json:"outstanding"`
	Failed      int `json:"failed"`
}

type runDetail struct {
	runSummary
	Inputs     map[string]any            `json:"inputs"`
	Value      any                       `json:"value"`
	Definition reactor.DefinitionVersion `json:"definition"`
	Waiting    string                    `json:"waiting"`
	WaitingFor *reactor.DefinitionWait   `json:"waiting_for"`
	Failure    *struct {
		Step             string `json:"step"`
		Message          string `json:"message"`
		Stack            string `json:"stack"`
		RollbackFailures []struct {
			Step, Kind, Message string
		} `json:"rollback_failures"`
	} `json:"failure"`
	Steps []struct {
		Name       string `json:"name"`
		Status     string `json:"status"`
		Attempts   int    `json:"attempts"`
		StartedAt  string `json:"started_at"`
		FinishedAt string `json:"finished_at"`
		DurationMS int64  `json:"duration_ms"`
		Result     any    `json:"result"`
		Error      string `json:"error"`
	} `json:"steps"`
	Children []struct {
		Step, Reactor, Status string
		RunID                 string `json:"run_id"`
	} `json:"children"`
	Maps []struct {
		Step       string `json:"step"`
		MapID      string `json:"map_id"`
		Mode       string `json:"mode"`
		Total      int    `json:"total"`
		Dispatched int    `json:"dispatched"`
		Settled    int    `json:"settled"`
		Failed     int    `json:"failed"`
		Rollback   *struct {
			Generation int `json:"generation"`
			progress
		} `json:"rollback"`
	} `json:"maps"`
	Rollback  *progress `json:"rollback"`
	Rollbacks []struct {
		Step, Status, Kind, Reason, Message, At string
	} `json:"rollbacks"`
	RetryOf   string   `json:"retry_of"`
	RetriedBy []string `json:"retried_by"`
}

type cell struct {
	From        int `json:"from"`
	To          int `json:"to"`
	Pending     int `json:"pending"`
	Running     int `json:"running"`
	Completed   int `json:"completed"`
	Failed      int `json:"failed"`
	Undone      int `json:"undone"`
	UndoFailed  int `json:"undo_failed"`
	Unavailable int `json:"unavailable"`
}

func (c cell) sum() int {
	return c.Pending + c.Running + c.Completed + c.Failed + c.Undone + c.UndoFailed + c.Unavailable
}

type elementsPage struct {
	MapID    string `json:"map_id"`
	Total    int    `json:"total"`
	From     int    `json:"from"`
	NextFrom int    `json:"next_from"`
	Elements []struct {
		Index           int    `json:"index"`
		State           string `json:"state"`
		Error           string `json:"error"`
		RollbackOutcome string `json:"rollback_outcome"`
	} `json:"elements"`
	Summary struct {
		BucketSize int    `json:"bucket_size"`
		Cells      []cell `json:"cells"`
	} `json:"summary"`
}
