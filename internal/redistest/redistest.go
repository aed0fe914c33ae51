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
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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

// Prefix returns a key prefix unique to this test, of the form
// "grt:<test name>:<8 hex digits>". In t.Cleanup every key of the shared Redis
// that begins with the prefix is deleted (see Queue for when). Main reports
// any key still under it when the tests end.
func Prefix(t testing.TB) string {
	t.Helper()
	prefix := "grt:" + sanitize(t.Name()) + ":" + randomHex()
	opts, err := resolve()
	if err != nil {
		t.Fatal(err)
	}
	handedOut.addPrefix(prefix, false)
	track(t, opts, func(tn *testNames) { tn.prefixes = append(tn.prefixes, prefix) })
	return prefix
}

// ExamplePrefix is Prefix for an Example function, which has no t.Cleanup:
// a prefix of the form "grt:Example:<8 hex digits>" whose keys Main deletes
// when the tests end (Examples run after the tests, in the same binary).
func ExamplePrefix() string {
	prefix := "grt:Example:" + randomHex()
	handedOut.addPrefix(prefix, true)
	return prefix
}

// Queue returns an asynq queue name unique to this test, of the form
// "q-<test name>-<8 hex digits>". In t.Cleanup the queue is deleted from the
// shared Redis, and so is every queue whose name begins with it (a queue the
// test derives from it, such as queue+"-ctl"): asynq's keys for it
// ("asynq:{<queue>}:*", its tasks, stats and lease included), its member of
// the "asynq:queues" set, and any key named after it ("<queue>*"). Main
// reports any of these still there when the tests end.
//
// A test's prefixes and queues are deleted together, in one SCAN, by a
// cleanup registered at its first call of Prefix or Queue: it runs after
// every cleanup registered later, so the test's workers have stopped.
//
// asynq's server registry needs no cleanup: a server that stops deletes its
// asynq:servers:{...} and asynq:workers:{...} keys and their members of the
// asynq:servers and asynq:workers sets; a killed one's keys expire within
// seconds of its last heartbeat, and the next Inspector.Servers call (the
// dashboard's) prunes its members.
func Queue(t testing.TB) string {
	t.Helper()
	queue := "q-" + sanitize(t.Name()) + "-" + randomHex()
	opts, err := resolve()
	if err != nil {
		t.Fatal(err)
	}
	handedOut.addQueue(queue)
	track(t, opts, func(tn *testNames) { tn.queues = append(tn.queues, queue) })
	return queue
}

// testNames is what one test's cleanup deletes.
type testNames struct {
	prefixes, queues []string
}

// owns reports whether key belongs to one of tn's prefixes or queues.
func (tn *testNames) owns(key string) bool {
	for _, p := range tn.prefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	for _, q := range tn.queues {
		if strings.HasPrefix(key, "asynq:{"+q) || strings.HasPrefix(key, q) {
			return true
		}
	}
	return false
}

var (
	trackedMu sync.Mutex
	tracked   = map[testing.TB]*testNames{}
)

// track records a name for t's cleanup, registering the cleanup at t's
// first name. (A benchmark's cleanups run after each of its runs: the next
// run registers again.)
func track(t testing.TB, opts *redis.Options, add func(*testNames)) {
	trackedMu.Lock()
	tn, ok := tracked[t]
	if !ok {
		tn = &testNames{}
		tracked[t] = tn
	}
	add(tn)
	trackedMu.Unlock()
	if ok {
		return
	}
	// Every name of the test holds its sanitized name: one SCAN for them all.
	pattern := "*" + sanitize(t.Name()) + "*"
	t.Cleanup(func() {
		trackedMu.Lock()
		delete(tracked, t)
		trackedMu.Unlock()
		if err := deleteTest(opts, pattern, tn); err != nil {
			t.Errorf("redistest: deleting the keys and queues of %s (%v): %v", t.Name(), slices.Concat(tn.prefixes, tn.queues), err)
		}
	})
}

// deleteTest deletes the keys matching pattern that tn owns, then tn's
// queues' members of asynq:queues, on a client of its own under a fresh
// timeout (the test's context is already cancelled when cleanups run).
func deleteTest(opts *redis.Options, pattern string, tn *testNames) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupLimit)
	defer cancel()
	c := redis.NewClient(opts)
	defer c.Close()

	var cursor uint64
	for {
		batch, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return err
		}
		mine := batch[:0]
		for _, k := range batch {
			if tn.owns(k) {
				mine = append(mine, k)
			}
		}
		if len(mine) > 0 {
			if err := c.Unlink(ctx, mine...).Err(); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	for _, q := range tn.queues {
		members, err := scanAll(ctx, c.SScan, "asynq:queues", q+"*")
		if err != nil {
			return err
		}
		if len(members) > 0 {
			if err := c.SRem(ctx, "asynq:queues", toAny(members)...).Err(); err != nil {
				return err
			}
		}
	}
	return nil
}

type scanFunc func(ctx context.Context, key string, cursor uint64, match string, count int64) *redis.ScanCmd

