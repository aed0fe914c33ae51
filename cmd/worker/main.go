// Command worker is a deployable goreactor worker serving the reactors of
// package examples; it is also the model of your own worker, whose main is
// this file with your definitions in place of the examples' (every reactor
// that may be enqueued, on every worker).
//
//	GOREACTOR_PREFIX=shop GOREACTOR_QUEUE=critical:6,orders:3 worker -redis redis://localhost:6379/0
//
// Its flags, environment variables, logs, signals and exit statuses are
// worker.Main's (go doc github.com/goreactor/goreactor/worker.Main, or
// worker -h). GOREACTOR_PREFIX and GOREACTOR_QUEUE are the settings your
// client processes, cmd/sweeper and cmd/dashboard read too
// (docs/configuration.md).
//
// Every worker also runs the sweeper (one at a time, under a leader lock),
// so a run whose worker was killed is resumed by another about 3 to 4 s
// after the kill (under 5 s) with the defaults (-lock-expiry 3s,
// -sweep-interval 1s); -sweep-interval 0 turns that off, for deployments
// that run cmd/sweeper.
package main

import (
	"github.com/goreactor/goreactor/examples"
	"github.com/goreactor/goreactor/worker"
)

func main() {
	worker.Main(examples.Checkout, examples.Travel, examples.Trip, examples.Fulfilment)
}
