package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Prefix returns a key prefix unique to this test, of the form
// "grt:<test name>:<8 hex digits>". In t.Cleanup every key of the shared Redis
// that begins with the prefix is deleted (see Queue for when). Main reports
// any key still under it when the tests end.
func Prefix(t testing.TB) string {
	t.Helper()
	prefix := "grt:" + sanitize(t.Name()) + ":" + randomHex()
	tg, err := resolve()
	if err != nil {
		t.Fatal(err)
	}
	handedOut.addPrefix(prefix, false)
	track(t, tg, func(tn *testNames) { tn.prefixes = append(tn.prefixes, prefix) })
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
	tg, err := resolve()
	if err != nil {
		t.Fatal(err)
	}
	handedOut.addQueue(queue)
	track(t, tg, func(tn *testNames) { tn.queues = append(tn.queues, queue) })
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
func track(t testing.TB, tg *target, add func(*testNames)) {
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
		if err := deleteTest(tg, pattern, tn); err != nil {
			t.Errorf("redistest: deleting the keys and queues of %s (%v): %v", t.Name(), slices.Concat(tn.prefixes, tn.queues), err)
		}
	})
}

// deleteTest deletes the keys matching pattern that tn owns, on every
// master of a cluster, then tn's queues' members of asynq:queues, on a client
// of its own under a fresh timeout (the test's context is already cancelled
// when cleanups run).
func deleteTest(tg *target, pattern string, tn *testNames) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupLimit)
	defer cancel()
	c := tg.client()
	defer c.Close()

	keys, err := ScanKeys(ctx, c, pattern)
	if err != nil {
		return err
	}
	mine := keys[:0]
	for _, k := range keys {
		if tn.owns(k) {
			mine = append(mine, k)
		}
	}
	if err := Unlink(ctx, c, mine...); err != nil {
		return err
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
	tg, err := resolve()
	if err != nil {
		return err
	}
	for _, p := range examples {
		if err := deleteMatching(tg, p+"*"); err != nil {
			return fmt.Errorf("redistest: deleting the keys of example prefix %s: %w", p, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupLimit)
	defer cancel()
	c := tg.client()
	defer c.Close()

	var left []string
	for _, pattern := range []string{"grt:*", "asynq:{q-*", "q-*"} {
		keys, err := ScanKeys(ctx, c, pattern)
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

// deleteMatching UNLINKs every key matching pattern, on every master of a
// cluster, on a client of its own under a fresh timeout.
func deleteMatching(tg *target, pattern string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupLimit)
	defer cancel()
	c := tg.client()
	defer c.Close()
	keys, err := ScanKeys(ctx, c, pattern)
	if err != nil {
		return err
	}
	return Unlink(ctx, c, keys...)
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
