package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Child processes (redis-server and the workers) run in process groups of
// their own, so a Ctrl-C at the terminal reaches only the soak, which stops
// them itself; and they get SIGKILL should the soak die without doing so.
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// ---- redis-server ----

// redisServer is the soak's own Redis: append-only with an fsync per write,
// so that every acknowledged write survives a restart, even a kill -9.
type redisServer struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

func (r *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// startRedis starts a redis-server in dir on a free port.
func startRedis(dir string) (*redisServer, error) {
	var err error
	for range 3 { // a free port can be taken before redis-server binds it
		r := &redisServer{dir: dir}
		if r.port, err = freePort(); err != nil {
			continue
		}
		if err = r.start(); err == nil {
			return r, nil
		}
	}
	return nil, err
}

// start runs redis-server on r's port and directory (reloading its
// append-only file) and waits until it answers PING.
func (r *redisServer) start() error {
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--logfile", filepath.Join(r.dir, "redis.log"))
	cmd.Dir = r.dir
	cmd.SysProcAttr = childAttrs()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	r.cmd, r.done = cmd, done
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := ping(r.addr()); err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited at startup:\n%s", r.port, tail(filepath.Join(r.dir, "redis.log")))
		default:
		}
		if time.Now().After(deadline) {
			r.stop(syscall.SIGKILL)
			return fmt.Errorf("redis-server on port %d does not answer:\n%s", r.port, tail(filepath.Join(r.dir, "redis.log")))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends sig (SIGTERM: a clean shutdown that flushes the append-only
// file; SIGKILL: a crash) and waits for the server to exit, killing it after
// 10 s. It is a no-op when the server is not running.
func (r *redisServer) stop(sig syscall.Signal) {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(sig)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	r.cmd = nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ping sends PING over a fresh connection: no client, no retries. A server
// still loading its append-only file answers with an error.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(conn, "*1\r\n$4\r\nPING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// ---- worker processes ----

// workerEnv marks a worker process; its value is the JSON workerSpec.
const workerEnv = "GOREACTOR_SOAK_WORKER"

// workerSpec is what a worker process runs.
type workerSpec struct {
	Addr        string `json:"addr"`
	Concurrency int    `json:"concurrency"`
	Sweep       bool   `json:"sweep"`
	Verbose     bool   `json:"verbose"`
}

// workerProc is a running worker process: this binary in worker mode.
type workerProc struct {
	spec   workerSpec
	cmd    *exec.Cmd
	pid    int
	exited chan struct{}
}

// spawnWorker starts a worker process logging to logPath and waits until it
// says it is ready.
func spawnWorker(ctx context.Context, spec workerSpec, logPath string) (*workerProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	enc, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(enc))
	cmd.Stderr = logFile
	cmd.SysProcAttr = childAttrs()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// Held open for the child's life: it exits when this end closes.
	if _, err := cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &workerProc{spec: spec, cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ready" {
			err = fmt.Errorf("unexpected first line %q", line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		close(w.exited)
	}()
	select {
	case err = <-ready:
	case <-time.After(30 * time.Second):
		err = errors.New("not ready after 30 s")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		w.kill()
		return nil, fmt.Errorf("worker process %d: %w\n%s", w.pid, err, tail(logPath))
	}
	return w, nil
}

// kill sends SIGKILL and waits until the process is gone. It is idempotent.
func (w *workerProc) kill() {
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	<-w.exited
}
