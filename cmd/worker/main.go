// Command worker is a deployable goreactor worker serving the reactors of
// package examples; it is also the model of your own worker, whose main is
// this file with your definitions in place of the examples' (every reactor
// that may be enqueued, on every worker).
//
//	worker -redis redis://localhost:6379/0 -queue critical:6,goreactor:3 -sweep-interval 30s
//
// Its flags, environment variables, logs, signals and exit statuses are
// worker.Main's (go doc github.com/goreactor/goreactor/worker.Main, or
// worker -h).
package main

import (
	"github.com/goreactor/goreactor/examples"
	"github.com/goreactor/goreactor/worker"
)

func main() {
	worker.Main(examples.Checkout, examples.Travel, examples.Trip, examples.Fulfilment)
}
