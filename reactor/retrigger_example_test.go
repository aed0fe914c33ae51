package reactor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
)

func ExampleEngine_RetryRollback() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	engine, err := reactor.NewEngine(ctx, reactor.Config{
		Client: rdb, Prefix: redistest.ExamplePrefix(), Retention: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	refunds := 0
	def := reactor.MustDefine("transfer",
		reactor.Step("debit", reactor.StepConfig[reactor.Args, int]{
			Run: func(context.Context, reactor.Args) (int, error) { return 40, nil },
			Undo: func(_ context.Context, _ reactor.Args, debited int) error {
				if refunds++; refunds == 1 {
					return errors.New("refund service down")
				}
				fmt.Println("refund", debited)
				return nil
			},
		}),
		reactor.Step("credit", reactor.StepConfig[reactor.Args, int]{
			After: []string{"debit"},
			Run: func(context.Context, reactor.Args) (int, error) {
				return 0, errors.New("receiving bank unavailable")
			},
		}),
	)
	res, err := engine.Run(ctx, def, nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status, len(res.Failure.RollbackFailures), "rollback failure")

	// Later, once the refund service is back: retry what the rollback left.
	res, err = engine.RetryRollback(ctx, res.RunID)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status, len(res.Failure.RollbackFailures), "rollback failures")
	_, err = engine.RetryRollback(ctx, res.RunID)
	fmt.Println(errors.Is(err, reactor.ErrNothingToRetry))
	// Output:
	// failed 1 rollback failure
	// refund 40
	// failed 0 rollback failures
	// true
}
