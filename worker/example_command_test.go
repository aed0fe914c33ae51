package worker_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/goreactor/goreactor/examples"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// A worker program's whole main: every reactor that may be enqueued, then
// Main, which reads the flags and environment, serves until SIGTERM and
// exits.
func ExampleMain() {
	worker.Main(examples.Checkout, examples.Travel, examples.Trip, examples.Fulfilment)
}

// A worker inside a program of your own: Run serves until its context ends
// and returns instead of exiting; Options.Engine adds what no flag sets.
func ExampleRun() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err := worker.Run(ctx, worker.Options{
		Definitions: []*reactor.Definition{examples.Checkout},
		Args:        os.Args[1:],
		Engine: func(c *reactor.Config) {
			c.Hooks = append(c.Hooks, reactor.HookFunc(func(_ context.Context, ev reactor.Event) {
				// export ev to your metrics
			}))
		},
	})
	if err != nil {
		log.Fatal(err)
	}
}
