package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

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
	dieWithParent(cmd)
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
