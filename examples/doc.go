// Package examples holds small, realistic reactor definitions to read and to
// run: the demo (cmd/demo) and the worker binary (cmd/worker) use them.
//
//   - Checkout reserves stock, charges a card and ships an order; every step
//     has an Undo, shipping also a Compensate.
//   - Travel books a flight and a hotel; Trip composes it with a payment, so
//     undoing a trip cancels the payment, the hotel and the flight.
//
// The steps have no real I/O. They act on a pretend outside world kept in
// memory (Stock, Effects) and record every side effect and its reversal in
// the Effects journal, which is what a demo or a test prints. Each step is
// idempotent, as real steps must be: a step whose process dies after it acted
// but before its checkpoint runs again when the run is resumed, so a real
// step passes a key derived from the run's inputs (here the order or trip id)
// to the service it calls.
//
// Every definition takes a "fail_at" input naming a step that should fail
// with ErrInjected, to show a rollback on demand.
//
// A process that runs or reads these reactors (a worker, an API) registers
// them with Register.
package examples

import "github.com/goreactor/goreactor/reactor"

// Register registers every example definition with e, so that e's workers
// can execute, resume and undo their runs.
func Register(e *reactor.Engine) error {
	return e.Register(Checkout, Travel, Trip, Fulfilment)
}
