package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ScriptMonitor watches one redis-server with MONITOR and records every
// script call it runs with the commands the script ran (MONITOR shows a
// script's redis.call and redis.pcall commands right after the call, as
// "[0 lua]"), so that a test can check that a script touches only the keys
// its call passed in KEYS (Undeclared). A key a script builds itself is on
// the script's node by luck at best: a cluster routes a call by its KEYS.
//
// MONITOR costs the server a copy of every command: watch a server of the
// test's own (StartServer), for a bounded scenario.
type ScriptMonitor struct {
	t      testing.TB
	addr   string
	conn   net.Conn
	marker string
	done   chan struct{}

	mu   sync.Mutex
	runs []ScriptRun
	err  error
}

// ScriptRun is one script call and what the script ran.
type ScriptRun struct {
	ScriptCall
	// Commands is each command the script ran, as its arguments.
	Commands [][]string
}

// MonitorScripts starts watching the redis-server at addr and returns once
// the server confirmed the MONITOR. Stop ends the watch; t.Cleanup stops it
// too.
func MonitorScripts(t testing.TB, addr string) *ScriptMonitor {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, startTimeout)
	if err != nil {
		t.Fatalf("redistest: MONITOR %s: %v", addr, err)
	}
	r := bufio.NewReaderSize(conn, 1<<20)
	if _, err := io.WriteString(conn, "*1\r\n$7\r\nMONITOR\r\n"); err != nil {
		_ = conn.Close()
		t.Fatalf("redistest: MONITOR %s: %v", addr, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(startTimeout))
	if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != "+OK" {
		_ = conn.Close()
		t.Fatalf("redistest: MONITOR %s: %q %v", addr, line, err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	m := &ScriptMonitor{t: t, addr: addr, conn: conn, marker: "redistest-monitor-end-" + randomHex(), done: make(chan struct{})}
	go m.read(r)
	t.Cleanup(func() { _, _ = m.Stop() })
	return m
}

// read parses MONITOR lines until the marker, an error or the connection's
// close.
func (m *ScriptMonitor) read(r *bufio.Reader) {
	defer close(m.done)
	var cur *ScriptRun
	flush := func() {
		if cur != nil {
			m.mu.Lock()
			m.runs = append(m.runs, *cur)
			m.mu.Unlock()
			cur = nil
		}
	}
	fail := func(err error) {
		m.mu.Lock()
		if m.err == nil {
			m.err = err
		}
		m.mu.Unlock()
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			flush()
			if !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
				fail(err)
			}
			return
		}
		source, args, err := parseMonitorLine(strings.TrimSuffix(line, "\r\n"))
		if err != nil {
			fail(err)
			continue
		}
		if source == "lua" {
			if cur == nil {
				fail(fmt.Errorf("redistest: MONITOR showed a script's command %q after no script call", args))
				continue
			}
			cur.Commands = append(cur.Commands, args)
			continue
		}
		flush()
		if len(args) == 2 && strings.EqualFold(args[0], "echo") && args[1] == m.marker {
			return
		}
		anyArgs := make([]any, len(args))
		for i, a := range args {
			anyArgs[i] = a
		}
		if call, ok := parseScriptCall(anyArgs); ok {
			cur = &ScriptRun{ScriptCall: call}
		}
	}
}

