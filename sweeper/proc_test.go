package sweeper_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// A worker subprocess is this test binary run again, entry point
// TestWorkerProcess, with these variables set.
const (
	envWorkerProcess = "GOREACTOR_WORKER_PROCESS" // the definition set, see workerSpec
	envRedisAddr     = "REDIS_ADDR"
	envPrefix        = "PREFIX"
	envQueue         = "QUEUE"
	envMarkerDir     = "MARKER_DIR"
	envConcurrency   = "CONCURRENCY"
)

// workerSpec says what a worker subprocess runs.
type workerSpec struct {
	// set names what the process registers and how its engine is set up:
	// "steps" is killDefinition (TestKilledWorkerRunIsFinishedByTheSweeper),
	// "rbmap" is rbkOwner with its terminal-event hook
	// (TestRbKillWorkerMidMapRollback); "recovery" and "recovery-slow" are
	// recOwner and recSlowOwner under worker.Run with its defaults
	// (recovery_test.go).
	set string
	// concurrency is the worker's; 0 is the worker's default.
	concurrency int
	// logTail bounds how much of the end of the process's output is logged
	// when the test fails; 0 logs all of it.
	logTail int
}

// TestWorkerProcess is the worker subprocess: an engine and a worker on the
// parent test's prefix and queue, running until it is killed. It does nothing
// in a normal test run.
func TestWorkerProcess(t *testing.T) {
	set := os.Getenv(envWorkerProcess)
	if set == "" {
		return
	}
	var rdb redis.UniversalClient
	switch {
	case redistest.ClusterAddrs() != nil, os.Getenv("REDIS_URL") != "":
		// The parent's cluster (GOREACTOR_TEST_CLUSTER is inherited), or
		// REDIS_URL with its DB and credentials.
		rdb = redistest.NewClient()
	default:
		rdb = redis.NewClient(&redis.Options{Addr: os.Getenv(envRedisAddr)})
	}
	defer rdb.Close()
	prefix, queue := os.Getenv(envPrefix), os.Getenv(envQueue)
	concurrency, err := strconv.Atoi(os.Getenv(envConcurrency))
	if err != nil {
		t.Fatal(err)
	}
	cfg := reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: worker.NewClient(rdb, queue)}
	var (
		def   *reactor.Definition
		level slog.Level
	)
	switch set {
	case "steps":
		def, cfg.LockExpiry, level = killDefinition(rdb, prefix), killLockExpiry, slog.LevelDebug
	case "order-v1", "order-v2", "order-both":
		cfg.LockExpiry, level = deployLockExpiry, slog.LevelInfo
		defs := map[string][]*reactor.Definition{"order-v1": {deployOrder(rdb, prefix, 1)}, "order-v2": {deployOrder(rdb, prefix, 2)},
			"order-both": {deployOrder(rdb, prefix, 1), deployOrder(rdb, prefix, 2)}}[set]
		cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
		if err := func() error {
			e, err := reactor.NewEngine(context.Background(), cfg)
			if err != nil {
				return err
			}
			if err := e.Register(defs...); err != nil {
				return err
			}
			return serveUntilKilled(e, rdb, queue, concurrency, cfg.Logger)
		}(); err != nil {
			t.Fatal(err)
		}
		return
	case "recovery", "recovery-slow":
		k := recKeys{prefix}
		def := recOwner(rdb, k)
		if set == "recovery-slow" {
			def = recSlowOwner(rdb, k)
		}
		if err := serveMain(def); err != nil {
			t.Fatal(err)
		}
		return
	case "limit-kill":
		def, level = limitKillDefinition(rdb, prefix, true), slog.LevelError
	case "wave-kill":
		def, cfg.LockExpiry, level = waveKillDefinition(rdb, prefix, true), limitKillLease, slog.LevelError
	case "task-kill":
		def, cfg.LockExpiry, level = taskKillDefinition(rdb, prefix, true), limitKillLease, slog.LevelError
	case "spawn-kill":
		def, cfg.LockExpiry, level = spawnKillDefinition(rdb, prefix), limitKillLease, slog.LevelError
		cfg.Middleware = []reactor.Middleware{spawnThenHang(rdb, prefix)}
	case "ordered-kill":
		def, cfg.LockExpiry, level = orderedKillDefinition(rdb, prefix, true), limitKillLease, slog.LevelError
	case "rbmap":
		k := rbkKeys{prefix}
		def, cfg.LockExpiry, level = rbkOwner(rdb, k), rbkLockExpiry, slog.LevelError
		cfg.Hooks = []reactor.Hook{rbkOwnerFinalHook(rdb, k)}
	default:
		t.Fatalf("unknown worker set %q", set)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	engine, err := reactor.NewEngine(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.Register(def); err != nil {
		t.Fatal(err)
	}
	if err := serveUntilKilled(engine, rdb, queue, concurrency, cfg.Logger); err != nil {
		t.Fatal(err)
	}
}

// serveUntilKilled runs a worker of engine on queue, tells the parent it is
// ready, and returns when the parent goes away or after two minutes.
func serveUntilKilled(engine *reactor.Engine, rdb redis.UniversalClient, queue string, concurrency int, log *slog.Logger) error {
	w := worker.New(engine, rdb, worker.Config{Queues: map[string]int{queue: 1}, Concurrency: concurrency, Logger: log,
		DefinitionSnooze: 100 * time.Millisecond})
	if err := w.Start(context.Background()); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(os.Getenv(envMarkerDir), "ready"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	// Run until killed. Should the parent die first, its end of stdin
	// closes: exit with it rather than linger; and never outlive two
	// minutes.
	parentGone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(parentGone)
	}()
	select {
	case <-parentGone:
		os.Exit(3)
	case <-time.After(2 * time.Minute):
	}
	return w.Stop(context.Background())
}

// workerProcess is a running worker subprocess.
type workerProcess struct {
	t      *testing.T
	cmd    *exec.Cmd
	pid    string
	log    string        // the path of its output
	exited chan struct{} // closed once the process is gone
}

// startWorkerProcess re-runs the test binary as a worker of spec on prefix
// and queue, and waits until its worker has started. The process is killed
// in t.Cleanup if the test has not killed it, and its output is logged if
// the test failed.
func startWorkerProcess(t *testing.T, prefix, queue string, spec workerSpec) *workerProcess {
	t.Helper()
	dir := t.TempDir()
	logPath := filepath.Join(dir, "worker.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	defer logFile.Close() // the child has its own descriptor

	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envWorkerProcess+"="+spec.set,
		envRedisAddr+"="+redistest.Addr(),
		envPrefix+"="+prefix,
		envQueue+"="+queue,
		envMarkerDir+"="+dir,
		envConcurrency+"="+strconv.Itoa(spec.concurrency),
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Held open until the process exits: the child's lifeline.
	_, err = cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &workerProcess{t: t, cmd: cmd, pid: strconv.Itoa(cmd.Process.Pid), log: logPath, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			what := "output"
			if spec.logTail > 0 && len(out) > spec.logTail {
				out, what = out[len(out)-spec.logTail:], "output (tail)"
			}
			t.Logf("worker process %s (%s) %s:\n%s", p.pid, cmd.ProcessState, what, out)
		}
	})
	ready := filepath.Join(dir, "ready")
	require.Eventually(t, func() bool {
		_, err := os.Stat(ready)
		return err == nil || p.gone()
	}, 30*time.Second, 10*time.Millisecond, "the worker process did not start")
	require.False(t, p.gone(), "the worker process exited: %s", cmd.ProcessState)
	return p
}

// output is what the process wrote so far.
func (p *workerProcess) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

func (p *workerProcess) gone() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// await pops the next value of the Redis list key, failing the test if the
// process exits first or nothing comes within limit.
func (p *workerProcess) await(ctx context.Context, rdb redis.UniversalClient, key string, limit time.Duration) string {
	p.t.Helper()
	deadline := time.Now().Add(limit)
	for !p.gone() && time.Now().Before(deadline) {
		got, err := rdb.BLPop(ctx, time.Second, key).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		require.NoError(p.t, err)
		return got[1]
	}
	require.False(p.t, p.gone(), "the worker process exited: %s", p.cmd.ProcessState)
	p.t.Fatalf("nothing on %s after %s", key, limit)
	return ""
}

// kill sends SIGKILL, as a crash would, and waits for the process to be
// gone. It is idempotent.
func (p *workerProcess) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}
