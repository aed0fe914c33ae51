// Package reactor is goreactor's public API: durable sagas over Redis.
//
// A reactor is a named workflow of steps, each of which can say how to undo
// itself. When a run fails, the failing step is compensated and every step the
// run completed is undone, newest first; what could not be undone is
// reported, never dropped. Runs are stored in Redis and checkpointed after
// every step, so a run whose process dies resumes from its last checkpoint
// instead of starting over.
//
// This overview is a manual, in the order a service meets the API: defining a
// reactor, running it in this process or on workers, what a failure does,
// reading a rollback, and operating stored runs. The repository's README
// tells the same story as two programs (examples/orders: a worker and a
// client), and its docs/ directory is the reference.
//
// # Defining a reactor
//
// [Define] (or [MustDefine], for a package-level variable) builds a
// [Definition] from parts: typed inputs ([Input], with [Required], [Default],
// [Validate] and [Sensitive]), steps ([Step] and its [StepConfig]), composed
// child reactors ([Compose]) and what the run returns ([Returns]). A step's
// arguments are [Bindings] of references, [FromInput], [FromStep] (with a path
// into an earlier result) and [Const], which decode into the step's In type
// by field name as msgpack matches it (the msgpack tag, else the json tag,
// else the Go name). References order the steps; [StepConfig.After] adds
// order without data. Define checks the whole graph: a cycle, an unknown
// reference, a duplicate name, a binding that names no field of In, or a
// FromStep path the result's type cannot have is refused with a
// *[DefinitionError] that names what there is.
//
//	var Checkout = reactor.MustDefine("checkout",
//		reactor.Input[string]("item", reactor.Required()),
//		reactor.Input[int]("qty", reactor.Default(1)),
//		reactor.Step("reserve", reactor.StepConfig[Order, Reservation]{
//			Args: reactor.Bindings{"item": reactor.FromInput("item"), "qty": reactor.FromInput("qty")},
//			Run:  reserve, // func(context.Context, Order) (Reservation, error)
//			Undo: release, // func(context.Context, Order, Reservation) error
//		}),
//		reactor.Step("charge", reactor.StepConfig[Reservation, string]{
//			Args:  reactor.Bindings{"id": reactor.FromStep("reserve", "id"), "qty": reactor.FromStep("reserve", "qty")},
//			Run:   charge,
//			Undo:  refund,
//			Retry: reactor.Retry{MaxAttempts: 3, Backoff: reactor.Exponential(100*time.Millisecond, 2*time.Second)},
//		}),
//		reactor.Returns(reactor.FromStep("charge")),
//	)
//
// Inputs may come straight from encoding/json: a float64 or a json.Number
// that is a whole number in the integer input's range converts to it (a
// float64 only below 2^53 in magnitude, where it still names one integer),
// a json.Number converts to a float input, and a value that does not fit is
// refused with an *[InputError] saying why, before anything is stored.
//
// A map step, one element reactor per item of a collection, run inline or
// fanned out to workers, is package mapstep's.
//
// A definition has a fingerprint of its shape ([Definition.Fingerprint]:
// its inputs, steps, bindings and types, not the bodies of its functions),
// and a stored run executes only under the definition it started with. A
// deploy that changes a reactor's shape gives the new definition a
// [Version] and registers it beside the old one until the old runs are done
// ([Compatible] declares a change that keeps stored runs meaningful); the
// repository's docs/deploys.md says how.
//
// # Running in this process, or on workers
//
// An [Engine] (one per process: [NewEngine] with a [Config]) runs reactors
// and manages stored runs. [Engine.Run] executes a run in the calling process
// and returns its [Result] when it ends ([ValueOf] reads the value); it holds
// the run's lock meanwhile, so no other process touches the run.
//
// A service usually spreads its runs over two kinds of process that compile
// the same definitions. Workers execute runs: a worker program is
// worker.Main(defs...), which builds an Engine, registers the definitions
// ([Engine.Register]) and serves asynq tasks until SIGTERM. Clients (an API,
// a CLI, a cron job) start runs and read their results: their Engine's
// [Config.Enqueuer] is a worker.Client on the workers' queue; [Engine.Enqueue]
// stores a run as pending and queues its start, and [Engine.Wait] returns
// its result once a worker has finished it ([Engine.Get] reads it at any
// time). A client registers nothing: only processes that execute, resume or
// undo runs need the definitions by name. Both sides must name the same
// Redis, the same [Config.Prefix] and the same queue.
//
//	engine, err := reactor.NewEngine(ctx, reactor.Config{
//		Client:   rdb,
//		Prefix:   "shop",
//		Enqueuer: worker.NewClient(rdb, "orders"),
//	})
//	res, err := engine.Enqueue(ctx, Checkout, map[string]any{"item": "book", "qty": 2})
//	res, err = engine.Wait(ctx, res.RunID) // a *NotServedError when no worker serves "orders"
//
// A run started by Run may leave the process too: at a hand-off point
// ([StepConfig.HandOff]) or a fan-out map the rest goes to workers, and Run
// waits for them ([NoWait] returns at once). Per-call options: [WithRunID]
// (starting an id again with the same inputs is idempotent), [WithQueue],
// [WithDelay] and [WithStartAt] (Enqueue only), [WithDeadline] and
// [WithTimeout]. A step's context carries [RunInfo] ([RunInfoFrom]): the run
// id, the step's path, the attempt and the trace id.
//
// # When a step fails
//
// An error from a step's Run is retried as its [Retry] says (a [Permanent]
// error never is); [Halt] stops the run without rolling back, and [Skip]
// skips the step. Once a step has failed for good, the run rolls back: the
// failing step's Compensate runs, then every completed step's Undo, newest
// first, each bounded by its undo timeout. An undo that fails is recorded and
// the rollback goes on. The run ends failed, and its [Failure] says what
// failed and where, whether running it again could help, and every undo or
// compensate that failed.
//
// A step whose process died during its Run may have had its effect. Going
// forward it runs again (at least once: give the service it calls an
// idempotency key, such as the run id); a rollback that reaches it instead
// calls its Compensate with [ErrStepInterrupted], so write Compensate to
// tolerate an effect that never happened.
//
// Errors survive Redis: register error types with [RegisterError] and
// sentinels with [RegisterSentinel], and errors.As and errors.Is work on a
// Failure read back from Redis.
//
// # Durability
//
// Every write of a run's state is one Lua script that lands only if the
// writer still holds the run's lock (a redsync mutex kept alive by a
// heartbeat) and read the version stored now. A process that loses the lock
// runs no more user code and writes nothing; whoever holds the lock next
// resumes from the last checkpoint, and a crashed rollback resumes from the
// last undone entry. A sweeper (package sweeper) re-enqueues the runs and the
// map work of processes that died.
//
// # Reading a rollback
//
// Several types describe a rollback, each for one reader:
//
//   - [RollbackReport], from [Engine.RollbackReport], is the account of a
//     run's latest rollback, for people and dashboards: one [RollbackEntry]
//     per step the rollback reached or has still to reach, in rollback order,
//     with its [RollbackStatus], its [CompensatingAction], attempts and
//     times; their [RollbackSummary], whose [RollbackOutcome] is in_progress,
//     reverted, kept_in_place, nothing_to_do or needs_human (never
//     "partial"); and the [ActionItem] list of what a person must act on.
//   - [RollbackStatus] is one entry's state, from a closed set
//     ([RollbackStatuses]): pending, compensating, compensated,
//     no_compensation_registered, compensation_failed, out_of_window, and from
//     guarded undo conflict, needs_human, blocked, manually_reverted and
//     left_applied.
//   - [RollbackFailure] is one undo or compensate that failed:
//     [Failure.RollbackFailures] of a run that rolled back lists them (the
//     first [Config.MaxRollbackFailures]; the rest are counted).
//   - [StepRollback] is what the stored run records, one for each step a
//     rollback reached, in [Run.Rollbacks] in the order it happened; the
//     report is derived from them. [RollbackRecord], in [Run.Rollback], is
//     the rollback under way: its [RollbackTrigger], its generation and the
//     Failure the run will end with.
//   - [AuditEntry], from [Engine.Audit], is one transition of the run's
//     append-only audit stream.
//
// [CompensatingAction] names the function that reverses a step
// ([ActionUndo], [ActionCompensate], or [ActionNone]) wherever a rollback
// names one. Three other types say "undo" and mean something else: a
// [CallKind] ([CallRun], [CallUndo], [CallCompensate]) is the user function a
// [Middleware] wraps or a [RunInfo] describes; an [Op] ([OpUndo], [OpCancel],
// [OpRetry], [OpRollback], [OpUndoSteps], [OpResolve]) names an operation on
// a stored run, the one a [StatusError] refused or [Engine.Check] validates,
// OpUndo being [Engine.Undo] of the whole run; and an [AuditKind] is what an
// audit entry records.
//
// # Operating stored runs
//
// [Engine.Cancel] stops a live run at its next checkpoint and rolls it back;
// [Engine.Undo] rolls back a finished one; [Engine.Retry] runs a failed or
// cancelled one again under a new id; [Engine.RetryRollback] retries only
// what a rollback could not undo, in a new generation; [Engine.UndoSteps]
// undoes named steps and keeps the rest. A guarded step ([StepConfig.Guard],
// [Guarded], [RecordEffect]) compares its resource with the effect it
// recorded before restoring it, and a conflict waits for a person:
// [Engine.NeedsHuman] lists the runs waiting, [Engine.Resolve] records what
// the person decided. [Engine.Check] validates an operation from a process
// that holds no definitions (a dashboard; worker.Controller queues the
// operation for a worker).
//
// # Extension points
//
// [Construct], [ConstructStep], [ConstructContext], [WindowedConstruct],
// [BindingChecker], [Dispatch], [RollbackFailures] and [RollbackHandedOff]
// are how package mapstep plugs the map step into the engine: a map's
// hand-off to workers, its elements' rollback failures, its undo windows.
// They are exported for it; a reactor needs none of them.
//go:generate go run ../internal/facadegen -src ../internal/engine -import github.com/goreactor/goreactor/internal/engine -pkg reactor -out api.go

package reactor
