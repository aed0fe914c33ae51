package metrics

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

const namespace = "goreactor"

// Options configure New.
type Options struct {
	// Client is the engine's Redis client, read at scrape time for the
	// goreactor_runs gauge (ZCARD of the non-terminal status indexes).
	// Default none: the gauge is not exported.
	Client redis.UniversalClient
	// Prefix is the engine's key prefix (its Config.Prefix). Default
	// GOREACTOR_PREFIX, else "goreactor".
	Prefix string
	// ScrapeTimeout bounds the Redis read of a scrape. Default 2 s.
	ScrapeTimeout time.Duration
	// DurationBuckets are the buckets of the _seconds histograms, in
	// seconds. Default 5 ms to 5 minutes (DefaultDurationBuckets).
	DurationBuckets []float64
	// PauseBuckets are the buckets of goreactor_interrupt_paused_seconds
	// (how long runs waited at interrupt steps), in seconds. Default 1
	// second to 7 days (DefaultPauseBuckets).
	PauseBuckets []float64
	// Logger receives a line when the scrape-time Redis read fails.
	// Default slog.Default().
	Logger *slog.Logger
}

// DefaultDurationBuckets are the histogram buckets used when
// Options.DurationBuckets is empty: steps and sweeper passes range from
// milliseconds to minutes.
var DefaultDurationBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// DefaultPauseBuckets are the buckets of goreactor_interrupt_paused_seconds
// when Options.PauseBuckets is empty: an interrupt waits for a webhook
// (seconds), a person (minutes to hours) or a partner (days).
var DefaultPauseBuckets = []float64{1, 10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400}

