package examples

import (
	"context"
	"errors"
	"time"

	"github.com/goreactor/goreactor/reactor"
)

// Reservation is stock held for an order.
type Reservation struct {
	ID    string `json:"id"`
	Item  string `json:"item"`
	Qty   int    `json:"qty"`
	Total Cents  `json:"total"`
}

// Receipt is what a completed Checkout returns.
type Receipt struct {
	Order    string `json:"order"`
	Item     string `json:"item"`
	Qty      int    `json:"qty"`
	Charged  Cents  `json:"charged"`
	Payment  string `json:"payment"`
	Tracking string `json:"tracking"`
}

type reserveIn struct {
	Order  string `json:"order"`
	Item   string `json:"item"`
	Qty    int    `json:"qty"`
	FailAt string `json:"fail_at"`
}

type chargeIn struct {
	Order  string `json:"order"`
	Amount Cents  `json:"amount"`
	Card   string `json:"card"`
	FailAt string `json:"fail_at"`
}

type shipIn struct {
	Order   string `json:"order"`
	Item    string `json:"item"`
	Qty     int    `json:"qty"`
	Payment string `json:"payment"`
	Amount  Cents  `json:"amount"`
	FailAt  string `json:"fail_at"`
}

// Checkout reserves stock, charges the card and ships the order, and returns
// a Receipt. When a step fails, the steps before it are undone newest first:
// the payment is refunded, then the stock released.
//
// Inputs: order (required, the order id), item (required: "book", "lamp" or
// "desk"), qty (default 1), card (default a test card), fail_at (a step
// name, to make that step fail with ErrInjected).
//
// An order the stock cannot cover fails at "reserve" with *OutOfStockError.
var Checkout = reactor.MustDefine("checkout",
	reactor.Input[string]("order", reactor.Required()),
	reactor.Input[string]("item", reactor.Required()),
	reactor.Input[int]("qty", reactor.Default(1), reactor.Validate(func(n int) error {
		if n < 1 {
			return errors.New("must be at least 1")
		}
		return nil
	})),
	reactor.Input[string]("card", reactor.Default("4242424242424242")),
	reactor.Input[string]("fail_at", reactor.Default(""), validFailAt("reserve", "charge", "ship")),

	reactor.Step("reserve", reactor.StepConfig[reserveIn, Reservation]{
		Args: reactor.Bindings{
			"order":   reactor.FromInput("order"),
			"item":    reactor.FromInput("item"),
			"qty":     reactor.FromInput("qty"),
			"fail_at": reactor.FromInput("fail_at"),
		},
		Run: func(ctx context.Context, in reserveIn) (Reservation, error) {
			if err := injectFailure(in.FailAt, "reserve"); err != nil {
				return Reservation{}, err
			}
			r := Reservation{ID: "res_" + in.Order, Item: in.Item, Qty: in.Qty, Total: Prices[in.Item] * Cents(in.Qty)}
			if err := Stock.Reserve(r.ID, in.Item, in.Qty); err != nil {
				// Retrying cannot make stock appear: fail at once.
				return Reservation{}, reactor.Permanent(err)
			}
			Effects.Record(ctx, in.Order, "reserve", "%d × %s (%s)", r.Qty, r.Item, r.ID)
			return r, nil
		},
		Undo: func(ctx context.Context, in reserveIn, r Reservation) error {
			Stock.Release(r.ID)
			Effects.Record(ctx, in.Order, "release", "%d × %s (%s)", r.Qty, r.Item, r.ID)
			return nil
		},
	}),

	reactor.Step("charge", reactor.StepConfig[chargeIn, Payment]{
		Args: reactor.Bindings{
			"order":   reactor.FromInput("order"),
			"amount":  reactor.FromStep("reserve", "total"),
			"card":    reactor.FromInput("card"),
			"fail_at": reactor.FromInput("fail_at"),
		},
		Run: func(ctx context.Context, in chargeIn) (Payment, error) {
			if err := injectFailure(in.FailAt, "charge"); err != nil {
				return Payment{}, err
			}
			return charge(ctx, in.Order, in.Card, in.Amount), nil
		},
		Undo: func(ctx context.Context, in chargeIn, p Payment) error {
			refund(ctx, in.Order, p)
			return nil
		},
		// A payment provider has bad moments: try three times. Permanent
		// errors (ErrInjected here) are not retried.
		Retry: reactor.Retry{MaxAttempts: 3, Backoff: reactor.Exponential(50*time.Millisecond, time.Second)},
	}),

	reactor.Step("ship", reactor.StepConfig[shipIn, Receipt]{
		Args: reactor.Bindings{
			"order":   reactor.FromInput("order"),
			"item":    reactor.FromStep("reserve", "item"),
			"qty":     reactor.FromStep("reserve", "qty"),
			"payment": reactor.FromStep("charge", "id"),
			"amount":  reactor.FromStep("charge", "amount"),
			"fail_at": reactor.FromInput("fail_at"),
		},
		Run: func(ctx context.Context, in shipIn) (Receipt, error) {
			tracking := "TRK-" + in.Order
			Effects.Record(ctx, in.Order, "label", "created shipping label %s", tracking)
			if err := injectFailure(in.FailAt, "ship"); err != nil {
				return Receipt{}, err
			}
			Effects.Record(ctx, in.Order, "ship", "%d × %s, tracking %s", in.Qty, in.Item, tracking)
			return Receipt{Order: in.Order, Item: in.Item, Qty: in.Qty, Charged: in.Amount, Payment: in.Payment, Tracking: tracking}, nil
		},
		// Undo recalls a shipped parcel (when Checkout is composed into a
		// larger reactor whose later step fails, or on Engine.Undo).
		Undo: func(ctx context.Context, in shipIn, r Receipt) error {
			Effects.Record(ctx, in.Order, "recall", "parcel %s", r.Tracking)
			return nil
		},
		// Compensate cleans up after ship's own failure: the label was
		// created before the carrier refused the parcel, so void it.
		Compensate: func(ctx context.Context, in shipIn, cause error) error {
			Effects.Record(ctx, in.Order, "void", "shipping label TRK-%s", in.Order)
			return nil
		},
	}),

	reactor.Returns(reactor.FromStep("ship")),
)
