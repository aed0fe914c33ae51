// Command worker executes the order service's runs: worker.Main with every
// reactor the service may enqueue. Its flags and environment are
// worker.Main's (worker -h).
package main

import (
	"github.com/goreactor/goreactor/examples/orders"
	"github.com/goreactor/goreactor/worker"
)

func main() {
	worker.Main(orders.Checkout)
}
