// Package orders is the order service of the README's first service: the
// reactors that both of its processes compile, the worker that executes
// their runs (examples/orders/worker) and the client that starts them
// (examples/orders/client), so the two can never disagree on a definition.
package orders

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/goreactor/goreactor/reactor"
)

// Order is what reserve takes.
type Order struct {
	Item string `json:"item"`
	Qty  int    `json:"qty"`
}

// Reservation is what reserve returns and charge takes.
type Reservation struct {
	ID  string `json:"id"`
	Qty int    `json:"qty"`
}

// Checkout reserves stock, then charges for it. A charge that fails (over 5
// items: the card is declined) releases the reservation.
var Checkout = reactor.MustDefine("checkout",
	reactor.Input[string]("item", reactor.Required()),
	reactor.Input[int]("qty", reactor.Default(1)),
	reactor.Step("reserve", reactor.StepConfig[Order, Reservation]{
		Args: reactor.Bindings{"item": reactor.FromInput("item"), "qty": reactor.FromInput("qty")},
		Run:  reserve,
		Undo: release,
	}),
	reactor.Step("charge", reactor.StepConfig[Reservation, string]{
		Args:  reactor.Bindings{"id": reactor.FromStep("reserve", "id"), "qty": reactor.FromStep("reserve", "qty")},
		Run:   charge,
		Undo:  refund,
		Retry: reactor.Retry{MaxAttempts: 3, Backoff: reactor.Exponential(100*time.Millisecond, 2*time.Second)},
	}),
	reactor.Returns(reactor.FromStep("charge")),
)

// The steps stand in for calls to your services. A step runs again if its
// worker dies before its result is saved, so a real one hands its service
// an idempotency key: the run id, from reactor.RunInfoFrom.
func reserve(ctx context.Context, o Order) (Reservation, error) {
	info, _ := reactor.RunInfoFrom(ctx)
	slog.InfoContext(ctx, "reserved", "item", o.Item, "qty", o.Qty)
	return Reservation{ID: "rsv-" + info.RunID, Qty: o.Qty}, nil
}

func release(ctx context.Context, _ Order, r Reservation) error {
	slog.InfoContext(ctx, "released", "reservation", r.ID)
	return nil
}

func charge(ctx context.Context, r Reservation) (string, error) {
	if r.Qty > 5 {
		return "", reactor.Permanent(errors.New("card declined")) // not retried
	}
	slog.InfoContext(ctx, "charged", "reservation", r.ID)
	return "receipt-" + r.ID, nil
}

func refund(ctx context.Context, _ Reservation, receipt string) error {
	slog.InfoContext(ctx, "refunded", "receipt", receipt)
	return nil
}
