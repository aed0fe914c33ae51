package redisurl

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// closedURL returns a redis:// URL on a local port nothing listens on.
func closedURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "redis://:secret@" + addr + "/3"
}

func TestDialNamesTheURLWithoutItsPassword(t *testing.T) {
	t.Parallel()
	u := closedURL(t)
	_, _, err := Dial(context.Background(), u, "REDIS_URL", time.Second)
	require.Error(t, err)
	require.Contains(t, err.Error(), "redis://:xxxxx@"+u[len("redis://:secret@"):])
	require.Contains(t, err.Error(), "REDIS_URL")
	require.NotContains(t, err.Error(), "secret")
}

func TestDialAnswers(t *testing.T) {
	t.Parallel()
	c, opts, err := Dial(context.Background(), "redis://"+redistest.Addr()+"/0", "-redis", 2*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, redistest.Addr(), opts.Addr)
}

func TestDialRejectsAMalformedURL(t *testing.T) {
	t.Parallel()
	_, _, err := Dial(context.Background(), "localhost:6379", "-redis", time.Second)
	require.ErrorContains(t, err, "-redis")
}
