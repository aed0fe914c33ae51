package liveness

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// abandon ends l's heartbeat and leaves its keys, as a killed worker does.
func (l *Lease) abandon() {
	l.once.Do(func() {
		close(l.stop)
		<-l.done
	})
}

func TestKeysShareTheWorkersHashTag(t *testing.T) {
	k := NewKeys("p")
	require.Equal(t, "p:{worker:w1}:alive", k.Alive("w1"))
	require.Equal(t, "p:{worker:w1}:tasks", k.Tasks("w1"))
	require.Equal(t, "p:idx:workers", k.Registry())
}

// A live worker's deliveries are live; once its heartbeat stops (a kill),
// they are dead as soon as its alive key expires; a task no record lists
// is unknown; a finished delivery is forgotten at the next beat, and a
// delivery of the same id taken again meanwhile is not.
func TestVerdicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	const ttl = 300 * time.Millisecond
	a, err := Start(ctx, Config{Client: rdb, Prefix: prefix, TTL: ttl, Logger: discard})
	require.NoError(t, err)
	b, err := Start(ctx, Config{Client: rdb, Prefix: prefix, TTL: ttl, Logger: discard})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Stop(ctx)) })
	require.NotEqual(t, a.ID(), b.ID())

	endA1, err := a.Begin(ctx, "q", "t1")
	require.NoError(t, err)
	_, err = a.Begin(ctx, "q", "t2")
	require.NoError(t, err)
	endB3, err := b.Begin(ctx, "q", "t3")
	require.NoError(t, err)

	v, err := Read(ctx, rdb, prefix)
	require.NoError(t, err)
	require.Equal(t, 2, v.Live)
	require.Equal(t, Live, v.Of("q", "t1"))
	require.Equal(t, Live, v.Of("q", "t3"))
	require.Equal(t, Unknown, v.Of("other", "t1"), "a task id is per queue")
	require.Equal(t, Unknown, v.Of("q", "t9"))

	// b finishes t3 and takes it again before its next beat; t1 of a
	// finishes.
	endB3()
	_, err = b.Begin(ctx, "q", "t3")
	require.NoError(t, err)
	endA1()
	require.Eventually(t, func() bool {
		return rdb.HExists(ctx, NewKeys(prefix).Tasks(a.ID()), "t1").Val() == false
	}, 5*time.Second, 10*time.Millisecond, "a's beat forgets t1")
	require.Eventually(t, func() bool {
		return rdb.HLen(ctx, NewKeys(prefix).Tasks(b.ID())).Val() == 1
	}, 5*time.Second, 10*time.Millisecond)
	require.True(t, rdb.HExists(ctx, NewKeys(prefix).Tasks(b.ID()), "t3").Val(), "the later delivery of t3 stays")

	// a is killed with t2 in flight.
	a.abandon()
	require.Eventually(t, func() bool {
		v, err := Read(ctx, rdb, prefix)
		require.NoError(t, err)
		return v.Of("q", "t2") == Dead
	}, 2*time.Second, 10*time.Millisecond, "dead once a's alive key expired")
	v, err = Read(ctx, rdb, prefix)
	require.NoError(t, err)
	require.Equal(t, 1, v.Live)
	require.Equal(t, 1, v.Dead)
	require.Equal(t, Live, v.Of("q", "t3"))
	require.Equal(t, Unknown, v.Of("q", "t1"))

	// The same task delivered again to a live worker is live, whatever a
	// dead record says.
	_, err = b.Begin(ctx, "q", "t2")
	require.NoError(t, err)
	v, err = Read(ctx, rdb, prefix)
	require.NoError(t, err)
	require.Equal(t, Live, v.Of("q", "t2"))

	host, err := os.Hostname()
	require.NoError(t, err)
	require.True(t, v.Leased(Name(host, os.Getpid())), "this process runs leased workers")
	require.False(t, v.Leased(Name(host, os.Getpid()+1)))

	// A dead worker whose record expired is dropped from the registry.
	require.NoError(t, rdb.Del(ctx, NewKeys(prefix).Tasks(a.ID()), NewKeys(prefix).Name(a.ID())).Err())
	v, err = Read(ctx, rdb, prefix)
	require.NoError(t, err)
	require.Equal(t, 1, v.Forgotten)
	require.Equal(t, []string{b.ID()}, rdb.ZRange(ctx, NewKeys(prefix).Registry(), 0, -1).Val())
}

// Every key a lease writes expires (the registry aside) and Stop deletes
// them all.
func TestStopDeletesTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	l, err := Start(ctx, Config{Client: rdb, Prefix: prefix, TTL: time.Second, Logger: discard})
	require.NoError(t, err)
	_, err = l.Begin(ctx, "q", "t1")
	require.NoError(t, err)
	k := NewKeys(prefix)
	ttl := rdb.PTTL(ctx, k.Alive(l.ID())).Val()
	require.Positive(t, ttl)
	require.LessOrEqual(t, ttl, time.Second)
	ttl = rdb.PTTL(ctx, k.Tasks(l.ID())).Val()
	require.Greater(t, ttl, RecordTTL-time.Minute)
	require.Equal(t, "1 q", rdb.HGet(ctx, k.Tasks(l.ID()), "t1").Val())
	require.NoError(t, l.Stop(ctx))
	require.NoError(t, l.Stop(ctx), "idempotent")
	require.Zero(t, rdb.Exists(ctx, k.Alive(l.ID()), k.Tasks(l.ID()), k.Name(l.ID()), k.Registry()).Val())
}
