package examples

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"github.com/goreactor/goreactor/reactor"
)

// ErrInjected is the error of a step named by a run's "fail_at" input. It is
// registered (code "examples.injected"), so errors.Is works on a Failure read
// back from Redis.
var ErrInjected = errors.New("examples: injected failure")

// OutOfStockError is Checkout's error when the warehouse cannot cover an
// order. It is registered (code "examples.out_of_stock"), so errors.As
// recovers it, fields included, from a Failure read back from Redis.
type OutOfStockError struct {
	Item      string `json:"item"`
	Requested int    `json:"requested"`
	Available int    `json:"available"`
}

func (e *OutOfStockError) Error() string {
	return fmt.Sprintf("examples: out of stock: %d × %s requested, %d available", e.Requested, e.Item, e.Available)
}

func init() {
	// Register each error once per process, in every process that runs or
	// reads these reactors: an init in the package that defines them does.
	reactor.RegisterError[*OutOfStockError]("examples.out_of_stock")
	reactor.RegisterSentinel("examples.injected", ErrInjected)
}

// injectFailure returns ErrInjected, marked permanent so no retry policy
// repeats it, when failAt names step.
func injectFailure(failAt, step string) error {
	if failAt != step {
		return nil
	}
	return reactor.Permanent(fmt.Errorf("%w at step %q", ErrInjected, step))
}

// validFailAt returns a validator for a "fail_at" input: empty, or one of
// steps.
func validFailAt(steps ...string) reactor.InputOption {
	return reactor.Validate(func(s string) error {
		if s == "" || slices.Contains(steps, s) {
			return nil
		}
		return fmt.Errorf("%q is not one of the steps %v", s, steps)
	})
}

// Cents is an amount of money in cents.
type Cents int64

func (c Cents) String() string { return fmt.Sprintf("$%d.%02d", c/100, c%100) }

// Entry is one side effect that an example step performed or reversed.
type Entry struct {
	// Ref is the order or trip the effect belongs to.
	Ref string
	// Action names the effect: "reserve", "release", "charge", "refund", ...
	Action string
	// Detail says what was done.
	Detail string
}

func (e Entry) String() string { return fmt.Sprintf("%-8s %s", e.Action, e.Detail) }

// Journal is an append-only, in-memory ledger of side effects. It stands in
// for the services the example steps would call, so a demo or a test can
// show what a run did and what its rollback reversed. It is safe for
// concurrent use.
type Journal struct {
	mu      sync.Mutex
	entries []Entry
}

// Record appends an entry and logs it at debug level.
func (j *Journal) Record(ctx context.Context, ref, action, format string, args ...any) {
	e := Entry{Ref: ref, Action: action, Detail: fmt.Sprintf(format, args...)}
	j.mu.Lock()
	j.entries = append(j.entries, e)
	j.mu.Unlock()
	slog.DebugContext(ctx, "examples: "+action, "ref", ref, "detail", e.Detail)
}

// Entries returns the entries recorded for ref, oldest first.
func (j *Journal) Entries(ref string) []Entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []Entry
	for _, e := range j.entries {
		if e.Ref == ref {
			out = append(out, e)
		}
	}
	return out
}

// Effects is the journal every example step records into.
var Effects = &Journal{}

// Warehouse is an in-memory stock of items. Reservations are keyed by id, so
// reserving or releasing the same id twice has no further effect. It is safe
// for concurrent use.
type Warehouse struct {
	mu    sync.Mutex
	stock map[string]int
	held  map[string]hold
}

type hold struct {
	item string
	qty  int
}

// NewWarehouse returns a warehouse holding stock (item name to quantity).
func NewWarehouse(stock map[string]int) *Warehouse {
	w := &Warehouse{stock: maps.Clone(stock), held: map[string]hold{}}
	if w.stock == nil {
		w.stock = map[string]int{}
	}
	return w
}

// Reserve takes qty of item out of stock under reservation id. It returns an
// *OutOfStockError when the stock cannot cover it, and nil without taking
// anything when id is already held.
func (w *Warehouse) Reserve(id, item string, qty int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.held[id]; ok {
		return nil
	}
	if avail := w.stock[item]; avail < qty {
		return &OutOfStockError{Item: item, Requested: qty, Available: avail}
	}
	w.stock[item] -= qty
	w.held[id] = hold{item: item, qty: qty}
	return nil
}

// Release puts reservation id back into stock. Releasing an unknown or
// already released id does nothing.
func (w *Warehouse) Release(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h, ok := w.held[id]; ok {
		w.stock[h.item] += h.qty
		delete(w.held, id)
	}
}

// Available returns the quantity of item in stock.
func (w *Warehouse) Available(item string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stock[item]
}

// Stock is the warehouse Checkout reserves from.
var Stock = NewWarehouse(map[string]int{"book": 500, "lamp": 40, "desk": 5})

// Prices lists what Checkout charges per item.
var Prices = map[string]Cents{"book": 1299, "lamp": 4500, "desk": 24900}

// Payment is a card charge.
type Payment struct {
	ID     string `json:"id"`
	Amount Cents  `json:"amount"`
	Card   string `json:"card"` // last four digits
}

// charge pretends to charge card. The payment id derives from ref, as an
// idempotency key a real provider would take.
func charge(ctx context.Context, ref, card string, amount Cents) Payment {
	p := Payment{ID: "pay_" + ref, Amount: amount, Card: last4(card)}
	Effects.Record(ctx, ref, "charge", "%s to card …%s (%s)", p.Amount, p.Card, p.ID)
	return p
}

// refund pretends to refund payment p in full.
func refund(ctx context.Context, ref string, p Payment) {
	Effects.Record(ctx, ref, "refund", "%s to card …%s (%s)", p.Amount, p.Card, p.ID)
}

func last4(card string) string {
	if len(card) <= 4 {
		return card
	}
	return card[len(card)-4:]
}
