package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/metrics"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// value reads one series of m through a registry, as a scrape would.
func value(t *testing.T, m *metrics.Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(m))
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, s := range f.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range s.GetLabel() {
					found = found || lp.GetName() == k && lp.GetValue() == v
				}
				if !found {
					continue next
				}
			}
			switch {
			case s.Counter != nil:
				return s.GetCounter().GetValue()
			case s.Gauge != nil:
				return s.GetGauge().GetValue()
			case s.Histogram != nil:
				return float64(s.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}

// Events count where they belong: root runs only for runs started and
// finished (a composed child's run events carry its step, an element's
// carry Element), a resume from pending is a start, and undo outcomes and
// step durations by label.
func TestEventsCounted(t *testing.T) {
	t.Parallel()
	m := metrics.New(metrics.Options{})
	ctx := context.Background()
	for _, e := range []reactor.Event{
		{Kind: reactor.EventRunStarted, Reactor: "order", Status: reactor.StatusRunning},
		{Kind: reactor.EventRunResumed, Reactor: "order", Status: reactor.StatusPending},
		{Kind: reactor.EventRunResumed, Reactor: "order", Status: reactor.StatusRunning},              // a later resume
		{Kind: reactor.EventRunStarted, Reactor: "child", Step: "pay", Status: reactor.StatusRunning}, // composed child
		{Kind: reactor.EventRunStarted, Reactor: "el", Element: true},
		{Kind: reactor.EventRunCompleted, Reactor: "el", Element: true, Status: reactor.StatusCompleted},
		{Kind: reactor.EventRunFailed, Reactor: "child", Step: "pay", Status: reactor.StatusFailed},
		{Kind: reactor.EventRunFailed, Reactor: "order", Status: reactor.StatusFailed},
		{Kind: reactor.EventRunLockLost, Reactor: "el", Element: true},
		{Kind: reactor.EventStepStarted, Reactor: "order", Step: "charge", Attempt: 1},
		{Kind: reactor.EventStepRetrying, Reactor: "order", Step: "charge", Attempt: 1},
		{Kind: reactor.EventStepStarted, Reactor: "order", Step: "charge", Attempt: 2},
		{Kind: reactor.EventStepFailed, Reactor: "order", Step: "charge", Attempt: 2, Duration: 30 * time.Millisecond},
		{Kind: reactor.EventStepCompleted, Reactor: "order", Step: "reserve", Duration: time.Millisecond},
		{Kind: reactor.EventStepCompleted, Reactor: "order", Step: "each"}, // a construct: no duration
		{Kind: reactor.EventStepUndone, Reactor: "order", Step: "reserve"},
		{Kind: reactor.EventStepUndoFailed, Reactor: "el", Step: "reserve"},
		{Kind: reactor.EventStepCompensated, Reactor: "order", Step: "charge"},
		{Kind: reactor.EventCompensateFail, Reactor: "order", Step: "ship"},
		{Kind: reactor.EventMapBatchClaimed, Reactor: "order", Step: "each"},
		{Kind: reactor.EventMapBatchClaimed, Reactor: "order", Step: "each"},
		{Kind: reactor.EventMapRollbackBatchClaimed, Reactor: "order", Step: "each"},
		{Kind: reactor.EventReplicaAcksShort},
	} {
		m.OnEvent(ctx, e)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"goreactor_runs_started_total", map[string]string{"reactor": "order"}, 2},
		{"goreactor_runs_started_total", map[string]string{"reactor": "child"}, -1},
		{"goreactor_runs_started_total", map[string]string{"reactor": "el"}, -1},
		{"goreactor_runs_finished_total", map[string]string{"reactor": "order", "status": "failed"}, 1},
		{"goreactor_runs_finished_total", map[string]string{"reactor": "child"}, -1},
		{"goreactor_map_elements_finished_total", map[string]string{"reactor": "el", "status": "completed"}, 1},
		{"goreactor_lock_lost_total", nil, 1},
		{"goreactor_replica_acks_short_total", nil, 1},
		{"goreactor_step_attempts_total", map[string]string{"reactor": "order", "step": "charge"}, 2},
		{"goreactor_step_retries_total", map[string]string{"reactor": "order", "step": "charge"}, 1},
		{"goreactor_step_duration_seconds", map[string]string{"step": "charge", "outcome": "failed"}, 1},
		{"goreactor_step_duration_seconds", map[string]string{"step": "reserve", "outcome": "completed"}, 1},
		{"goreactor_step_duration_seconds", map[string]string{"step": "each"}, -1},
		{"goreactor_undo_total", map[string]string{"reactor": "order", "kind": "undo", "outcome": "ok"}, 1},
		{"goreactor_undo_total", map[string]string{"reactor": "el", "kind": "undo", "outcome": "failed"}, 1},
		{"goreactor_undo_total", map[string]string{"reactor": "order", "kind": "compensate", "outcome": "ok"}, 1},
		{"goreactor_undo_total", map[string]string{"reactor": "order", "kind": "compensate", "outcome": "failed"}, 1},
		{"goreactor_undo_duration_seconds", map[string]string{"reactor": "order", "kind": "undo", "outcome": "ok"}, 1},
		{"goreactor_undo_duration_seconds", map[string]string{"reactor": "order", "kind": "compensate", "outcome": "failed"}, 1},
		{"goreactor_map_batches_claimed_total", map[string]string{"reactor": "order", "kind": "forward"}, 2},
		{"goreactor_map_batches_claimed_total", map[string]string{"reactor": "order", "kind": "rollback"}, 1},
	} {
		require.Equal(t, c.want, value(t, m, c.name, c.labels), "%s%v", c.name, c.labels)
	}
}

