// Command client starts a checkout on the order service's workers and
// waits for its result:
//
//	client -item book -qty 2
//
// It reads REDIS_URL, GOREACTOR_PREFIX and GOREACTOR_QUEUE (one queue
// name) as the worker does, with the same defaults.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/examples/orders"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

func main() {
	item := flag.String("item", "book", "what to buy")
	qty := flag.Int("qty", 1, "how many (over 5: the card is declined)")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *item, *qty); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, out io.Writer, item string, qty int) error {
	opt, err := redis.ParseURL(cmp.Or(os.Getenv("REDIS_URL"), "redis://localhost:6379/0"))
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	queue := worker.NewClient(rdb, os.Getenv("GOREACTOR_QUEUE")) // "": queue goreactor
	defer queue.Close()
	engine, err := reactor.NewEngine(ctx, reactor.Config{
		Client:   rdb,
		Prefix:   os.Getenv("GOREACTOR_PREFIX"), // "": prefix goreactor
		Enqueuer: queue,
	})
	if err != nil {
		return err // Redis did not answer
	}

	res, err := engine.Enqueue(ctx, orders.Checkout, map[string]any{"item": item, "qty": qty})
	if err != nil {
		return err // invalid inputs, or Redis
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if res, err = engine.Wait(ctx, res.RunID); err != nil {
		return err // a *reactor.NotServedError when no worker serves the queue
	}
	switch res.Outcome() {
	case reactor.OutcomeSuccess:
		receipt, err := reactor.ValueOf[string](res)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, res.RunID, "completed:", receipt)
	case reactor.OutcomeFailure:
		fmt.Fprintln(out, res.RunID, res.Status, "at", res.Failure.Step+":", res.Failure.Message, "(rolled back)")
	default:
		fmt.Fprintln(out, res.RunID, res.Status)
	}
	return nil
}
