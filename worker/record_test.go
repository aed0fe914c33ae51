package worker_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/payload"
	"github.com/goreactor/goreactor/internal/version"
	"github.com/goreactor/goreactor/worker"
)

// Two workers of one process each publish a record under their own asynq
// server id (told apart though they share host and pid), with goreactor's
// version and a TTL of three heartbeats; Stop deletes it.
func TestWorkersPublishARecordPerAsynqServer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.engine("worker")
	w1 := f.startWorker(e)
	w2 := f.startWorker(e, func(c *worker.Config) { c.Concurrency = 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	servers, err := f.inspector.Servers()
	require.NoError(t, err)
	k := keys.New(f.prefix)
	host, _ := os.Hostname()
	seen := map[int]string{} // concurrency -> server id
	for _, s := range servers {
		if s.Queues[f.queue] == 0 {
			continue // another test's
		}
		h, err := f.rdb.HGetAll(ctx, k.Worker(s.ID)).Result()
		require.NoError(t, err)
		rec, ok := payload.ParseWorkerRecord(h)
		require.True(t, ok, "server %s (concurrency %d) has no record: %v", s.ID, s.Concurrency, h)
		require.Equal(t, version.String(), rec.Version)
		require.Equal(t, f.prefix, rec.Prefix)
		require.Equal(t, host, rec.Host)
		require.Equal(t, os.Getpid(), rec.PID)
		require.WithinDuration(t, s.Started, rec.Started, 5*time.Second)
		ttl, err := f.rdb.PTTL(ctx, k.Worker(s.ID)).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, time.Duration(0), "the record expires")
		require.LessOrEqual(t, ttl, 15*time.Second, "within three heartbeats")
		seen[s.Concurrency] = s.ID
	}
	require.Len(t, seen, 2, "both workers' servers: %v", seen)
	require.Contains(t, seen, 10)
	require.Contains(t, seen, 3)

	require.NoError(t, w2.Stop(ctx))
	n, err := f.rdb.Exists(ctx, k.Worker(seen[3])).Result()
	require.NoError(t, err)
	require.Zero(t, n, "Stop deletes the record")
	n, err = f.rdb.Exists(ctx, k.Worker(seen[10])).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the other worker's stays")
	require.NoError(t, w1.Stop(ctx))
}