// Task outcomes, owner resumes, snoozes and sweeper passes go to their
// series; the series alerts rely on exist at 0 before anything happened.
func TestObservers(t *testing.T) {
	t.Parallel()
	m := metrics.New(metrics.Options{})
	require.Equal(t, 0.0, value(t, m, "goreactor_map_rollback_jobs_total", map[string]string{"outcome": "error"}))
	require.Equal(t, 0.0, value(t, m, "goreactor_owner_resumes_total", map[string]string{"kind": "rollback"}))

	m.ObserveTask(metrics.TaskElement, metrics.OutcomeDone)
	m.ObserveTask(metrics.TaskElement, metrics.OutcomeSnoozed)
	m.ObserveTask(metrics.TaskRollback, metrics.OutcomeDropped)
	m.ObserveTask(metrics.TaskRun, metrics.OutcomeError)
	m.ObserveOwnerResume(metrics.ResumeForward)
	m.ObservePass(sweeper.Report{}, nil) // skipped: another replica led
	m.ObservePass(sweeper.Report{Leader: true, Duration: time.Second, Runs: sweeper.RunReport{Woken: 2},
		Maps: sweeper.MapReport{Elements: 3, Claims: 1}}, errors.New("one map failed"))

	require.Equal(t, 1.0, value(t, m, "goreactor_map_element_tasks_total", map[string]string{"outcome": "done"}))
	require.Equal(t, 1.0, value(t, m, "goreactor_map_element_tasks_total", map[string]string{"outcome": "snoozed"}))
	require.Equal(t, 1.0, value(t, m, "goreactor_snoozes_total", map[string]string{"task": "element"}))
	require.Equal(t, 0.0, value(t, m, "goreactor_snoozes_total", map[string]string{"task": "run"}))
	require.Equal(t, 1.0, value(t, m, "goreactor_map_rollback_jobs_total", map[string]string{"outcome": "dropped"}))
	require.Equal(t, 1.0, value(t, m, "goreactor_run_tasks_total", map[string]string{"outcome": "error"}))
	require.Equal(t, 1.0, value(t, m, "goreactor_owner_resumes_total", map[string]string{"kind": "forward"}))
	require.Equal(t, 1.0, value(t, m, "goreactor_sweeper_passes_total", nil))
	require.Equal(t, 1.0, value(t, m, "goreactor_sweeper_skipped_total", nil))
	require.Equal(t, 1.0, value(t, m, "goreactor_sweeper_pass_errors_total", nil))
	require.Equal(t, 1.0, value(t, m, "goreactor_sweeper_pass_duration_seconds", nil))
	require.Equal(t, 2.0, value(t, m, "goreactor_sweeper_recoveries_total", map[string]string{"kind": "run"}))
	require.Equal(t, 3.0, value(t, m, "goreactor_sweeper_recoveries_total", map[string]string{"kind": "element"}))
	require.Equal(t, 1.0, value(t, m, "goreactor_sweeper_recoveries_total", map[string]string{"kind": "claim"}))
}

// The goreactor_runs gauge is the size of each non-terminal status index
// at scrape time; without a Client it is not exported.
func TestRunsGaugeReadsTheStatusIndexes(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	k := keys.New(prefix)
	ctx := t.Context()
	for status, n := range map[string]int{"pending": 2, "rolling_back": 3, "completed": 5} {
		for i := range n {
			require.NoError(t, rdb.ZAdd(ctx, k.Status(status), redis.Z{Score: 1, Member: status + string(rune('a'+i))}).Err())
		}
	}
	m := metrics.New(metrics.Options{Client: rdb, Prefix: prefix})
	require.Equal(t, 2.0, value(t, m, "goreactor_runs", map[string]string{"status": "pending"}))
	require.Equal(t, 3.0, value(t, m, "goreactor_runs", map[string]string{"status": "rolling_back"}))
	require.Equal(t, 0.0, value(t, m, "goreactor_runs", map[string]string{"status": "running"}))
	require.Equal(t, -1.0, value(t, m, "goreactor_runs", map[string]string{"status": "completed"}), "terminal statuses are not live")
	require.Equal(t, 4, testutil.CollectAndCount(m, "goreactor_runs"))

	require.Equal(t, 0, testutil.CollectAndCount(metrics.New(metrics.Options{}), "goreactor_runs"))
}

