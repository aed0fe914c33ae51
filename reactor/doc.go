// Package reactor is goreactor's public API: durable sagas over Redis.
//
// A reactor is a named Definition: typed inputs, steps that form a DAG, and
// what the run returns. Each step has a Run, and may have an Undo (reverse a
// completed step when a later one fails) and a Compensate (clean up after its
// own failure). When a run fails, the failing step is compensated and every
// completed step is undone, newest first; undo and compensate failures are
// collected on the run's Failure and the rollback carries on.
//
// Runs are durable. The Engine stores a run in Redis (msgpack) and
// checkpoints it after every step through a fenced write: a Lua script that
// lands only if the writer still holds the run's lock (a redsync mutex kept
// alive by a heartbeat) and read the version stored now. A process that
// loses the lock runs no more user code and writes nothing; whoever holds the
// lock resumes from the last checkpoint, and a crashed rollback resumes from
// the last undone entry.
//
//	def := reactor.MustDefine("checkout",
//		reactor.Input[string]("order", reactor.Required()),
//		reactor.Step("reserve", reactor.StepConfig[ReserveIn, Reservation]{
//			Args: reactor.Bindings{"order": reactor.FromInput("order")},
//			Run:  reserve,
//			Undo: release,
//		}),
//		reactor.Step("charge", reactor.StepConfig[ChargeIn, Receipt]{
//			Args: reactor.Bindings{"amount": reactor.FromStep("reserve", "total")},
//			Run:  charge,
//			Undo: refund,
//		}),
//		reactor.Returns(reactor.FromStep("charge")),
//	)
//	res, err := engine.Run(ctx, def, map[string]any{"order": "o-1"})
//
// Errors survive persistence: register error types with RegisterError and
// sentinels with RegisterSentinel, and errors.As / errors.Is work on a Failure
// read back from Redis.
package reactor
