package worker_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// runWorkerMain, set to 1 in a subprocess's environment, makes this test
// binary run worker.Main with recoveryDefinition (see TestMain).
const runWorkerMain = "GOREACTOR_TEST_RUN_WORKER_MAIN"

// recoveryDefinition is "recovery": prepare -> block. Each execution of
// block adds "start:<pid>" to <prefix>:trace (the prefix is the process's
// GOREACTOR_PREFIX); the first one pushes "blocked:<pid>" to
// <prefix>:signal and blocks until its context ends (it never does: the
// test kills the process), later ones add "end:<pid>" and return.
func recoveryDefinition() *reactor.Definition {
	var (
		once sync.Once
		rdb  redis.UniversalClient
	)
	client := func() redis.UniversalClient {
		once.Do(func() {
			if redistest.ClusterAddrs() != nil {
				rdb = redistest.NewClient() // the test's cluster: GOREACTOR_TEST_CLUSTER is inherited
				return
			}
			opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
			if err != nil {
				panic(err)
			}
			rdb = redis.NewClient(opts)
		})
		return rdb
	}
	prefix := os.Getenv("GOREACTOR_PREFIX")
	return reactor.MustDefine("recovery",
		reactor.Step("prepare", reactor.StepConfig[reactor.Args, bool]{
			Run: func(context.Context, reactor.Args) (bool, error) { return true, nil },
		}),
		reactor.Step("block", reactor.StepConfig[reactor.Args, string]{
			After: []string{"prepare"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				bg, pid := context.WithoutCancel(ctx), strconv.Itoa(os.Getpid())
				n, err := client().RPush(bg, prefix+":trace", "start:"+pid).Result()
				if err != nil {
					return "", err
				}
				if n == 1 {
					if err := client().RPush(bg, prefix+":signal", "blocked:"+pid).Err(); err != nil {
						return "", err
					}
					<-ctx.Done()
					return "", ctx.Err()
				}
				if err := client().RPush(bg, prefix+":trace", "end:"+pid).Err(); err != nil {
					return "", err
				}
				return "done by " + pid, nil
			},
		}),
		reactor.Returns(reactor.FromStep("block")),
	)
}

// workerProcess is a worker.Main subprocess and its output.
type workerProcess struct {
	cmd  *exec.Cmd
	out  *logWatch
	done chan struct{} // closed when the process exited, err set
	err  error
}

// exited waits up to 20 s for the process to exit and returns how.
func (p *workerProcess) exited(t *testing.T) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(20 * time.Second):
		t.Fatalf("worker process %d did not exit", p.cmd.Process.Pid)
		return nil
	}
}

// startWorkerProcess starts worker.Main in a subprocess whose environment
// holds only what a process needs and env: no flag, no other GOREACTOR_*
// variable, so every setting but those is Main's default.
func startWorkerProcess(t *testing.T, env ...string) *workerProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	for _, kv := range os.Environ() {
		// GOREACTOR_TEST_CLUSTER is the tests', not a setting of Main: the
		// steps of the process use it to reach the cluster.
		if !strings.HasPrefix(kv, "REDIS_URL=") && !strings.HasPrefix(kv, "REDIS_CLUSTER_ADDRS=") &&
			(!strings.HasPrefix(kv, "GOREACTOR_") || strings.HasPrefix(kv, redistest.EnvCluster+"=")) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, append(env, runWorkerMain+"=1")...)
	p := &workerProcess{cmd: cmd, out: newLogWatch(), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	require.NoError(t, cmd.Start())
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // a no-op once it exited
		<-p.done
	})
	p.out.await(t, `"event":"worker.started"`)
	return p
}

func (p *workerProcess) pid() string { return strconv.Itoa(p.cmd.Process.Pid) }

// forgetServer removes what a killed asynq server left in asynq's server
// registry (its server and workers entries), which only expiry would
// remove otherwise.
func forgetServer(t *testing.T, rdb redis.UniversalClient, pid string) {
	t.Helper()
	ctx := context.Background()
	for _, set := range []string{"asynq:servers", "asynq:workers"} {
		members, err := rdb.ZRange(ctx, set, 0, -1).Result()
		require.NoError(t, err)
		for _, key := range members {
			// The key is <set>:{<host>:<pid>:<server id>}.
			if !strings.Contains(key, ":"+pid+":") {
				continue
			}
			require.NoError(t, rdb.Del(ctx, key).Err())
			require.NoError(t, rdb.ZRem(ctx, set, key).Err())
		}
	}
}

// The acceptance test of the default recovery: two worker processes started
// with Main's defaults (only the prefix and queue set, through
// GOREACTOR_PREFIX and GOREACTOR_QUEUE) and no sweeper process. The first is
// killed with SIGKILL in the middle of a step; the second, started after the
// kill, finishes the run within 5 s of it: its in-process sweeper wakes the
// run once the dead worker's lock expired.
func TestKilledWorkersRunIsRecoveredByDefault(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	env := []string{redisEnv(), "GOREACTOR_PREFIX=" + prefix, "GOREACTOR_QUEUE=" + queue}
	ctx := ctxTimeout(t)
	api, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Logger: discard,
		Enqueuer: worker.NewClient(rdb, queue)})
	require.NoError(t, err)
	def := recoveryDefinition()

	first := startWorkerProcess(t, env...)
	res, err := api.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	signal, err := rdb.BLPop(ctx, 20*time.Second, prefix+":signal").Result()
	require.NoError(t, err, "the first worker reaches the blocking step")
	require.Equal(t, "blocked:"+first.pid(), signal[1])

	require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
	killedAt := time.Now()
	err = first.exited(t)
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, -1, exit.ExitCode(), "killed by a signal")
	t.Cleanup(func() { forgetServer(t, rdb, first.pid()) })

	second := startWorkerProcess(t, env...)
	wctx, cancel := context.WithDeadline(ctx, killedAt.Add(20*time.Second))
	defer cancel()
	res, err = api.Wait(wctx, res.RunID)
	recovery := time.Since(killedAt)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status, "failure: %v", res.Failure)
	t.Logf("run %s completed %s after its worker was killed", res.RunID, recovery.Round(time.Millisecond))
	require.Less(t, recovery, 5*time.Second, "a killed worker's run is recovered within 5 s by default")
	v, err := reactor.ValueOf[string](res)
	require.NoError(t, err)
	require.Equal(t, "done by "+second.pid(), v)
	require.Equal(t, []string{"start:" + first.pid(), "start:" + second.pid(), "end:" + second.pid()},
		rdb.LRange(ctx, prefix+":trace", 0, -1).Val(), "block ran again in the second worker, prepare did not")
	second.out.await(t, `"event":"reactor.sweep.run"`) // woken by the worker's own sweeper

	require.NoError(t, second.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, second.exited(t), "a graceful stop exits 0")
	for _, p := range []*workerProcess{first, second} {
		for _, line := range p.out.all() {
			require.True(t, json.Valid([]byte(line)), "not a JSON line: %s", line)
		}
	}
	started := second.out.await(t, `"event":"worker.started"`)
	for _, want := range []string{`"prefix":"` + prefix + `"`, `"enqueue_queue":"` + queue + `"`, `"lock_expiry":"3s"`,
		`"sweep_interval":"1s"`} {
		require.Contains(t, started, want, "the settings came from the environment and the defaults")
	}
}
