package sweeper_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// One sweeper pass, as `cmd/sweeper -once` runs it from a cron job: it needs
// an engine with the workers' prefix and queue, and no reactor definitions.
func ExampleSweeper_Once() {
	ctx := context.Background()
	rdb := redistest.NewClient() // yours: redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	engine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: redistest.ExamplePrefix(),
		Enqueuer: worker.NewClient(rdb, "example-queue"), Logger: logger})
	if err != nil {
		panic(err)
	}
	sw, err := sweeper.New(sweeper.Config{Engine: engine, Logger: logger})
	if err != nil {
		panic(err)
	}
	rep, err := sw.Once(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("leader:", rep.Leader, "runs woken:", rep.Runs.Woken, "maps examined:", rep.Maps.Examined)
	// Output: leader: true runs woken: 0 maps examined: 0
}
