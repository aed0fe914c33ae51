// Package redislog routes go-redis's own log lines (connection-pool
// trouble, dial retries, push-notification handshakes) into log/slog, so
// that a goreactor binary whose logs are JSON writes nothing else: go-redis
// otherwise prints plain "redis: ..." lines on stderr.
package redislog

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Logger is a go-redis logger (redis.SetLogger) writing to a slog.Logger.
// Every line is at Warn: go-redis logs only what went wrong on a
// connection, which an operator may have to look at when it repeats.
type Logger struct {
	// L receives the lines, with component=go-redis.
	L *slog.Logger
}

// Printf logs one go-redis line.
func (r Logger) Printf(ctx context.Context, format string, v ...any) {
	r.L.WarnContext(ctx, strings.TrimRight(fmt.Sprintf(format, v...), "\n"), "component", "go-redis")
}

// Set makes l go-redis's process-wide logger. Call it once the binary's
// logger exists, before the first Redis client is made.
func Set(l *slog.Logger) { redis.SetLogger(Logger{L: l}) }
