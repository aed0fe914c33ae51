// Command client starts a checkout on the order service's workers and
// waits for its result:
//
//	client -item book -qty 2
//
// It reads REDIS_URL (or REDIS_CLUSTER_ADDRS, a Redis Cluster's seeds),
// GOREACTOR_PREFIX and GOREACTOR_QUEUE (one queue name) as the worker
// does, with the same defaults.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/goreactor/goreactor/examples/orders"
	"github.com/goreactor/goreactor/internal/redisurl"
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
	// Any redis.UniversalClient will do (redis.NewClient, or
	// redis.NewClusterClient for a Redis Cluster); this one is made from the
	// variables the worker reads, the way worker.Main makes its own.
	rdb, _, err := redisurl.Dial(ctx, redisurl.FromEnv(os.Getenv, redisurl.DefaultURL), 5*time.Second)
	if err != nil {
		return err
	}
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
