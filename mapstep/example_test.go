package mapstep_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// exampleRedis is the Redis the examples use: yours would be
// redis.NewClient(&redis.Options{Addr: "localhost:6379"}).
func exampleRedis() redis.UniversalClient { return redistest.NewClient() }

type SquareIn struct {
	N int `json:"n"`
}

type SumIn struct {
	Squares mapstep.Results[int] `json:"squares"`
}

// A map step squares every item with an element reactor; the next step takes
// the map's result typed by what the element returns, and reads it lazily.
func ExampleResults() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	engine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: redistest.ExamplePrefix(),
		Retention: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}

	square := reactor.MustDefine("square",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("square", reactor.StepConfig[SquareIn, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run:  func(_ context.Context, in SquareIn) (int, error) { return in.N * in.N, nil },
		}),
		reactor.Returns(reactor.FromStep("square")))
	sum := reactor.MustDefine("sum-of-squares",
		reactor.Input[[]int]("numbers", reactor.Required()),
		mapstep.Map("squares", mapstep.Config{Element: square, Items: reactor.FromInput("numbers")}),
		reactor.Step("sum", reactor.StepConfig[SumIn, int]{
			Args: reactor.Bindings{"squares": reactor.FromStep("squares")},
			Run: func(ctx context.Context, in SumIn) (int, error) {
				values, err := in.Squares.Values(ctx)
				total := 0
				for _, v := range values {
					total += v
				}
				return total, err
			},
		}),
		reactor.Returns(reactor.FromStep("sum")))

	res, err := engine.Run(ctx, sum, map[string]any{"numbers": []int{1, 2, 3, 4}})
	if err != nil {
		panic(err)
	}
	total, _ := reactor.ValueOf[int](res)
	fmt.Println(res.Status, total)
	// Output: completed 30
}
