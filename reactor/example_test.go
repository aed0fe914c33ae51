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

func ExampleEngine_Run() {
	ctx := context.Background()
	rdb := redistest.NewClient()
	defer rdb.Close()
	engine, err := reactor.NewEngine(ctx, reactor.Config{
		Client:    rdb,
		Prefix:    redistest.ExamplePrefix(), // yours: "myapp" (the default is "goreactor")
		Retention: time.Minute,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}

	def := reactor.MustDefine("transfer",
		reactor.Input[int]("amount", reactor.Required()),
		reactor.Step("debit", reactor.StepConfig[struct {
			Amount int `json:"amount"`
		}, int]{
			Args: reactor.Bindings{"amount": reactor.FromInput("amount")},
			Run: func(_ context.Context, in struct {
				Amount int `json:"amount"`
			}) (int, error) {
				fmt.Println("debit", in.Amount)
				return in.Amount, nil
			},
			Undo: func(_ context.Context, _ struct {
				Amount int `json:"amount"`
			}, debited int) error {
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
	res, err := engine.Run(ctx, def, map[string]any{"amount": 40})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status, res.Failure.Step, res.Failure.Message)
	// Output:
	// debit 40
	// refund 40
	// failed credit receiving bank unavailable
}
