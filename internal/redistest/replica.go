package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartReplicated starts a master and one replica of it for this test
// (StartServer), the replica taking DEBUG (for Stall), and returns them
// once the replica is linked and in sync.
func StartReplicated(t testing.TB) (master, replica *Server) {
	t.Helper()
	master = StartServer(t, "--repl-diskless-sync-delay", "0")
	replica = StartServer(t, "--replicaof", strings.Replace(master.Addr, ":", " ", 1), "--enable-debug-command", "yes")
	c := redis.NewClient(&redis.Options{Addr: master.Addr})
	defer func() { _ = c.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online") {
			return master, replica
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: the replica %s did not link to %s within 10s: %v\n%s", replica.Addr, master.Addr, err, info)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Stall makes the server at addr (started with --enable-debug-command yes,
// as StartReplicated's replica is) process nothing, its replication stream
// included, for d (DEBUG SLEEP). It returns once the server stopped
// answering, with a channel closed when it is back.
func Stall(t testing.TB, addr string, d time.Duration) <-chan struct{} {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: d + 5*time.Second})
	probe := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 20 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close(); _ = probe.Close() })
	if err := probe.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redistest: stall %s: %v", addr, err)
	}
	back := make(chan struct{})
	go func() {
		defer close(back)
		_ = c.Do(context.Background(), "DEBUG", "SLEEP", strconv.FormatFloat(d.Seconds(), 'f', 3, 64)).Err()
	}()
	deadline := time.Now().Add(5 * time.Second)
	for probe.Ping(context.Background()).Err() == nil {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s still answers PING 5s after DEBUG SLEEP was sent", addr)
		}
		time.Sleep(time.Millisecond)
	}
	return back
}

// CommandCalls is how many times the server c talks to ran command name
// (lower case), from INFO commandstats.
func CommandCalls(ctx context.Context, c *redis.Client, name string) (int, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "cmdstat_"+name+":calls="); ok {
			if i := strings.IndexByte(v, ','); i >= 0 {
				v = v[:i]
			}
			return strconv.Atoi(v)
		}
	}
	return 0, nil
}
