package reactor_test

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/redistest"
)

// deleteExampleData deletes what an example stored: every key under
// prefix and, for a queue, asynq's keys of it and its entry in asynq's list
// of queues. It is the examples' cleanup, not part of what they show.
func deleteExampleData(rdb redis.UniversalClient, prefix, queue string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	patterns := []string{prefix + ":*"}
	if queue != "" {
		patterns = append(patterns, "asynq:{"+queue+"}:*")
		_ = rdb.SRem(ctx, "asynq:queues", queue).Err()
	}
	for _, p := range patterns {
		if keys, err := redistest.ScanKeys(ctx, rdb, p); err == nil { // every master of a cluster
			_ = redistest.Unlink(ctx, rdb, keys...)
		}
	}
}