// WithDefaults returns o with every unset field at its default.
func (o Options) WithDefaults() Options {
	if o.Prefix == "" {
		o.Prefix = envconfig.Prefix()
	}
	if o.ScrapeTimeout <= 0 {
		o.ScrapeTimeout = 2 * time.Second
	}
	if len(o.DurationBuckets) == 0 {
		o.DurationBuckets = DefaultDurationBuckets
	}
	if len(o.PauseBuckets) == 0 {
		o.PauseBuckets = DefaultPauseBuckets
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Metrics counts goreactor's events, tasks and sweeper passes. Its methods
// are safe for concurrent use. See the package doc for how to wire it.
type Metrics struct {
	opts Options
	keys keys.Keys

	definitionRefusals *prometheus.CounterVec
	runsStarted        *prometheus.CounterVec
	runsFinished       *prometheus.CounterVec
	elementsFinished   *prometheus.CounterVec
	stepDuration       *prometheus.HistogramVec
	stepAttempts       *prometheus.CounterVec
	stepRetries        *prometheus.CounterVec
	undo               *prometheus.CounterVec
	undoDuration       *prometheus.HistogramVec
	batches            *prometheus.CounterVec
	lockLost           prometheus.Counter

	paused            *prometheus.CounterVec
	payloadsReceived  *prometheus.CounterVec
	payloadsRefused   *prometheus.CounterVec
	continued         *prometheus.CounterVec
	interruptTimeouts *prometheus.CounterVec
	pausedDuration    *prometheus.HistogramVec
	limitWaits        *prometheus.CounterVec
	limitRefusals     *prometheus.CounterVec
	limitCancels      *prometheus.CounterVec
	limitHolds        *prometheus.CounterVec
	replicaAcksShort  prometheus.Counter

	runTasks     *prometheus.CounterVec
	elementTasks *prometheus.CounterVec
	rollbackJobs *prometheus.CounterVec
	ownerResumes *prometheus.CounterVec
	snoozes      *prometheus.CounterVec

	sweepPasses     prometheus.Counter
	sweepSkipped    prometheus.Counter
	sweepErrors     prometheus.Counter
	sweepRecoveries *prometheus.CounterVec
	sweepDuration   prometheus.Histogram
	sweepTrimmed    prometheus.Counter
	sweepDropped    prometheus.Counter
	sweepRemoved    prometheus.Counter

	runsDesc       *prometheus.Desc
	runsReadErrors prometheus.Counter

	collectors []prometheus.Collector
}

// New returns a Metrics; register it into a prometheus.Registerer.
func New(opts Options) *Metrics {
	opts = opts.WithDefaults()
	m := &Metrics{opts: opts, keys: keys.New(opts.Prefix)}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels)
		m.collectors = append(m.collectors, c)
		return c
	}
	counter0 := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
		m.collectors = append(m.collectors, c)
		return c
	}
	m.definitionRefusals = counter("definition_refusals_total", "Task deliveries a worker refused because their run started under a "+
		"definition of the reactor that the worker does not have (snoozed for a worker that has it; see reactor.Version).", "reactor")
	m.runsStarted = counter("runs_started_total", "Root runs started (first execution; composed children and map elements excluded).", "reactor")
	m.runsFinished = counter("runs_finished_total", "Root runs that reached a terminal status.", "reactor", "status")
	m.elementsFinished = counter("map_elements_finished_total", "Map element runs that reached a terminal status.", "reactor", "status")
	m.stepDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "step_duration_seconds",
		Help: "Duration of a step's final attempt (outcome completed or failed).", Buckets: opts.DurationBuckets},
		[]string{"reactor", "step", "outcome"})
	m.collectors = append(m.collectors, m.stepDuration)
	m.stepAttempts = counter("step_attempts_total", "Attempts of steps (each Run call; constructs count once).", "reactor", "step")
	m.stepRetries = counter("step_retries_total", "Step attempts that failed and will be retried.", "reactor", "step")
	m.undo = counter("undo_total", "Undo and compensate calls by outcome (ok or failed: failed leaves an effect applied).",
		"reactor", "kind", "outcome")
	m.undoDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "undo_duration_seconds",
		Help: "Duration of undo and compensate calls, by kind (undo, compensate) and outcome (ok, failed).", Buckets: opts.DurationBuckets},
		[]string{"reactor", "kind", "outcome"})
	m.collectors = append(m.collectors, m.undoDuration)
	m.batches = counter("map_batches_claimed_total",
		"Batches claimed by fan-out maps (kind forward: element tasks; rollback: element rollback jobs), by owner reactor.", "reactor", "kind")
	m.replicaAcksShort = counter0("replica_acks_short_total",
		"Progress writes that fewer replicas than Config.ReplicaAcks acknowledged within ReplicaAckTimeout: a failover now may lose them.")
	m.paused = counter("interrupt_pauses_total", "Runs that paused at an interrupt step and left their worker.", "reactor", "step")
	m.payloadsReceived = counter("interrupt_payloads_received_total", "Payloads Continue recorded for interrupt steps "+
		"(counted by the process that called Continue: an API server, the dashboard).", "reactor", "step")
	m.payloadsRefused = counter("interrupt_payloads_refused_total", "Recorded payloads a worker refused (they did not decode into the "+
		"step's payload type or its Validate refused them); the run stays paused.", "reactor", "step")
	m.continued = counter("interrupt_continued_total", "Interrupt steps that took their payloads: the run went on.", "reactor", "step")
	m.interruptTimeouts = counter("interrupt_timeouts_total", "Interrupt steps whose timeout passed short of payloads "+
		"(the step failed, or took its Default).", "reactor", "step")
	m.pausedDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "interrupt_paused_seconds",
		Help: "How long runs were paused at an interrupt step before it took its payloads.", Buckets: opts.PauseBuckets},
		[]string{"reactor", "step"})
	m.collectors = append(m.collectors, m.pausedDuration)
	m.limitWaits = counter("limit_waits_total", "Tries of a step's attempt that found a limit full, by limit and kind "+
		"(concurrency, rate); the attempt tries again a little later.", "limit", "kind")
	m.limitRefusals = counter("limit_refusals_total", "Attempts that stopped waiting in-process for a full limit: the run "+
		"waits at its checkpoint and its task is snoozed.", "limit", "kind")
	m.limitCancels = counter("limit_cancels_total", "Runs a full limit's OnFull policy cancelled, by limit and policy "+
		"(cancel-newest: the run that found it full; cancel-oldest: the oldest holder).", "limit", "policy")
	m.limitHolds = counter("limit_holds_total", "Attempts of limited steps that took their limits and ran.", "reactor", "step")
	m.lockLost = counter0("lock_lost_total", "Executions (runs and element runs) that lost their run lock mid-way.")

	m.runTasks = counter("run_tasks_total", "Run tasks handled by workers, by outcome (done, snoozed, dropped, error).", "outcome")
	m.elementTasks = counter("map_element_tasks_total", "Map element tasks handled by workers, by outcome (done, snoozed, dropped, error).", "outcome")
	m.rollbackJobs = counter("map_rollback_jobs_total", "Map element rollback jobs handled by workers, by outcome (done, snoozed, dropped, error).", "outcome")
	m.ownerResumes = counter("owner_resumes_total", "Owner runs resumed by a settled fan-out map (kind forward or rollback).", "kind")
	m.snoozes = counter("snoozes_total", "Tasks snoozed because another process held the run lock, by task (run, element, rollback).", "task")

	m.sweepPasses = counter0("sweeper_passes_total", "Sweeper passes run as leader.")
	m.sweepSkipped = counter0("sweeper_skipped_total", "Sweeper ticks skipped because another sweeper held the leader lock.")
	m.sweepErrors = counter0("sweeper_pass_errors_total", "Sweeper passes that reported errors.")
	m.sweepRecoveries = counter("sweeper_recoveries_total",
		"Work the sweeper recovered, by kind (run, element, rollback, owner_resume, claim).", "kind")
	m.sweepDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "sweeper_pass_duration_seconds",
		Help: "Duration of sweeper passes run as leader.", Buckets: opts.DurationBuckets})
	m.collectors = append(m.collectors, m.sweepDuration)
	m.sweepTrimmed = counter0("sweeper_index_trimmed_total", "Listing-index entries (idx:runs, idx:status:*, ...) of gone runs, and idx:needs_human entries of runs no longer waiting, removed.")
	m.sweepDropped = counter0("sweeper_runs_dropped_total", "Finished or vanished runs taken off the active index.")
	m.sweepRemoved = counter0("sweeper_maps_removed_total", "Maps taken off the map index.")

	m.runsReadErrors = counter0("runs_read_errors_total", "Scrapes whose read of the status indexes failed (goreactor_runs was left out).")
	m.runsDesc = prometheus.NewDesc(namespace+"_runs", "Runs in each non-terminal status, read from the status indexes at scrape time.",
		[]string{"status"}, nil)

	// Pre-create the series an alert or a dashboard relies on, so they read
	// 0 rather than absent before the first event.
	for _, o := range []string{OutcomeDone, OutcomeSnoozed, OutcomeDropped, OutcomeError} {
		m.runTasks.WithLabelValues(o)
		m.elementTasks.WithLabelValues(o)
		m.rollbackJobs.WithLabelValues(o)
	}
	for _, k := range []string{ResumeForward, ResumeRollback} {
		m.ownerResumes.WithLabelValues(k)
	}
	for _, k := range []string{TaskRun, TaskElement, TaskRollback} {
		m.snoozes.WithLabelValues(k)
	}
	for _, k := range []string{"run", "element", "rollback", "owner_resume", "claim"} {
		m.sweepRecoveries.WithLabelValues(k)
	}
	return m
}

