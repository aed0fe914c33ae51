package main

import (
	"bytes"
	"cmp"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/examples/orders"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// The README's first service end to end, on a prefix and queue of its own
// set the way the README sets them (GOREACTOR_PREFIX, GOREACTOR_QUEUE): the
// worker program's one definition served by worker.Run (what worker.Main
// runs, without the process around it), and the client's run.
func TestFirstService(t *testing.T) {
	if seeds := redistest.ClusterAddrs(); seeds != nil { // the tests share a cluster
		t.Setenv("REDIS_URL", "")
		t.Setenv("REDIS_CLUSTER_ADDRS", strings.Join(seeds, ","))
	} else {
		t.Setenv("REDIS_URL", cmp.Or(os.Getenv("REDIS_URL"), "redis://"+redistest.Addr()))
	}
	t.Setenv("GOREACTOR_PREFIX", redistest.Prefix(t))
	t.Setenv("GOREACTOR_QUEUE", redistest.Queue(t))
	// The steps log through slog's default logger, as worker.Main makes it.
	logs := &syncBuffer{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- worker.Run(ctx, worker.Options{Definitions: []*reactor.Definition{orders.Checkout}, Stderr: logs})
	}()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-served)
	})

	var out bytes.Buffer
	require.NoError(t, run(ctx, &out, "book", 2))
	require.Regexp(t, `^\S+ completed: receipt-rsv-\S+\n$`, out.String())

	out.Reset()
	require.NoError(t, run(ctx, &out, "book", 9))
	require.Regexp(t, `^\S+ failed at charge: card declined \(rolled back\)\n$`, out.String())
	require.Contains(t, logs.String(), "msg=released")
}

// syncBuffer is a bytes.Buffer that the worker's goroutines and the test
// may use at once.
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
