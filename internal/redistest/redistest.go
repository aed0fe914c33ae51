// Package redistest gives tests a real Redis server.
//
// Tests never talk to a mock: Addr resolves, in order, REDIS_URL, a Redis
// already listening on 127.0.0.1:6379, or a redis-server subprocess started
// once per test binary. Tests that need to kill or restart Redis, or that need
// a Redis Cluster of their own, get dedicated servers from StartServer,
// StartCluster and NewCluster.
//
// With GOREACTOR_TEST_CLUSTER set to the seed addresses of a Redis Cluster
// (comma-separated host:port), the shared Redis is that cluster instead:
// Client hands out a *redis.ClusterClient on it, and the cleanup of Prefix
// and Queue and the leftover check scan every master. make test-cluster
// starts such a cluster (cmd/testcluster) and runs the suites on it.
//
// A test binary that may start the shared server should stop it from TestMain:
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		redistest.Shutdown()
//		os.Exit(code)
//	}
package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// EnvCluster is the environment variable that puts the shared Redis on a
// Redis Cluster: the comma-separated seed addresses (host:port) of its nodes.
const EnvCluster = "GOREACTOR_TEST_CLUSTER"

const (
	defaultAddr  = "127.0.0.1:6379"
	pollInterval = 20 * time.Millisecond
	startTimeout = 10 * time.Second
	cleanupLimit = 10 * time.Second
)

var (
	sharedOnce   sync.Once
	sharedTarget *target
	sharedErr    error

	sharedMu   sync.Mutex
	sharedProc *process
	sharedDir  string
)

// target is the shared Redis: one node, or a cluster.
type target struct {
	// node is one node's options: the shared Redis, or a cluster's first
	// seed.
	node *redis.Options
	// cluster is the cluster's seed addresses; nil on one node.
	cluster []string
}

// client returns a new client for the whole target; the caller closes it.
func (tg *target) client() redis.UniversalClient {
	if tg.cluster != nil {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: tg.cluster})
	}
	return redis.NewClient(tg.nodeOptions())
}

// nodeOptions returns a copy of tg.node that the caller may modify.
func (tg *target) nodeOptions() *redis.Options {
	opts := *tg.node
	if tg.node.TLSConfig != nil {
		opts.TLSConfig = tg.node.TLSConfig.Clone()
	}
	return &opts
}

// Addr returns the address of the Redis that tests share: the one named by
// REDIS_URL if set, else 127.0.0.1:6379 if it answers PING within 500ms, else
// a redis-server subprocess started on a free port for the whole test binary
// (stop it with Shutdown). On a cluster (GOREACTOR_TEST_CLUSTER) it is the
// first seed: a single-node client on it reaches that master's slots only,
// so a test that reads or writes keys takes Client instead. It panics if no
// Redis can be found or started.
func Addr() string {
	return Options().Addr
}

// Options returns go-redis options for the shared Redis (see Addr), including
// the DB, credentials and TLS settings from REDIS_URL when it is set. Each call
// returns a fresh copy that the caller may modify. On a cluster they name its
// first seed (see Addr). It panics if no Redis can be found or started.
func Options() *redis.Options {
	tg, err := resolve()
	if err != nil {
		panic(err)
	}
	return tg.nodeOptions()
}

// ClusterAddrs returns the seed addresses of the cluster the tests share
// (GOREACTOR_TEST_CLUSTER), or nil when they share one node.
func ClusterAddrs() []string {
	return parseSeeds(os.Getenv(EnvCluster))
}

