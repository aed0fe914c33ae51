package store_test

import (
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/store"
)

// replicated starts a master and its replica (redistest.StartReplicated)
// and returns clients of both.
func replicated(t *testing.T) (master, replica *redis.Client) {
	t.Helper()
	m, r := redistest.StartReplicated(t)
	master, replica = redis.NewClient(&redis.Options{Addr: m.Addr}), redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = master.Close(); _ = replica.Close() })
	return master, replica
}

func stall(t *testing.T, addr string, d time.Duration) <-chan struct{} {
	return redistest.Stall(t, addr, d)
}

type shorts struct {
	mu  sync.Mutex
	got []int
}

func (s *shorts) record(got int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, got)
}

func (s *shorts) all() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.got...)
}

// With Acks, a checkpoint returns only once the replica has it: written
// while the replica is stalled, it waits for the replica to be back. The
// same write without Acks returns at once. And a wait that times out
// leaves the write standing and tells Short how many replicas had it.
func TestWriteWaitsForItsReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two redis-servers")
	}
	t.Parallel()
	ctx := t.Context()
	mc, rc := replicated(t)
	k := keys.New("acks")
	plain, err := store.New(ctx, mc, k)
	require.NoError(t, err)
	acked, err := store.New(ctx, mc, k)
	require.NoError(t, err)
	var sh shorts
	require.NoError(t, acked.SetAcks(ctx, &store.Acks{Replicas: 1, Timeout: 10 * time.Second, Short: sh.record}))

	create := func(s *store.Store, id string) store.Target {
		tg := s.RunTarget(id)
		require.NoError(t, mc.Set(ctx, tg.Lock, "tok", time.Hour).Err())
		_, created, err := s.Create(ctx, tg, "tok", []byte("one"))
		require.NoError(t, err)
		require.True(t, created)
		return tg
	}
	a, p := create(acked, "a"), create(plain, "p")
	const pause = time.Second

	// Without Acks: the write returns while the replica is still stalled.
	back := stall(t, rc.Options().Addr, pause)
	_, err = plain.Write(ctx, p, "tok", 1, []byte("two"), store.WriteOptions{})
	require.NoError(t, err)
	select {
	case <-back:
		t.Fatal("the replica came back before a write that does not wait returned")
	default:
	}
	<-back

	// With Acks: it returns after the replica is back, and has it then.
	back = stall(t, rc.Options().Addr, pause)
	res, err := acked.Write(ctx, a, "tok", 1, []byte("two"), store.WriteOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(2), res.Version)
	select {
	case <-back:
	case <-time.After(pause):
		t.Fatal("a write with Acks returned while its replica was stalled")
	}
	v, err := rc.HGet(ctx, a.State, "v").Result()
	require.NoError(t, err)
	require.Equal(t, "2", v, "the replica has the checkpoint")
	require.Empty(t, sh.all())

	// A wait that runs out: the write stands, Short hears 0 of 1.
	short, err := store.New(ctx, mc, k)
	require.NoError(t, err)
	require.NoError(t, short.SetAcks(ctx, &store.Acks{Replicas: 1, Timeout: 50 * time.Millisecond, Short: sh.record}))
	back = stall(t, rc.Options().Addr, pause)
	res, err = short.Write(ctx, a, "tok", 2, []byte("three"), store.WriteOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Version)
	require.Equal(t, []int{0}, sh.all())
	snap, err := plain.Load(ctx, a)
	require.NoError(t, err)
	require.Equal(t, []byte("three"), snap.Data)
	<-back
}

// waitCalls is how many WAIT commands the server at c ran.
func waitCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	n, err := redistest.CommandCalls(t.Context(), c, "wait")
	require.NoError(t, err)
	return n
}

