// Package worker runs goreactor runs as asynq tasks: the worker processes
// that execute runs, the Client that hands runs to them, and the Controller
// that queues an operator's actions for them.
//
// A service built on goreactor is two kinds of process compiling one package
// of definitions: workers, which execute runs, and clients (an API, a CLI),
// which start runs with reactor.Engine.Enqueue and read their results with
// Wait. They meet only in Redis, and must agree on three settings: the Redis,
// the key prefix (reactor.Config.Prefix) and the queue.
//
// # A worker program
//
// A worker process is one call: [Main], given every reactor that may be
// enqueued. It reads its flags and environment (-redis or REDIS_URL, -prefix
// or GOREACTOR_PREFIX, -queue or GOREACTOR_QUEUE, ...), connects to Redis,
// registers the definitions, serves until SIGTERM, stops gracefully and exits
// with a status. [Run] is the same inside a program of your own: it returns
// when its context ends, and [Options].Engine sets engine options that have
// no flag. cmd/worker is Main with the reactors of package examples.
//
//	func main() {
//		worker.Main(orders.Checkout, orders.Refund)
//	}
//
// Every worker must have every definition: a task of a reactor a worker does
// not know is retried, not failed, because during a rolling deploy another
// worker may know it. A run that started under another version of a
// definition the worker has (its fingerprint differs) is not executed here
// either: the task snoozes (Config.DefinitionSnooze) for a worker that has
// that version, and the refusal is logged once per definition and counted.
//
// # The client side
//
// A [Client] is the reactor.Enqueuer of an engine that starts runs: it turns
// each wake-up of a run into an asynq task of type [TypeRun] on its queue
// ([NewClient]; [DefaultQueue] when the name is empty), whose id names the
// cause ("resume:<run>:start"), so a duplicate of the same cause is
// recognised as already queued. It is also a reactor.ServingReporter: when a
// Wait gives up on a run still pending, it asks asynq's server registry
// whether any worker serves the queue, and Wait's error says when none does
// (*reactor.NotServedError).
//
//	queue := worker.NewClient(rdb, "orders")
//	defer queue.Close()
//	engine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: "shop", Enqueuer: queue})
//
// # Assembling a worker yourself
//
// [New] makes a [Worker] of an engine (which has the definitions registered
// and a Client as its Enqueuer) and a [Config]; Start begins serving, and
// Stop, idempotent, stops fetching and waits up to Config.ShutdownTimeout for
// running tasks, whose runs stay checkpointed and are delivered again if cut
// short. The worker's engine enqueues too (hand-offs, map elements, sweeps),
// so a Worker serves its engine's Client's queue: Config.Queues defaults to
// it, and Start refuses queues that leave it out ([QueueMismatchError]).
//
// # Configuration and recovery
//
// The key prefix and the queue are one setting each,
// GOREACTOR_PREFIX and GOREACTOR_QUEUE, read by Main's -prefix and -queue,
// by every other goreactor binary and by the library's defaults
// (reactor.Config.Prefix, NewClient with an empty queue, ControllerConfig,
// Config.Queues). An explicit setting (a flag, a Config field) wins over
// the environment, which wins over the default "goreactor". A run enqueued
// records the queue it is on (the Client's, or reactor.WithQueue's), so its
// later wake-ups and operators' actions go there. docs/configuration.md is
// the reference.
//
// Recovery: Main runs the sweeper in every worker by default, under a
// leader lock (N workers make one sweeper). With Main's defaults (3 s run
// locks, a pass every second) a run whose worker was killed is resumed by
// another worker about 3 to 4 s after the kill, under 5 s, with no other
// process; see Main.
//
// A task that finds its run locked by another process snoozes: it returns a
// [SnoozeError], which the server's [RetryDelay] maps to a short jittered
// delay and [IsFailure] does not count, so asynq's retry budget is not spent
// on waiting. A payload that cannot be decoded is archived with the reason. A
// panic in a step never kills the worker.
//
// # Operator actions
//
// A [Controller] is the operator's side: from a process without definitions
// (a dashboard, an admin tool) it checks an undo, cancel, retry, rollback
// retry or undo of named steps ([Action]) against the stored run by the
// engine's own rules (reactor.Engine.Check) and queues a control task
// ([TypeControl]) whose id names the request, "ctl:<run>:<action>:<version>",
// so a double click queues one. Every Worker carries control tasks out with
// the engine call of the same name; a request that no longer applies by then
// is archived with the engine's reason.
package worker