// Client returns a new client for the shared Redis, closed in t.Cleanup: a
// *redis.ClusterClient when the tests share a cluster (GOREACTOR_TEST_CLUSTER),
// else a *redis.Client. It fails the test if no Redis can be found or started.
//
// The client carries a ScriptCheck: a script call through it whose keys
// span several hash slots fails the test in the same cleanup, on one node
// as on a cluster (which would refuse it).
func Client(t testing.TB) redis.UniversalClient {
	t.Helper()
	tg, err := resolve()
	if err != nil {
		t.Fatal(err)
	}
	c := tg.client()
	check := NewScriptCheck()
	c.AddHook(check)
	t.Cleanup(func() {
		// Tests take their client before they start workers, so this
		// runs after those stopped and counts their last calls.
		if err := check.Err(); err != nil {
			t.Error(err)
		}
		_ = c.Close()
	})
	return c
}

// NewClient is Client for an Example function, which has no t.Cleanup: the
// caller closes the client. It panics if no Redis can be found or started.
func NewClient() redis.UniversalClient {
	tg, err := resolve()
	if err != nil {
		panic(err)
	}
	return tg.client()
}

// Shutdown stops the redis-server that Addr started, if any, and removes its
// directory. Call it from TestMain after m.Run. It is safe to call when no
// server was started.
func Shutdown() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedProc != nil {
		sharedProc.kill()
		sharedProc = nil
	}
	if sharedDir != "" {
		_ = os.RemoveAll(sharedDir)
		sharedDir = ""
	}
}

func resolve() (*target, error) {
	sharedOnce.Do(func() { sharedTarget, sharedErr = discover() })
	return sharedTarget, sharedErr
}

// parseSeeds splits a comma-separated address list, dropping blanks.
func parseSeeds(list string) []string {
	var out []string
	for _, a := range strings.Split(list, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func discover() (*target, error) {
	if list := os.Getenv(EnvCluster); list != "" {
		seeds := parseSeeds(list)
		if len(seeds) == 0 {
			return nil, fmt.Errorf("redistest: %s=%q names no address; want comma-separated host:port addresses", EnvCluster, list)
		}
		// One seed must answer as a healthy cluster node: a typo or a
		// cluster that died fails here, not as a MOVED in every test.
		var last error
		for _, addr := range seeds {
			info, err := command(addr, time.Second, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				return &target{node: &redis.Options{Addr: seeds[0]}, cluster: seeds}, nil
			}
			if err == nil {
				err = errors.New("cluster_state is not ok")
			}
			last = fmt.Errorf("%s: %w", addr, err)
		}
		return nil, fmt.Errorf("redistest: no seed of %s=%s is a healthy cluster node (%v);"+
			" start one with go run ./internal/redistest/cmd/testcluster, or unset %s", EnvCluster, list, last, EnvCluster)
	}
	if u := os.Getenv("REDIS_URL"); u != "" {
		opts, err := redis.ParseURL(u)
		if err != nil {
			return nil, fmt.Errorf("redistest: invalid REDIS_URL: %w", err)
		}
		return &target{node: opts}, nil
	}
	if ping(defaultAddr, 500*time.Millisecond) == nil {
		return &target{node: &redis.Options{Addr: defaultAddr}}, nil
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, errors.New("redistest: no Redis answers on " + defaultAddr +
			" and redis-server is not on PATH; install it (apt-get install -y redis-server)" +
			" or set REDIS_URL=redis://host:port/db")
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	var lastErr error
	for range 3 { // a free port can be taken before redis-server binds it
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		p, err := startRedis(dir, port, "--save", "", "--appendonly", "no")
		if err != nil {
			lastErr = err
			continue
		}
		sharedMu.Lock()
		sharedProc, sharedDir = p, dir
		sharedMu.Unlock()
		return &target{node: &redis.Options{Addr: p.addr}}, nil
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

// Main is the TestMain of goreactor's packages: it runs the tests, fails the
// binary if keys or queues of its tests are left in Redis (CheckLeftovers),
// stops the redis-server this package may have started, and fails the binary
// if goroutines leaked (goleak), then exits.
func Main(m *testing.M) {
	code := m.Run()
	if err := CheckLeftovers(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = max(code, 1)
	}
	Shutdown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}