// Values of the task, outcome and kind labels.
const (
	TaskRun      = "run"
	TaskElement  = "element"
	TaskRollback = "rollback"

	OutcomeDone    = "done"
	OutcomeSnoozed = "snoozed"
	OutcomeDropped = "dropped"
	OutcomeError   = "error"

	ResumeForward  = "forward"
	ResumeRollback = "rollback"
)

// OnEvent implements reactor.Hook.
func (m *Metrics) OnEvent(_ context.Context, e reactor.Event) {
	switch e.Kind {
	case reactor.EventRunStarted, reactor.EventRunResumed:
		// A run's first execution: started in-process, or a worker's first
		// pick-up of an enqueued run (resumed from pending).
		first := e.Kind == reactor.EventRunStarted || e.Status == reactor.StatusPending
		if first && e.Step == "" && !e.Element {
			m.runsStarted.WithLabelValues(e.Reactor).Inc()
		}
	case reactor.EventRunCompleted, reactor.EventRunFailed, reactor.EventRunHalted, reactor.EventRunCancelled, reactor.EventRunAborted:
		if e.Step != "" {
			return // a composed child's run
		}
		status := string(e.Status)
		if status == "" {
			status = string(finishedStatus(e.Kind))
		}
		if e.Element {
			m.elementsFinished.WithLabelValues(e.Reactor, status).Inc()
		} else {
			m.runsFinished.WithLabelValues(e.Reactor, status).Inc()
		}
	case reactor.EventRunLockLost:
		m.lockLost.Inc()
	case reactor.EventReplicaAcksShort:
		m.replicaAcksShort.Inc()
	case reactor.EventStepStarted:
		m.stepAttempts.WithLabelValues(e.Reactor, e.Step).Inc()
	case reactor.EventStepRetrying:
		m.stepRetries.WithLabelValues(e.Reactor, e.Step).Inc()
	case reactor.EventStepCompleted, reactor.EventStepFailed:
		// Constructs' completions carry no duration (they span tasks).
		if e.Duration > 0 {
			outcome := "completed"
			if e.Kind == reactor.EventStepFailed {
				outcome = "failed"
			}
			m.stepDuration.WithLabelValues(e.Reactor, e.Step, outcome).Observe(e.Duration.Seconds())
		}
	case reactor.EventStepUndone:
		m.observeUndo(e, "undo", "ok")
	case reactor.EventStepUndoFailed:
		m.observeUndo(e, "undo", "failed")
	case reactor.EventStepCompensated:
		m.observeUndo(e, "compensate", "ok")
	case reactor.EventCompensateFail:
		m.observeUndo(e, "compensate", "failed")
	case reactor.EventRunPaused:
		m.paused.WithLabelValues(e.Reactor, e.Step).Inc()
	case reactor.EventPayloadReceived:
		m.payloadsReceived.WithLabelValues(e.Reactor, e.Step).Inc()
	case reactor.EventPayloadRefused:
		m.payloadsRefused.WithLabelValues(e.Reactor, e.Step).Inc()
	case reactor.EventRunContinued:
		m.continued.WithLabelValues(e.Reactor, e.Step).Inc()
		m.pausedDuration.WithLabelValues(e.Reactor, e.Step).Observe(e.Duration.Seconds())
	case reactor.EventInterruptTimedOut:
		m.interruptTimeouts.WithLabelValues(e.Reactor, e.Step).Inc()
	case reactor.EventLimitWaited, reactor.EventLimitRefused:
		if le, ok := errors.AsType[*reactor.LimitError](e.Err); ok {
			c := m.limitWaits
			if e.Kind == reactor.EventLimitRefused {
				c = m.limitRefusals
			}
			c.WithLabelValues(le.Limit, le.Kind).Inc()
		}
	case reactor.EventLimitTaken:
		m.limitHolds.WithLabelValues(e.Reactor, e.Step).Inc()
	case reactor.EventLimitCancelled:
		if le, ok := errors.AsType[*reactor.LimitError](e.Err); ok {
			policy := reactor.CancelNewest
			if le.RunID != e.RunID {
				policy = reactor.CancelOldest
			}
			m.limitCancels.WithLabelValues(le.Limit, policy.String()).Inc()
		}
	case reactor.EventMapBatchClaimed:
		m.batches.WithLabelValues(e.Reactor, ResumeForward).Inc()
	case reactor.EventMapRollbackBatchClaimed:
		m.batches.WithLabelValues(e.Reactor, ResumeRollback).Inc()
	}
}