// scanKeys adapts SCAN to scanFunc (its key argument is ignored).
func scanKeys(c *redis.Client) scanFunc {
	return func(ctx context.Context, _ string, cursor uint64, match string, count int64) *redis.ScanCmd {
		return c.Scan(ctx, cursor, match, count)
	}
}

// scanAll returns every element scan finds in key matching pattern.
func scanAll(ctx context.Context, scan scanFunc, key, pattern string) ([]string, error) {
	var out []string
	var cursor uint64
	for {
		batch, next, err := scan(ctx, key, cursor, pattern, 1000).Result()
		if err != nil {
			return nil, err
		}
		out = append(out, batch...)
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// handedOut is every prefix and queue this test binary handed out, for the
// leftover check.
var handedOut names

type names struct {
	mu       sync.Mutex
	prefixes map[string]bool
	queues   map[string]bool
	examples []string
}

func (n *names) addPrefix(prefix string, example bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.prefixes == nil {
		n.prefixes = map[string]bool{}
	}
	n.prefixes[prefix] = true
	if example {
		n.examples = append(n.examples, prefix)
	}
}

func (n *names) addQueue(queue string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.queues == nil {
		n.queues = map[string]bool{}
	}
	n.queues[queue] = true
}

// hexLen is the length of randomHex's result.
const hexLen = 8

// owner returns the handed-out prefix or queue that key (a key, or a member
// of asynq:queues when member is set) belongs to, or "".
func (n *names) owner(key string, member bool) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if rest, ok := strings.CutPrefix(key, "grt:"); ok && !member {
		// "grt:<name>:<hex>...": the name holds no ':'.
		name, tail, ok := strings.Cut(rest, ":")
		if ok && len(tail) >= hexLen && n.prefixes["grt:"+name+":"+tail[:hexLen]] {
			return "grt:" + name + ":" + tail[:hexLen]
		}
		return ""
	}
	q := key
	if !member {
		if inner, ok := strings.CutPrefix(key, "asynq:{"); ok {
			q, _, _ = strings.Cut(inner, "}")
		}
	}
	// "q-<name>-<hex>...": the name may hold '-', so try each one.
	for i := 0; i < len(q); i++ {
		if q[i] == '-' && i+1+hexLen <= len(q) && n.queues[q[:i+1+hexLen]] {
			return q[:i+1+hexLen]
		}
	}
	return ""
}

// leftoverGrace is how long a key may still live to be tolerated by the
// leftover check: a lock or lease written with a short expiry goes on its own.
const leftoverGrace = 30 * time.Second

// CheckLeftovers deletes the keys of the prefixes ExamplePrefix handed out,
// then returns an error listing every key of the shared Redis still under a
// prefix or queue this binary handed out (Prefix, Queue, ExamplePrefix): a
// test whose cleanup missed them, or that wrote after it ran. Keys that
// expire within 30s are not counted. Main calls it after the tests; a
// TestMain of its own calls it after m.Run.
func CheckLeftovers() error {
	handedOut.mu.Lock()
	examples := slices.Clone(handedOut.examples)
	none := len(handedOut.prefixes) == 0 && len(handedOut.queues) == 0
	handedOut.mu.Unlock()
	if none {
		return nil
	}
	opts, err := resolve()
	if err != nil {
		return err
	}
	for _, p := range examples {
		if err := deleteMatching(opts, p+"*"); err != nil {
			return fmt.Errorf("redistest: deleting the keys of example prefix %s: %w", p, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupLimit)
	defer cancel()
	c := redis.NewClient(opts)
	defer c.Close()

	var left []string
	for _, pattern := range []string{"grt:*", "asynq:{q-*", "q-*"} {
		keys, err := scanAll(ctx, scanKeys(c), "", pattern)
		if err != nil {
			return fmt.Errorf("redistest: leftover check: %w", err)
		}
		for _, k := range keys {
			if handedOut.owner(k, false) == "" {
				continue
			}
			ttl, err := c.PTTL(ctx, k).Result()
			if err != nil {
				return fmt.Errorf("redistest: leftover check: %w", err)
			}
			if ttl == -2 || (ttl >= 0 && ttl <= leftoverGrace) { // gone, or going
				continue
			}
			left = append(left, k)
		}
	}
	members, err := scanAll(ctx, c.SScan, "asynq:queues", "q-*")
	if err != nil {
		return fmt.Errorf("redistest: leftover check: %w", err)
	}
	for _, m := range members {
		if handedOut.owner(m, true) != "" {
			left = append(left, "asynq:queues member "+m)
		}
	}
	if len(left) == 0 {
		return nil
	}
	slices.Sort(left)
	const show = 20
	total, more := len(left), ""
	if total > show {
		more = fmt.Sprintf("\n\t... and %d more", total-show)
		left = left[:show]
	}
	return fmt.Errorf("redistest: %d key(s) left in Redis under this binary's test prefixes and queues"+
		" (a cleanup missed them, or something wrote after it ran):\n\t%s%s",
		total, strings.Join(left, "\n\t"), more)
}

// deleteMatching UNLINKs every key matching pattern, on a client of its own
// under a fresh timeout.
func deleteMatching(opts *redis.Options, pattern string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupLimit)
	defer cancel()
	c := redis.NewClient(opts)
	defer c.Close()
	keys, err := scanAll(ctx, scanKeys(c), "", pattern)
	if err != nil || len(keys) == 0 {
		return err
	}
	return c.Unlink(ctx, keys...).Err()
}

// Server is a redis-server dedicated to one test, started by StartServer.
// Its methods must be called from the test's goroutine.
type Server struct {
	// Addr is the server's host:port; it stays the same across Restart.
	Addr string

	t    testing.TB
	dir  string
	port int
	args []string

	mu   sync.Mutex
	proc *process
}

// StartServer starts a redis-server for this test only, on a free port, with
// a t.TempDir() as its working directory, and waits until it answers PING.
// args are appended to the command line (for example "--appendonly", "yes").
// Without args the server keeps no persistence files. The server is killed in
// t.Cleanup. The test is skipped if redis-server is not on PATH.
func StartServer(t testing.TB, args ...string) *Server {
	t.Helper()
	requireBinaries(t, "redis-server")
	s := &Server{
		t:    t,
		dir:  t.TempDir(),
		args: append([]string{"--save", "", "--appendonly", "no"}, args...),
	}
	var err error
	for range 3 { // a free port can be taken before redis-server binds it
		if s.port, err = freePort(); err != nil {
			continue
		}
		if s.proc, err = startRedis(s.dir, s.port, s.args...); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = s.proc.addr
	t.Cleanup(s.Stop)
	return s
}

// Stop kills the server with SIGKILL, as a crash would, and waits for it to
// exit. Data survives only as far as the configured persistence wrote it.
// Stop is a no-op if the server is not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		s.proc.kill()
		s.proc = nil
	}
}

// Restart stops the server if it is running and starts it again on the same
// port, with the same arguments and directory, so persisted data (AOF or RDB)
// is reloaded. It waits until the server answers PING.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := startRedis(s.dir, s.port, s.args...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.proc = p
}