// Stop ends the watch once the server has shown it every command sent
// before the call, and returns the script calls it saw, in the order the
// server ran them. It is idempotent.
func (m *ScriptMonitor) Stop() ([]ScriptRun, error) {
	select {
	case <-m.done:
	default:
		// The marker goes through the server after everything sent before
		// it: once MONITOR shows it, the record is complete.
		_, err := command(m.addr, startTimeout, "ECHO", m.marker)
		if err == nil {
			select {
			case <-m.done:
			case <-time.After(startTimeout):
				err = errors.New("the end marker did not come back")
			}
		}
		_ = m.conn.Close()
		<-m.done
		if err != nil {
			m.mu.Lock()
			if m.err == nil {
				m.err = fmt.Errorf("redistest: ending MONITOR on %s: %w", m.addr, err)
			}
			m.mu.Unlock()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.runs), m.err
}

// Access is a key that a script's command touched and its call did not
// pass in KEYS.
type Access struct {
	// Key is the key, or the shard channel.
	Key string
	// Command is the command that touched it.
	Command []string
	// Channel is set for a shard channel (SPUBLISH) in another slot than
	// the call's keys.
	Channel bool
}

// String describes the access.
func (a Access) String() string {
	what := fmt.Sprintf("key %s (slot %d)", a.Key, Slot(a.Key))
	if a.Channel {
		what = fmt.Sprintf("shard channel %s (slot %d)", a.Key, Slot(a.Key))
	}
	return fmt.Sprintf("%s in %q", what, a.Command)
}

// Undeclared returns what run's commands touched and its call did not pass
// in KEYS; c, a client of the monitored server, says which arguments of a
// command are keys (COMMAND GETKEYS). A shard channel a script publishes on
// (SPUBLISH) is not a key, but a cluster node takes it only in the slot of
// the call's keys: one in another slot is returned too.
func Undeclared(ctx context.Context, c *redis.Client, run ScriptRun) ([]Access, error) {
	declared := map[string]bool{}
	for _, k := range run.Keys {
		declared[k] = true
	}
	var out []Access
	for _, argv := range run.Commands {
		if len(argv) < 2 {
			continue // no argument, no key (and COMMAND GETKEYS refuses it)
		}
		if strings.EqualFold(argv[0], "spublish") {
			if len(run.Keys) > 0 && Slot(argv[1]) != Slot(run.Keys[0]) {
				out = append(out, Access{Key: argv[1], Command: argv, Channel: true})
			}
			continue
		}
		args := make([]any, 0, len(argv)+2)
		args = append(args, "command", "getkeys")
		for _, a := range argv {
			args = append(args, a)
		}
		keys, err := c.Do(ctx, args...).StringSlice()
		if err != nil {
			if strings.Contains(err.Error(), "no key arguments") {
				continue
			}
			return nil, fmt.Errorf("redistest: COMMAND GETKEYS %q: %w", argv, err)
		}
		for _, k := range keys {
			if !declared[k] {
				out = append(out, Access{Key: k, Command: argv})
			}
		}
	}
	return out, nil
}

// parseMonitorLine splits a MONITOR line, `+<time> [<db> <client>] "arg"
// ...`, into its source (the client's address, or "lua" for a script's
// command) and its arguments, unquoted.
func parseMonitorLine(line string) (string, []string, error) {
	rest, ok := strings.CutPrefix(line, "+")
	if !ok {
		return "", nil, fmt.Errorf("redistest: unexpected MONITOR line %q", line)
	}
	_, rest, ok = strings.Cut(rest, " [")
	if !ok {
		return "", nil, fmt.Errorf("redistest: unexpected MONITOR line %q", line)
	}
	who, rest, ok := strings.Cut(rest, "] ")
	if !ok {
		return "", nil, fmt.Errorf("redistest: unexpected MONITOR line %q", line)
	}
	_, source, _ := strings.Cut(who, " ")
	var args []string
	for rest = strings.TrimLeft(rest, " "); rest != ""; rest = strings.TrimLeft(rest, " ") {
		arg, tail, err := unquote(rest)
		if err != nil {
			return "", nil, fmt.Errorf("redistest: MONITOR line %q: %w", line, err)
		}
		args = append(args, arg)
		rest = tail
	}
	return source, args, nil
}

// unquote reads one argument as MONITOR quotes it (Redis' sdscatrepr:
// "..." with \\, \", \n, \r, \t, \a, \b and \xHH escapes) from the start
// of s and returns it and the rest of s.
func unquote(s string) (string, string, error) {
	if s == "" || s[0] != '"' {
		return "", "", fmt.Errorf("argument not quoted at %q", s)
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			return b.String(), s[i+1:], nil
		case c != '\\':
			b.WriteByte(c)
		case i+1 >= len(s):
			return "", "", errors.New("unterminated escape")
		default:
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'x':
				if i+2 >= len(s) {
					return "", "", errors.New("short \\x escape")
				}
				v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
				if err != nil {
					return "", "", fmt.Errorf("bad \\x escape: %w", err)
				}
				b.WriteByte(byte(v))
				i += 2
			default: // \\ and \"
				b.WriteByte(s[i])
			}
		}
	}
	return "", "", errors.New("unterminated argument")
}
