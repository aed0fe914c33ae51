package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// migrateItems is the size of the map TestClusterSlotMigrationMidMap moves.
const migrateItems = 300

// A fan-out map whose slot is migrated to another master while it runs
// forward and while it rolls back finishes correctly: every element run
// once and undone once, the owner failed cleanly, in about the time it
// takes at rest. While the slot moves, Redis refuses the scripts whose
// keys are split between the two nodes (TRYAGAIN) until they are not; the
// client retries them (MaxRedirects), and a lock whose taking was retried
// that long is extended before its holder runs anything (the lock
// package), so nothing is done twice.
func TestClusterSlotMigrationMidMap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	addrs := redistest.StartCluster(t)
	// go-redis retries a refused command (TRYAGAIN, CLUSTERDOWN) itself,
	// MaxRedirects times with a backoff of up to 512 ms: 16 ride out a few
	// seconds of a half-moved slot (its default, 3, under 100 ms).
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: reactor.MinClusterRedirects})
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	counts := prefix + ":counts" // its own slot, which does not move

	count := func(ctx context.Context, what string, n int) error {
		id, _ := asynq.GetTaskID(ctx)
		cc.RPush(context.WithoutCancel(ctx), counts+":log", fmt.Sprintf("%s:%d %s %s", what, n, id, time.Now().Format("15:04:05.000")))
		return cc.HIncrBy(context.WithoutCancel(ctx), counts, what+":"+strconv.Itoa(n), 1).Err()
	}
	eng, owner, client, logs := startCountedMap(t, ctx, cc, "migrate", prefix, queue, migrateItems, 20, count)

	// The same map on a cluster at rest, for the comparison.
	began := time.Now()
	_, err := eng.Enqueue(ctx, owner, nil, reactor.WithRunID("migrate-0"))
	require.NoError(t, err)
	res, err := eng.Wait(ctx, "migrate-0")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	atRest := time.Since(began)
	require.NoError(t, cc.Del(ctx, counts).Err())
	require.NoError(t, cc.Del(ctx, counts+":log").Err())

	const runID = "migrate-1"
	mapID := mapstep.MapID(runID, "each")
	metaKey := prefix + ":{map:" + mapID + "}:meta"
	slot := int(cc.ClusterKeySlot(ctx, metaKey).Val())
	moved := make(chan int, 2)
	var wg sync.WaitGroup
	migrateWhen := func(what string, ready func() bool) {
		wg.Go(func() {
			for !ready() {
				if ctx.Err() != nil {
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
			moved <- migrateSlot(t, ctx, addrs, metaKey, slot)
		})
	}
	progress := func() (fwd, rb int) {
		all := cc.HGetAll(ctx, counts).Val()
		for k := range all {
			if strings.HasPrefix(k, "ran:") {
				fwd++
			} else {
				rb++
			}
		}
		return fwd, rb
	}
	// Once while the map runs forward, once while it rolls back.
	migrateWhen("forward", func() bool { f, _ := progress(); return f >= migrateItems/4 })
	began = time.Now()
	_, err = eng.Enqueue(ctx, owner, nil, reactor.WithRunID(runID))
	require.NoError(t, err)
	wg.Wait()
	migrateWhen("rollback", func() bool { _, r := progress(); return r >= migrateItems/4 })

	res, err = eng.Wait(ctx, runID)
	require.NoError(t, err)
	took := time.Since(began)
	wg.Wait()
	close(moved)
	var keysMoved []int
	for n := range moved {
		keysMoved = append(keysMoved, n)
	}
	require.Len(t, keysMoved, 2, "the slot moved twice")
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.Equal(t, "boom", res.Failure.Step)
	require.Empty(t, res.Failure.RollbackFailures)
	all := cc.HGetAll(ctx, counts).Val()
	for i := range migrateItems {
		if all["ran:"+strconv.Itoa(i)] != "1" || all["undone:"+strconv.Itoa(i)] != "1" {
			for _, l := range cc.LRange(ctx, counts+":log", 0, -1).Val() {
				if strings.Contains(l, ":"+strconv.Itoa(i)+" ") {
					t.Log(l)
				}
			}
		}
		require.Equal(t, "1", all["ran:"+strconv.Itoa(i)], "element %d ran once", i)
		require.Equal(t, "1", all["undone:"+strconv.Itoa(i)], "element %d undone once", i)
	}
	t.Logf("%d elements forward and back: %s at rest, %s with slot %d moved twice (%v keys each time)",
		migrateItems, atRest.Round(time.Millisecond), took.Round(time.Millisecond), slot, keysMoved)

	// An engine on a ClusterClient with go-redis's default MaxRedirects
	// says what to set.
	var warned syncBuffer
	plain := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = plain.Close() })
	_, err = reactor.NewEngine(ctx, reactor.Config{Client: plain, Prefix: prefix, Enqueuer: client,
		Logger: slog.New(slog.NewTextHandler(&warned, nil))})
	require.NoError(t, err)
	require.Contains(t, warned.String(), "event=reactor.engine.cluster_redirects")
	require.Contains(t, warned.String(), "MaxRedirects to at least "+strconv.Itoa(reactor.MinClusterRedirects))
	require.NotContains(t, logs.String(), "cluster_redirects", "none for the client with enough")
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type migrateIn struct {
	N int `json:"n"`
}

