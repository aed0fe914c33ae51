package reactor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// The types and steps of the examples' checkout: reserve stock, then charge
// for it; a charge for more than 5 items is declined.

type Order struct {
	Item string `json:"item"`
	Qty  int    `json:"qty"`
}

type Reservation struct {
	ID  string `json:"id"`
	Qty int    `json:"qty"`
}

var Checkout = reactor.MustDefine("checkout",
	reactor.Input[string]("item", reactor.Required()),
	reactor.Input[int]("qty", reactor.Default(1)),
	reactor.Step("reserve", reactor.StepConfig[Order, Reservation]{
		Args: reactor.Bindings{"item": reactor.FromInput("item"), "qty": reactor.FromInput("qty")},
		Run: func(_ context.Context, o Order) (Reservation, error) {
			fmt.Println("reserve", o.Qty, o.Item)
			return Reservation{ID: "rsv-1", Qty: o.Qty}, nil
		},
		Undo: func(_ context.Context, _ Order, r Reservation) error {
			fmt.Println("release", r.ID)
			return nil
		},
	}),
	reactor.Step("charge", reactor.StepConfig[Reservation, string]{
		Args: reactor.Bindings{"id": reactor.FromStep("reserve", "id"), "qty": reactor.FromStep("reserve", "qty")},
		Run: func(_ context.Context, r Reservation) (string, error) {
			if r.Qty > 5 {
				return "", reactor.Permanent(errors.New("card declined"))
			}
			fmt.Println("charge", r.ID)
			return "receipt-" + r.ID, nil
		},
	}),
	reactor.Returns(reactor.FromStep("charge")),
)

// A reactor run in this process: Run returns when the run has ended, and
// ValueOf reads what it returned.
func Example() {
	ctx := context.Background()
	rdb := redistest.NewClient() // your Redis
	defer rdb.Close()
	prefix := "example:" + reactor.NewRunID()
	defer deleteExampleData(rdb, prefix, "") // what the example stored
	engine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Logger: quiet})
	if err != nil {
		panic(err) // Redis did not answer
	}

	res, err := engine.Run(ctx, Checkout, map[string]any{"item": "book", "qty": 2})
	if err != nil {
		panic(err) // the run could not be executed or recorded
	}
	receipt, err := reactor.ValueOf[string](res)
	fmt.Println(res.Status, receipt, err)
	// Output:
	// reserve 2 book
	// charge rsv-1
	// completed receipt-rsv-1 <nil>
}

// A client and a worker. In a service they are two processes that compile
// the same definitions: the worker is worker.Main(Checkout), and the client
// builds an engine whose Enqueuer is a worker.Client on the worker's queue,
// enqueues a run and waits for its end. Here both share one process.
func Example_workers() {
	ctx := context.Background()
	rdb := redistest.NewClient() // your Redis
	defer rdb.Close()
	prefix, queue := "example:"+reactor.NewRunID(), "example-"+reactor.NewRunID()
	defer deleteExampleData(rdb, prefix, queue) // what the example stored

	// The worker's side: an engine that knows the definition, and a worker
	// serving the queue.
	workerEngine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Logger: quiet,
		Enqueuer: worker.NewClient(rdb, queue)})
	if err != nil {
		panic(err)
	}
	if err := workerEngine.Register(Checkout); err != nil {
		panic(err)
	}
	w := worker.New(workerEngine, rdb, worker.Config{Logger: quiet})
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer w.Stop(context.Background())

	// The client's side: the same Redis, prefix and queue; no Register.
	queued := worker.NewClient(rdb, queue)
	defer queued.Close()
	client, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Logger: quiet, Enqueuer: queued})
	if err != nil {
		panic(err)
	}
	res, err := client.Enqueue(ctx, Checkout, map[string]any{"item": "pen", "qty": 9})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status)
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err = client.Wait(waitCtx, res.RunID)
	if err != nil {
		panic(err) // a *reactor.NotServedError if no worker served the queue
	}
	fmt.Println(res.Status, "at", res.Failure.Step+":", res.Failure.Message)
	// Output:
	// pending
	// reserve 9 pen
	// release rsv-1
	// failed at charge: card declined
}

// What a rollback did, entry by entry, and what it adds up to.
func ExampleEngine_RollbackReport() {
	ctx := context.Background()
	rdb := redistest.NewClient() // your Redis
	defer rdb.Close()
	prefix := "example:" + reactor.NewRunID()
	defer deleteExampleData(rdb, prefix, "") // what the example stored
	engine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Logger: quiet})
	if err != nil {
		panic(err)
	}
	res, err := engine.Run(ctx, Checkout, map[string]any{"item": "pen", "qty": 9})
	if err != nil {
		panic(err)
	}

	rep, err := engine.RollbackReport(ctx, res.RunID)
	if err != nil {
		panic(err)
	}
	for _, e := range rep.Entries {
		fmt.Println(e.Order, e.Step, e.Status, e.Action)
	}
	fmt.Println(rep.Summary.Outcome)
	// Output:
	// reserve 9 pen
	// release rsv-1
	// 1 charge no_compensation_registered none
	// 2 reserve compensated undo
	// reverted
}

// Inputs decoded from JSON are given as they are: a JSON number converts to
// an integer input when it is a whole number in range, and anything else is
// refused before the run is stored.
func ExampleEngine_Run_inputsFromJSON() {
	ctx := context.Background()
	rdb := redistest.NewClient() // your Redis
	defer rdb.Close()
	prefix := "example:" + reactor.NewRunID()
	defer deleteExampleData(rdb, prefix, "") // what the example stored
	engine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Logger: quiet})
	if err != nil {
		panic(err)
	}

	for _, body := range []string{`{"item": "book", "qty": 2}`, `{"item": "book", "qty": 2.5}`} {
		var inputs map[string]any // qty is a float64, as encoding/json decodes every number
		if err := json.Unmarshal([]byte(body), &inputs); err != nil {
			panic(err)
		}
		res, err := engine.Run(ctx, Checkout, inputs)
		var bad *reactor.InputError
		switch {
		case errors.As(err, &bad):
			fmt.Println("refused:", bad)
		case err != nil:
			panic(err)
		default:
			fmt.Println(res.Status)
		}
	}
	// Output:
	// reserve 2 book
	// charge rsv-1
	// completed
	// refused: reactor: checkout: input "qty": want int, got float 2.5: not a whole number
}

// quiet discards the examples' logs.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