// A scrape while Redis does not answer leaves the gauge out, counts the
// failure and still serves every other metric.
func TestRunsGaugeWithoutRedis(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	m := metrics.New(metrics.Options{Client: rdb, ScrapeTimeout: time.Second, Logger: discardLogger()})
	require.Equal(t, 0, testutil.CollectAndCount(m, "goreactor_runs"))
	require.Equal(t, 2.0, value(t, m, "goreactor_runs_read_errors_total", nil), "two scrapes, two failed reads")
	require.Equal(t, 0.0, value(t, m, "goreactor_lock_lost_total", nil))
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Interrupt events count by reactor and step, and a continue observes how
// long the run was paused, in the pause buckets (hours and days fit).
func TestInterruptEventsCounted(t *testing.T) {
	t.Parallel()
	m := metrics.New(metrics.Options{})
	ctx := context.Background()
	for _, e := range []reactor.Event{
		{Kind: reactor.EventRunPaused, Reactor: "order", Step: "approve", Status: reactor.StatusPaused},
		{Kind: reactor.EventRunPaused, Reactor: "order", Step: "approve", Status: reactor.StatusPaused},
		{Kind: reactor.EventPayloadReceived, Reactor: "order", Step: "approve"},
		{Kind: reactor.EventPayloadReceived, Reactor: "order", Step: "approve"},
		{Kind: reactor.EventPayloadReceived, Reactor: "order", Step: "approve"},
		{Kind: reactor.EventPayloadRefused, Reactor: "order", Step: "approve", Err: errors.New("no approver")},
		{Kind: reactor.EventRunContinued, Reactor: "order", Step: "approve", Duration: 90 * time.Minute},
		{Kind: reactor.EventInterruptTimedOut, Reactor: "order", Step: "approve", Status: reactor.StatusPaused},
	} {
		m.OnEvent(ctx, e)
	}
	l := map[string]string{"reactor": "order", "step": "approve"}
	require.Equal(t, 2.0, value(t, m, "goreactor_interrupt_pauses_total", l))
	require.Equal(t, 3.0, value(t, m, "goreactor_interrupt_payloads_received_total", l))
	require.Equal(t, 1.0, value(t, m, "goreactor_interrupt_payloads_refused_total", l))
	require.Equal(t, 1.0, value(t, m, "goreactor_interrupt_continued_total", l))
	require.Equal(t, 1.0, value(t, m, "goreactor_interrupt_timeouts_total", l))
	require.Equal(t, 1.0, value(t, m, "goreactor_interrupt_paused_seconds", l))

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(m))
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != "goreactor_interrupt_paused_seconds" {
			continue
		}
		hist := f.GetMetric()[0].GetHistogram()
		require.InDelta(t, 5400, hist.GetSampleSum(), 0.001)
		for _, b := range hist.GetBucket() {
			// 90 minutes is past the 1-hour bucket and within the 4-hour one.
			switch b.GetUpperBound() {
			case 3600:
				require.Equal(t, uint64(0), b.GetCumulativeCount())
			case 4 * 3600:
				require.Equal(t, uint64(1), b.GetCumulativeCount())
			}
		}
	}
}

func TestLimitEventsCounted(t *testing.T) {
	t.Parallel()
	m := metrics.New(metrics.Options{})
	ctx := context.Background()
	full := &reactor.LimitError{RunID: "r1", Limit: "partner", Key: "acme", Kind: "concurrency"}
	for _, e := range []reactor.Event{
		{Kind: reactor.EventLimitCancelled, RunID: "r1", Reactor: "call", Step: "post", Err: full},
		{Kind: reactor.EventLimitCancelled, RunID: "r0", Reactor: "call", Step: "post", Err: fmt.Errorf("cancelled by run r1: %w", full)},
		{Kind: reactor.EventLimitCancelled, RunID: "r9", Reactor: "call", Step: "post", Err: fmt.Errorf("cancelled by run r1: %w", full)},
		{Kind: reactor.EventLimitWaited, Reactor: "call", Step: "post", Err: full},
		{Kind: reactor.EventLimitWaited, Reactor: "call", Step: "post", Err: full},
		{Kind: reactor.EventLimitRefused, Reactor: "call", Step: "post", Err: full},
		{Kind: reactor.EventLimitTaken, Reactor: "call", Step: "post"},
	} {
		m.OnEvent(ctx, e)
	}
	l := map[string]string{"limit": "partner", "kind": "concurrency"}
	require.Equal(t, 2.0, value(t, m, "goreactor_limit_waits_total", l))
	require.Equal(t, 1.0, value(t, m, "goreactor_limit_refusals_total", l))
	require.Equal(t, 1.0, value(t, m, "goreactor_limit_holds_total", map[string]string{"reactor": "call", "step": "post"}))
	require.Equal(t, 1.0, value(t, m, "goreactor_limit_cancels_total", map[string]string{"limit": "partner", "policy": "cancel-newest"}))
	require.Equal(t, 2.0, value(t, m, "goreactor_limit_cancels_total", map[string]string{"limit": "partner", "policy": "cancel-oldest"}))
}