func (m *Metrics) observeUndo(e reactor.Event, kind, outcome string) {
	m.undo.WithLabelValues(e.Reactor, kind, outcome).Inc()
	m.undoDuration.WithLabelValues(e.Reactor, kind, outcome).Observe(e.Duration.Seconds())
}

func finishedStatus(k reactor.EventKind) reactor.Status {
	switch k {
	case reactor.EventRunCompleted:
		return reactor.StatusCompleted
	case reactor.EventRunFailed:
		return reactor.StatusFailed
	case reactor.EventRunHalted:
		return reactor.StatusHalted
	case reactor.EventRunCancelled:
		return reactor.StatusCancelled
	}
	return reactor.StatusAborted
}

// ObserveTask implements worker.Observer: a worker handled a task of kind
// task (TaskRun, TaskElement, TaskRollback) with outcome (OutcomeDone,
// OutcomeSnoozed, OutcomeDropped, OutcomeError).
func (m *Metrics) ObserveTask(task, outcome string) {
	switch task {
	case TaskRun:
		m.runTasks.WithLabelValues(outcome).Inc()
	case TaskElement:
		m.elementTasks.WithLabelValues(outcome).Inc()
	case TaskRollback:
		m.rollbackJobs.WithLabelValues(outcome).Inc()
	}
	if outcome == OutcomeSnoozed {
		m.snoozes.WithLabelValues(task).Inc()
	}
}

