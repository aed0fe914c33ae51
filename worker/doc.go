// Package worker runs goreactor runs as asynq tasks.
//
// A worker process is one call: Main, given every reactor that may be
// enqueued, reads its flags and environment, connects to Redis, serves until
// SIGTERM and exits with a status; Run is the same inside a program of your
// own. cmd/worker is that call with the reactors of package examples.
//
// Configuration: the key prefix and the queue are one setting each,
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
// Underneath, a Client implements reactor.Enqueuer: it turns a wake-up into
// an asynq task of type TypeRun whose id names the cause
// ("resume:<run>:start"), so a duplicate of the same cause is recognised as
// already queued. A Worker is an asynq server whose handler executes the
// run. The worker's engine enqueues too (hand-offs, map elements, sweeps),
// so a Worker serves the queue of its engine's Client: Config.Queues
// defaults to it, and Start refuses queues that leave it out.
//
// A task that finds its run locked by another process snoozes: it returns a
// typed error that the server's RetryDelayFunc maps to a short jittered delay
// and its IsFailure does not count, so asynq's retry budget is not spent on
// waiting. A payload that cannot be decoded is archived with the reason; an
// unknown reactor name is retried, because a rolling deploy may not have the
// definition on every worker yet.
//
// A Controller is the operator's side: from a process without definitions
// (a dashboard) it validates an undo, cancel or retry against the stored run
// by the engine's own rules (reactor.Engine.Check) and queues a control task
// (TypeControl) whose id names the request, "ctl:<run>:<action>:<version>",
// so a double click queues one. A worker carries it out with Engine.Undo,
// Cancel or Retry; a request that no longer applies by then is archived
// with the engine's reason.
package worker
