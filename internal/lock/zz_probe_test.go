package lock_test

import (
	"testing"
	"time"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/redistest"
)

func TestZZProbe(t *testing.T) {
	fails := 0
	for i := range 200 {
		rdb := redis.NewClient(redistest.Options())
		l, err := lock.New(rdb, 90*time.Millisecond).TryAcquire(t.Context(), fmt.Sprintf("grt:probe:%d", i))
		if err != nil { fails++; t.Log(err) } else { _ = l.Release(t.Context()) }
		rdb.Close()
	}
	t.Logf("fails %d/200", fails)
}