// On a cluster each master that takes a write also takes its WAIT (a
// WAIT sent to another node would count that node's replicas, not the
// write's): concurrent checkpoints of runs on every master, grouped in
// shared pipelines, each reach their replica.
func TestAcksOnEveryMasterOfACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	ctx := t.Context()
	cl := redistest.NewCluster(t, redistest.ClusterConfig{Replicas: 1})
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs})
	t.Cleanup(func() { _ = cc.Close() })
	var sh shorts
	s, err := store.New(ctx, cc, keys.New("acks"))
	require.NoError(t, err)
	require.NoError(t, s.SetAcks(ctx, &store.Acks{Replicas: 1, Timeout: 5 * time.Second, Short: sh.record}))

	masters := map[string]*redis.Client{}
	for _, addr := range cl.Masters() {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = c.Close() })
		masters[addr] = c
	}
	before := map[string]int{}
	for addr, c := range masters {
		before[addr] = waitCalls(t, c)
	}
	// Runs until every master holds some.
	var ids []string
	held := map[string]bool{}
	for i := 0; len(held) < len(masters); i++ {
		id := "run" + strconv.Itoa(i)
		tg := s.RunTarget(id)
		addr := nodeOf(t, cc, tg.State)
		held[addr] = true
		ids = append(ids, id)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(ids))
	for _, id := range ids {
		wg.Go(func() {
			tg := s.RunTarget(id)
			if err := cc.Set(ctx, tg.Lock, "tok", time.Hour).Err(); err != nil {
				errs <- err
				return
			}
			if _, _, err := s.Create(ctx, tg, "tok", []byte("one")); err != nil {
				errs <- err
				return
			}
			for v := int64(1); v <= 5; v++ {
				if _, err := s.Write(ctx, tg, "tok", v, []byte("x"), store.WriteOptions{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for addr, c := range masters {
		require.Greater(t, waitCalls(t, c), before[addr], "master %s took writes and their WAIT", addr)
	}
	require.Empty(t, sh.all(), "every wait was answered by the write's own replica")
	for _, id := range ids {
		tg := s.RunTarget(id)
		require.NoError(t, cc.Del(ctx, tg.State, tg.Lock).Err())
	}
}

// nodeOf is the address of the master that serves key.
func nodeOf(t *testing.T, cc *redis.ClusterClient, key string) string {
	t.Helper()
	n, err := cc.MasterForKey(t.Context(), key)
	require.NoError(t, err)
	return n.Options().Addr
}

// Acks need a client whose connections a hook can reach.
func TestAcksRefuseARing(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	err := store.InstallAcks(t.Context(), ring)
	require.True(t, errors.Is(err, store.ErrAcksClient), "%v", err)
}

// BenchmarkWriteReplicaAcks is the cost of waiting for one replica: a
// run's checkpoint (Write) on a master with a replica, without and with
// Acks, from one goroutine (one checkpoint's latency) and from 64 (a
// loaded worker, whose writes share pipelines and so WAITs).
func BenchmarkWriteReplicaAcks(b *testing.B) {
	m, _ := redistest.StartReplicated(b)
	mc := redis.NewClient(&redis.Options{Addr: m.Addr, PoolSize: 64})
	b.Cleanup(func() { _ = mc.Close() })
	for _, acks := range []int{0, 1} {
		for _, par := range []int{1, 64} {
			b.Run("acks="+strconv.Itoa(acks)+"/goroutines="+strconv.Itoa(par), func(b *testing.B) {
				ctx := b.Context()
				s, err := store.New(ctx, mc, keys.New("bench"+strconv.Itoa(acks)))
				require.NoError(b, err)
				require.NoError(b, s.SetAcks(ctx, &store.Acks{Replicas: acks, Timeout: 5 * time.Second}))
				var ids atomic.Int64
				work := func(more func() bool) {
					tg := s.RunTarget("r" + strconv.FormatInt(ids.Add(1), 10))
					if err := mc.Set(ctx, tg.Lock, "tok", time.Hour).Err(); err != nil {
						b.Error(err)
						return
					}
					snap, created, err := s.Create(ctx, tg, "tok", []byte("one"))
					if err != nil {
						b.Error(err)
						return
					}
					v := int64(1)
					if !created { // a run of an earlier round of this benchmark
						v = snap.Version
					}
					for more() {
						res, err := s.Write(ctx, tg, "tok", v, []byte("checkpoint"), store.WriteOptions{})
						if err != nil {
							b.Error(err)
							return
						}
						v = res.Version
					}
				}
				if par == 1 {
					work(b.Loop)
					return
				}
				b.SetParallelism(par / runtime.GOMAXPROCS(0))
				b.RunParallel(func(pb *testing.PB) { work(pb.Next) })
			})
		}
	}
}
