package worker_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/redisurl"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

const (
	// acceptItems is the size of TestClusterAcceptance10k's map.
	acceptItems = 10_000
	// acceptBatch is its batch size, mapstep's default.
	acceptBatch = mapstep.DefaultBatchSize
	// acceptMigrateBatch is how many keys one MIGRATE of its slot moves:
	// the map's slot holds an element state per started element, thousands
	// by the time it moves, which migrateSlot's 5 would take minutes over.
	acceptMigrateBatch = 100
	// acceptRedone bounds how many elements may be undone twice, the bound
	// of TestClusterFailoverMidRollback: twice the batch size.
	acceptRedone = 2 * acceptBatch
)

// The acceptance of issue 24: a 10,000-element fan-out map with rollback
// on a Redis Cluster of three masters with a replica each, on the
// binaries' cluster client, during which the map's slot is migrated to
// another master (forward) and that master, which then holds the map and
// its element runs, is killed and its replica promoted (rollback). The
// owner ends failed, every element ran once and was undone (twice for at
// most acceptRedone of them), nothing is left applied. It logs the phases'
// times, each master's keys and the commands each node served.
//
// A map's element runs live in its map's slot (P:{map:<id>}:el:<i>:*, so
// that an element's terminal write and its map's settle are one script):
// they are on one master at a time, the map's. Over the run they are on
// the map's first master, then on the one the slot moved to, then on its
// promoted replica; the queue, the owner and the indexes keep the third
// master busy.
//
// Heavy (a few minutes on 2 cores): run with GOREACTOR_ACCEPT=1, or make
// accept-cluster.
func TestClusterAcceptance10k(t *testing.T) {
	if os.Getenv("GOREACTOR_ACCEPT") != "1" {
		t.Skip("the 10,000-element cluster acceptance: set GOREACTOR_ACCEPT=1 (make accept-cluster)")
	}
	cl := redistest.NewCluster(t, redistest.ClusterConfig{Replicas: 1, NodeTimeout: time.Second})
	ep, err := redisurl.Target{Cluster: strings.Join(cl.Addrs, ",")}.Parse()
	require.NoError(t, err)
	cc := ep.NewClient(redisurl.Pool{}).(*redis.ClusterClient)
	t.Cleanup(func() {
		_ = cc.Close()
		waitDialProbes(t)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	masters := cl.Masters()
	masterOf := func(key string) string {
		t.Helper()
		m, err := cc.MasterForKey(ctx, key)
		require.NoError(t, err)
		return m.Options().Addr
	}
	next := func(addr string) string { return masters[(slices.Index(masters, addr)+1)%len(masters)] }

	// Three masters, three parts: the map starts on A and moves to B (the
	// next master, as moveSlot moves it), B is killed; the queue is on C;
	// the owner run is on A or C. The run id is chosen so.
	queueMaster := masterOf("asynq:{" + queue + "}:pending")
	var runID, mapID, metaKey, a, b string
	for i := 0; b == ""; i++ {
		runID = "accept-" + strconv.Itoa(i)
		mapID = mapstep.MapID(runID, "each")
		metaKey = prefix + ":{map:" + mapID + "}:meta"
		src := masterOf(metaKey)
		if src != queueMaster && next(src) != queueMaster && masterOf(prefix+":{run:"+runID+"}:ctx") != next(src) {
			a, b = src, next(src)
		}
	}
	c := queueMaster
	slot := redistest.Slot(metaKey)
	// The counts live on A, in a slot that neither moves nor fails.
	var counts string
	for i := 0; counts == ""; i++ {
		if k := prefix + ":{counts" + strconv.Itoa(i) + "}"; masterOf(k) == a && redistest.Slot(k) != slot {
			counts = k
		}
	}
	require.Len(t, cl.ReplicasOf(b), 1)
	b2 := cl.ReplicasOf(b)[0]
	names := map[string]string{a: "A (map, first)", b: "B (map, moved to; killed)", c: "C (queue)", b2: "B' (B's replica, promoted)"}

	// The elements count their runs and undos per element and in total;
	// the totals' crossings are the test's signals.
	var (
		mu                        sync.Mutex
		forwardDone, rollbackFrom time.Time
		migrateNow                = make(chan struct{})
		killNow                   = make(chan struct{})
		migrateOnce, killOnce     sync.Once
	)
	count := func(ctx context.Context, what string, n int) error {
		ctx = context.WithoutCancel(ctx)
		var total *redis.IntCmd
		_, err := cc.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.HIncrBy(ctx, counts, what+":"+strconv.Itoa(n), 1)
			total = p.HIncrBy(ctx, counts, "total:"+what, 1)
			return nil
		})
		if err != nil {
			return err
		}
		now, tot := time.Now(), int(total.Val())
		switch what {
		case "ran":
			if tot >= acceptItems/4 {
				migrateOnce.Do(func() { close(migrateNow) })
			}
			if tot == acceptItems {
				mu.Lock()
				forwardDone = now
				mu.Unlock()
			}
		case "undone":
			if tot == 1 {
				mu.Lock()
				rollbackFrom = now
				mu.Unlock()
			}
			if tot >= acceptItems/4 {
				killOnce.Do(func() { close(killNow) })
			}
		}
		return nil
	}
	eng, owner, _, _ := startCountedMap(t, ctx, cc, "accept", prefix, queue, acceptItems, acceptBatch, count)

	before := map[string]map[string]int64{}
	for _, addr := range cl.Addrs {
		before[addr], err = commandStats(ctx, addr)
		require.NoError(t, err)
	}
	began := time.Now()
	_, err = eng.Enqueue(ctx, owner, nil, reactor.WithRunID(runID))
	require.NoError(t, err)

	// Forward: once a quarter of the elements ran, the map's slot moves
	// from A to B.
	type migration struct {
		at, done   time.Time
		moved      int
		keysBefore string
		keysAfter  string
		err        error
	}
	migrated := make(chan migration, 1)
	go func() {
		var m migration
		defer func() { migrated <- m }()
		select {
		case <-migrateNow:
		case <-ctx.Done():
			m.err = ctx.Err()
			return
		}
		m.keysBefore = keyCensus(ctx, masters, names, prefix, queue, mapID)
		m.at = time.Now()
		m.moved, m.err = moveSlot(t, ctx, masters, metaKey, slot, acceptMigrateBatch)
		m.done = time.Now()
		m.keysAfter = keyCensus(ctx, masters, names, prefix, queue, mapID)
	}()

	// Rollback: once a quarter of the elements were undone, B (the map's
	// master since the move) is killed and its replica promoted.
	type failover struct {
		killed, promoted time.Time
		keysAtKill       string
		victimStats      map[string]int64
		promotedStats    map[string]int64
		err              error
	}
	failed := make(chan failover, 1)
	go func() {
		var f failover
		defer func() { failed <- f }()
		select {
		case <-killNow:
		case <-ctx.Done():
			f.err = ctx.Err()
			return
		}
		f.keysAtKill = keyCensus(ctx, masters, names, prefix, queue, mapID)
		if f.victimStats, f.err = commandStats(ctx, b); f.err != nil {
			return
		}
		f.killed = time.Now()
		if f.err = cl.Kill(b); f.err != nil {
			return
		}
		// Ready waits for the replica: its link to the dead master is down
		// until it is promoted.
		if f.err = cl.Ready(30 * time.Second); f.err != nil {
			return
		}
		f.promoted = time.Now()
		f.promotedStats, f.err = commandStats(ctx, b2)
	}()

	res, err := eng.Wait(ctx, runID)
	require.NoError(t, err)
	finished := time.Now()
	m, f := <-migrated, <-failed
	require.NoError(t, m.err, "the migration")
	require.NoError(t, f.err, "the failover")
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.Equal(t, "boom", res.Failure.Step)
	require.Empty(t, res.Failure.RollbackFailures)

	mu.Lock()
	fwdDone, rbFrom := forwardDone, rollbackFrom
	mu.Unlock()
	require.False(t, fwdDone.IsZero(), "every element ran")
	require.False(t, rbFrom.IsZero(), "the rollback began")
	require.Positive(t, m.moved, "keys moved")
	require.True(t, m.done.Before(fwdDone), "the slot moved while the map ran forward")
	require.True(t, f.killed.After(rbFrom) && f.killed.Before(finished), "B killed during the rollback")
	info, err := redisInfo(ctx, b2)
	require.NoError(t, err)
	require.Contains(t, info, "role:master", "B's replica, promoted")

	all := cc.HGetAll(ctx, counts).Val()
	redone := 0
	for i := range acceptItems {
		ran, _ := strconv.Atoi(all["ran:"+strconv.Itoa(i)])
		und, _ := strconv.Atoi(all["undone:"+strconv.Itoa(i)])
		// The migration loses nothing, and the failover comes after the
		// map went forward, on checkpoints the replica had long received.
		require.Equal(t, 1, ran, "element %d ran once", i)
		require.GreaterOrEqual(t, und, 1, "element %d undone, not left applied", i)
		if und > 1 {
			redone++
		}
	}
	require.LessOrEqual(t, redone, acceptRedone, "elements undone more than once")

	// Where the element runs were: on A before the move, on B after it
	// and until the kill, on B' (promoted) at the end: three masters, one
	// at a time.
	keysEnd := keyCensus(ctx, []string{a, b2, c}, names, prefix, queue, mapID)
	for _, k := range []struct{ census, node, what string }{
		{m.keysBefore, a, "A before the move"}, {m.keysAfter, b, "B after the move"}, {f.keysAtKill, b, "B at the kill"},
	} {
		require.Positive(t, censusElements(k.census, names[k.node]), "element runs on %s", k.what)
	}
	require.Zero(t, censusElements(m.keysAfter, names[a]), "no element runs left on A after the move")
	require.Positive(t, censusElements(keysEnd, names[b2]), "element runs on B' at the end")

	t.Logf("%d elements, batch %d: slot %d (map %s) moved from A %s to B %s, B killed, B' %s promoted; queue on C %s",
		acceptItems, acceptBatch, slot, mapID, a, b, b2, c)
	t.Logf("forward %s (the move began %s in, at %d run; %d keys in %s, %d a MIGRATE)",
		fwdDone.Sub(began).Round(time.Millisecond), m.at.Sub(began).Round(time.Millisecond), acceptItems/4,
		m.moved, m.done.Sub(m.at).Round(time.Millisecond), acceptMigrateBatch)
	t.Logf("rollback %s (B killed %s in, at %d undone; B' promoted %s after the kill; the run ended %s after the kill)",
		finished.Sub(rbFrom).Round(time.Millisecond), f.killed.Sub(rbFrom).Round(time.Millisecond), acceptItems/4,
		f.promoted.Sub(f.killed).Round(time.Millisecond), finished.Sub(f.killed).Round(time.Millisecond))
	t.Logf("total %s; %d elements undone twice (bound %d)", finished.Sub(began).Round(time.Millisecond), redone, acceptRedone)
	t.Logf("keys before the move:\n%s", m.keysBefore)
	t.Logf("keys after the move:\n%s", m.keysAfter)
	t.Logf("keys at the kill:\n%s", f.keysAtKill)
	t.Logf("keys at the end:\n%s", keysEnd)

	// Commands: A and C over the whole run, B until its kill, B' from its
	// promotion (its replication stream before that is B's work again).
	after := map[string]map[string]int64{}
	for _, addr := range []string{a, c, b2} {
		after[addr], err = commandStats(ctx, addr)
		require.NoError(t, err)
	}
	var lines []string
	for _, d := range []struct {
		node     string
		from, to map[string]int64
	}{
		{a, before[a], after[a]}, {b, before[b], f.victimStats}, {b2, f.promotedStats, after[b2]}, {c, before[c], after[c]},
	} {
		lines = append(lines, names[d.node]+" "+d.node+": "+topCommands(d.from, d.to, 6))
	}
	ranTotal, _ := strconv.Atoi(all["total:ran"])
	undoneTotal, _ := strconv.Atoi(all["total:undone"])
	t.Logf("commands per node (scripts' own calls included; A's hincrby counts the test's own %d):\n%s",
		2*(ranTotal+undoneTotal), strings.Join(lines, "\n"))
}