// migrateSlot moves slot (key's) from the master that serves it to the
// next one, 5 keys at a time: slowly enough that scripts meet the slot half
// moved (see moveSlot). It returns the keys it moved.
func migrateSlot(t *testing.T, ctx context.Context, addrs []string, key string, slot int) int {
	t.Helper()
	moved, err := moveSlot(t, ctx, addrs, key, slot, 5)
	require.NoError(t, err)
	return moved
}

// moveSlot moves slot (key's) from the master of addrs (masters only) that
// serves it to the next one in addrs, the way redis-cli --cluster reshard
// does: SETSLOT IMPORTING/MIGRATING, MIGRATE batch keys at a time with a
// pause between batches (a slot moving, not one that jumps), SETSLOT NODE
// everywhere. It returns the keys it moved. It reports failures as errors,
// not through t, so that it can run on a goroutine of its own.
func moveSlot(t *testing.T, ctx context.Context, addrs []string, key string, slot, batch int) (int, error) {
	t.Helper()
	nodes := make([]*redis.Client, len(addrs))
	ids := make([]string, len(addrs))
	src := -1
	for i, a := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: a})
		defer nodes[i].Close()
		id, err := nodes[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return 0, fmt.Errorf("CLUSTER MYID on %s: %w", a, err)
		}
		ids[i] = id
	}
	for i, n := range nodes {
		// The master that serves the slot answers for a key of it; the
		// others answer MOVED.
		if err := n.Exists(ctx, key).Err(); err == nil {
			src = i
		}
	}
	if src < 0 {
		return 0, fmt.Errorf("no master of %v serves slot %d", addrs, slot)
	}
	dst := (src + 1) % len(nodes)
	host, port, _ := strings.Cut(addrs[dst], ":")
	if err := nodes[dst].Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src]).Err(); err != nil {
		return 0, fmt.Errorf("SETSLOT IMPORTING on %s: %w", addrs[dst], err)
	}
	if err := nodes[src].Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst]).Err(); err != nil {
		return 0, fmt.Errorf("SETSLOT MIGRATING on %s: %w", addrs[src], err)
	}
	moved := 0
	for {
		ks, err := nodes[src].ClusterGetKeysInSlot(ctx, slot, batch).Result()
		if err != nil {
			return moved, fmt.Errorf("GETKEYSINSLOT on %s: %w", addrs[src], err)
		}
		if len(ks) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range ks {
			args = append(args, k)
		}
		if err := nodes[src].Do(ctx, args...).Err(); err != nil && !strings.Contains(err.Error(), "NOKEY") {
			return moved, fmt.Errorf("MIGRATE from %s: %w", addrs[src], err)
		}
		moved += len(ks)
		time.Sleep(20 * time.Millisecond) // a slot moving, not one that jumps
	}
	// The destination first, then the source, then the others, as
	// redis-cli does: the source stops redirecting with ASK only once the
	// destination owns the slot.
	for _, i := range append([]int{dst, src}, others(len(nodes), src, dst)...) {
		if err := nodes[i].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[dst]).Err(); err != nil {
			return moved, fmt.Errorf("SETSLOT NODE on %s: %w", addrs[i], err)
		}
	}
	return moved, nil
}

// others returns the indexes below n other than a and b.
func others(n, a, b int) []int {
	var out []int
	for i := range n {
		if i != a && i != b {
			out = append(out, i)
		}
	}
	return out
}