// ObserveDefinitionMismatch implements worker.DefinitionObserver: a worker
// refused a task because its run started under a definition of reactor
// that the worker does not have (it snoozes it for one that has).
func (m *Metrics) ObserveDefinitionMismatch(reactor string) {
	m.definitionRefusals.WithLabelValues(reactor).Inc()
}

// ObserveOwnerResume implements worker.Observer: a worker resumed the owner
// run of a settled fan-out map (kind ResumeForward or ResumeRollback).
func (m *Metrics) ObserveOwnerResume(kind string) {
	m.ownerResumes.WithLabelValues(kind).Inc()
}

// ObservePass implements sweeper.Observer: one pass's report and error.
func (m *Metrics) ObservePass(rep sweeper.Report, err error) {
	if !rep.Leader {
		m.sweepSkipped.Inc()
		return
	}
	m.sweepPasses.Inc()
	if err != nil {
		m.sweepErrors.Inc()
	}
	m.sweepDuration.Observe(rep.Duration.Seconds())
	for kind, n := range map[string]int{"run": rep.Runs.Woken, "element": rep.Maps.Elements, "rollback": rep.Maps.Rollbacks,
		"owner_resume": rep.Maps.Resumes, "claim": rep.Maps.Claims} {
		m.sweepRecoveries.WithLabelValues(kind).Add(float64(n))
	}
	m.sweepTrimmed.Add(float64(rep.Trim.Trimmed))
	m.sweepDropped.Add(float64(rep.Runs.Dropped))
	m.sweepRemoved.Add(float64(rep.Maps.Removed))
}

// liveStatuses are the statuses the goreactor_runs gauge reports: the
// terminal ones only grow (until the sweeper trims them) and are better
// read as rates of goreactor_runs_finished_total.
var liveStatuses = []reactor.Status{reactor.StatusPending, reactor.StatusRunning, reactor.StatusPaused, reactor.StatusRollingBack}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
	if m.opts.Client != nil {
		ch <- m.runsDesc
	}
}

// Collect implements prometheus.Collector. With Options.Client set it reads
// the status indexes (one pipelined round trip of ZCARDs).
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	if m.opts.Client != nil {
		m.collectRuns(ch)
	}
	for _, c := range m.collectors {
		c.Collect(ch)
	}
}

func (m *Metrics) collectRuns(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.ScrapeTimeout)
	defer cancel()
	cmds := make([]*redis.IntCmd, len(liveStatuses))
	_, err := m.opts.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, s := range liveStatuses {
			cmds[i] = p.ZCard(ctx, m.keys.Status(string(s)))
		}
		return nil
	})
	if err != nil {
		m.runsReadErrors.Inc()
		m.opts.Logger.Warn("metrics: reading the status indexes failed; goreactor_runs left out of this scrape",
			"event", "metrics.scrape_error", "error", err.Error())
		return
	}
	for i, s := range liveStatuses {
		ch <- prometheus.MustNewConstMetric(m.runsDesc, prometheus.GaugeValue, float64(cmds[i].Val()), string(s))
	}
}

// Compile-time checks of what Metrics implements (worker.Observer is
// checked in package worker's tests: worker imports this package).
var (
	_ reactor.Hook         = (*Metrics)(nil)
	_ sweeper.Observer     = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// NewRegistry returns a registry holding m and the Go runtime and process
// collectors: what a goreactor process (cmd/worker, cmd/sweeper) serves at
// /metrics.
func NewRegistry(m *Metrics) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