// commandStats returns the calls of each command node addr has served
// (INFO commandstats).
func commandStats(ctx context.Context, addr string) (map[string]int64, error) {
	n := redis.NewClient(&redis.Options{Addr: addr})
	defer n.Close()
	info, err := n.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats on %s: %w", addr, err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				out[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return out, nil
}

// topCommands formats the total of the calls from to to and the top
// commands among them.
func topCommands(from, to map[string]int64, top int) string {
	type cmd struct {
		name  string
		calls int64
	}
	var cmds []cmd
	var total int64
	for name, n := range to {
		if d := n - from[name]; d > 0 {
			cmds = append(cmds, cmd{name, d})
			total += d
		}
	}
	slices.SortFunc(cmds, func(x, y cmd) int { return int(y.calls - x.calls) })
	parts := []string{fmt.Sprintf("%d calls", total)}
	for _, c := range cmds[:min(top, len(cmds))] {
		parts = append(parts, fmt.Sprintf("%s %d", c.name, c.calls))
	}
	return strings.Join(parts, ", ")
}

// keyCensus counts each node's keys (DBSIZE) and the test's among them by
// kind: the map's element runs, the map's other keys, runs, the queue's
// (asynq) and the rest (indexes, counts). One line per node, in the order
// given, named by names; a node that does not answer says why.
func keyCensus(ctx context.Context, addrs []string, names map[string]string, prefix, queue, mapID string) string {
	var lines []string
	for _, addr := range addrs {
		n := redis.NewClient(&redis.Options{Addr: addr})
		kinds := map[string]int{}
		size, err := n.DBSize(ctx).Result()
		for _, pattern := range []string{prefix + ":*", "asynq:{" + queue + "}*"} {
			if err != nil {
				break
			}
			iter := n.Scan(ctx, 0, pattern, 1000).Iterator()
			for iter.Next(ctx) {
				switch k := iter.Val(); {
				case strings.HasPrefix(k, "asynq:"):
					kinds["asynq"]++
				case strings.Contains(k, "{map:"+mapID+"}:el:"):
					kinds["elements"]++
				case strings.Contains(k, "{map:"):
					kinds["map"]++
				case strings.Contains(k, "{run:"):
					kinds["runs"]++
				default:
					kinds["other"]++
				}
			}
			err = iter.Err()
		}
		_ = n.Close()
		if err != nil {
			lines = append(lines, fmt.Sprintf("%s: %v", names[addr], err))
			continue
		}
		lines = append(lines, fmt.Sprintf("%s: elements=%d map=%d runs=%d asynq=%d other=%d dbsize=%d",
			names[addr], kinds["elements"], kinds["map"], kinds["runs"], kinds["asynq"], kinds["other"], size))
	}
	return strings.Join(lines, "\n")
}

// censusElements returns the element runs keyCensus counted on node name.
func censusElements(census, name string) int {
	for _, line := range strings.Split(census, "\n") {
		if rest, ok := strings.CutPrefix(line, name+": elements="); ok {
			n, _ := strconv.Atoi(strings.Fields(rest)[0])
			return n
		}
	}
	return 0
}
