// Package redistest gives tests a real Redis server.
//
// Tests never talk to a mock: Addr resolves, in order, REDIS_URL, a Redis
// already listening on 127.0.0.1:6379, or a redis-server subprocess started
// once per test binary. Tests that need to kill or restart Redis, or that need
// a Redis Cluster, get dedicated servers from StartServer and StartCluster.
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
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

const (
	defaultAddr  = "127.0.0.1:6379"
	pollInterval = 20 * time.Millisecond
	startTimeout = 10 * time.Second
	cleanupLimit = 10 * time.Second
)

var (
	sharedOnce sync.Once
	sharedOpts *redis.Options
	sharedErr  error

	sharedMu   sync.Mutex
	sharedProc *process
	sharedDir  string
)

// Addr returns the address of the Redis that tests share: the one named by
// REDIS_URL if set, else 127.0.0.1:6379 if it answers PING within 500ms, else
// a redis-server subprocess started on a free port for the whole test binary
// (stop it with Shutdown). It panics if no Redis can be found or started.
func Addr() string {
	return Options().Addr
}

// Options returns go-redis options for the shared Redis (see Addr), including
// the DB, credentials and TLS settings from REDIS_URL when it is set. Each call
// returns a fresh copy that the caller may modify. It panics if no Redis can
// be found or started.
func Options() *redis.Options {
	opts, err := resolve()
	if err != nil {
		panic(err)
	}
	return opts
}

// Client returns a new client for the shared Redis, closed in t.Cleanup.
// It fails the test if no Redis can be found or started.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	opts, err := resolve()
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
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

func resolve() (*redis.Options, error) {
	sharedOnce.Do(func() { sharedOpts, sharedErr = discover() })
	if sharedErr != nil {
		return nil, sharedErr
	}
	opts := *sharedOpts
	if sharedOpts.TLSConfig != nil {
		opts.TLSConfig = sharedOpts.TLSConfig.Clone()
	}
	return &opts, nil
}

func discover() (*redis.Options, error) {
	if u := os.Getenv("REDIS_URL"); u != "" {
		opts, err := redis.ParseURL(u)
		if err != nil {
			return nil, fmt.Errorf("redistest: invalid REDIS_URL: %w", err)
		}
		return opts, nil
	}
	if ping(defaultAddr, 500*time.Millisecond) == nil {
		return &redis.Options{Addr: defaultAddr}, nil
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
		return &redis.Options{Addr: p.addr}, nil
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