// StartCluster starts a Redis Cluster of three masters without replicas on
// free ports, each node in its own temporary directory, and waits up to 20s
// until every node reports cluster_state:ok. It returns the nodes' addresses;
// the nodes are killed in t.Cleanup. The test is skipped if redis-server or
// redis-cli is not on PATH.
func StartCluster(t testing.TB) []string {
	t.Helper()
	requireBinaries(t, "redis-server", "redis-cli")
	addrs := make([]string, 0, 3)
	for range 3 {
		var (
			p   *process
			err error
		)
		for range 3 { // a free port can be taken before redis-server binds it
			var port int
			if port, err = freePort(); err != nil {
				continue
			}
			p, err = startRedis(t.TempDir(), port,
				"--save", "", "--appendonly", "no",
				"--cluster-enabled", "yes",
				"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", port),
				"--cluster-node-timeout", "5000")
			if err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.kill)
		addrs = append(addrs, p.addr)
	}

	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}

	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range addrs {
		for {
			info, err := command(addr, time.Second, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster node %s not ready after 20s: %q %v", addr, info, err)
			}
			time.Sleep(pollInterval)
		}
	}
	return addrs
}

func requireBinaries(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := exec.LookPath(name); err != nil {
			t.Skipf("redistest: %s not on PATH (apt-get install -y redis-server)", name)
		}
	}
}

// process is a running redis-server.
type process struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// startRedis runs redis-server in dir on port and waits until it answers PING.
func startRedis(dir string, port int, args ...string) (*process, error) {
	logPath := filepath.Join(dir, fmt.Sprintf("redis-%d.log", port))
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	defer logFile.Close() // the child keeps its own descriptor

	argv := append([]string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
	}, args...)
	cmd := exec.Command("redis-server", argv...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redistest: starting redis-server: %w", err)
	}
	p := &process{
		addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		cmd:  cmd,
		done: make(chan struct{}),
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()

	deadline := time.Now().Add(startTimeout)
	for {
		err := ping(p.addr, 200*time.Millisecond)
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("redistest: redis-server on port %d exited early:\n%s", port, readTail(logPath))
		default:
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, fmt.Errorf("redistest: redis-server on port %d not answering after %v: %v\n%s",
				port, startTimeout, err, readTail(logPath))
		}
		time.Sleep(pollInterval)
	}
}

// kill sends SIGKILL and waits for the process to exit. It is idempotent.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// ping checks that addr answers PING with PONG.
func ping(addr string, timeout time.Duration) error {
	reply, err := command(addr, timeout, "PING")
	if err != nil {
		return err
	}
	if reply != "PONG" {
		return fmt.Errorf("unexpected PING reply %q", reply)
	}
	return nil
}

// command sends one command over a fresh connection and returns a simple
// string or bulk string reply. It avoids a go-redis client (and its retries)
// for readiness polling.
func command(addr string, timeout time.Duration, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("unexpected reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	default:
		return "", fmt.Errorf("unexpected reply %q", line)
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// sanitize keeps letters, digits, '_' and '-' (so the result is safe in key
// names and SCAN patterns) and bounds the length.
func sanitize(name string) string {
	b := []byte(name)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			b[i] = '_'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

func randomHex() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

func readTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
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
