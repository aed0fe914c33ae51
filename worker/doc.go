// Package worker runs goreactor runs as asynq tasks.
//
// A worker process is one call: Main, given every reactor that may be
// enqueued, reads its flags and environment, connects to Redis, serves until
// SIGTERM and exits with a status; Run is the same inside a program of your
// own. cmd/worker is that call with the reactors of package examples.
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
