package reactortest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/reactortest"
	"github.com/goreactor/goreactor/worker"
)

// bookings records what the trip saga's steps did, per run.
type bookings struct {
	mu   sync.Mutex
	runs map[string][]string
}

var tripLog = &bookings{runs: map[string][]string{}}

func (l *bookings) add(city, s string) {
	l.mu.Lock()
	l.runs[city] = append(l.runs[city], s)
	l.mu.Unlock()
}

func (l *bookings) of(city string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.runs[city])
}

type tripIn struct {
	City string `json:"city"`
}

// book is a step that books kind in the trip's city; it fails for a city
// in failFor.
func book(kind string, failFor string, after ...string) reactor.Part {
	return reactor.Step(kind, reactor.StepConfig[tripIn, string]{
		Args:  reactor.Bindings{"city": reactor.FromInput("city")},
		After: after,
		Run: func(_ context.Context, in tripIn) (string, error) {
			tripLog.add(in.City, "book "+kind)
			if failFor != "" && strings.HasPrefix(in.City, failFor) {
				return "", errors.New("no " + kind + " in " + in.City)
			}
			return kind + "-" + in.City, nil
		},
		Undo: func(_ context.Context, in tripIn, booking string) error {
			tripLog.add(in.City, "cancel "+booking)
			return nil
		},
	})
}

// trip books a flight, then a hotel, then a car; there are no cars in
// Atlantis.
//
// Tests name their cities with unique(), so that their bookings do not mix
// in tripLog when tests run in parallel or again (-count).
var trip = reactor.MustDefine("trip",
	reactor.Input[string]("city", reactor.Required()),
	book("flight", ""),
	book("hotel", "", "flight"),
	book("car", "Atlantis", "hotel"),
	reactor.Returns(reactor.FromStep("car")),
)

func unique(city string) string { return city + "-" + reactor.NewRunID()[:8] }

func TestFailedSagaIsUndoneNewestFirst(t *testing.T) {
	t.Parallel()
	h := reactortest.New(t, trip)
	atlantis := unique("Atlantis")
	res, err := h.Run(context.Background(), trip, map[string]any{"city": atlantis})
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.Equal(t, "car", res.Failure.Step)

	h.RequireStatus(t, res.RunID, reactor.StatusFailed)
	h.RequireUndone(t, res.RunID, "hotel", "flight")
	require.Equal(t, []string{"book flight", "book hotel", "book car", "cancel hotel-" + atlantis, "cancel flight-" + atlantis},
		tripLog.of(atlantis))

	// Run went through the worker: one task processed on the harness's queue.
	insp := asynq.NewInspectorFromRedisClient(h.Redis)
	require.Eventually(t, func() bool {
		qi, err := insp.GetQueueInfo(h.Queue)
		return err == nil && qi.ProcessedTotal == 1 && qi.Size == 0
	}, 5*time.Second, 5*time.Millisecond)
}

func TestCompletedSagaInlineAndInWorker(t *testing.T) {
	t.Parallel()
	h := reactortest.New(t, trip)
	ctx := context.Background()

	oslo, lima := unique("Oslo"), unique("Lima")
	res, err := h.RunInline(ctx, trip, map[string]any{"city": oslo}, reactor.WithRunID("inline-oslo"))
	require.NoError(t, err)
	require.Equal(t, "inline-oslo", res.RunID)
	h.RequireCompleted(t, res.RunID, "flight", "hotel", "car")
	h.RequireCompleted(t, res.RunID)
	h.RequireUndone(t, res.RunID)
	v, err := reactor.ValueOf[string](res)
	require.NoError(t, err)
	require.Equal(t, "car-"+oslo, v)

	res, err = h.Run(ctx, trip, map[string]any{"city": lima})
	require.NoError(t, err)
	h.RequireCompleted(t, res.RunID, "flight", "hotel", "car")
	require.Equal(t, "completed", string(h.Get(t, res.RunID).Status))

	// The same id again returns the finished run without running it.
	again, err := h.Run(ctx, trip, map[string]any{"city": lima}, reactor.WithRunID(res.RunID))
	require.NoError(t, err)
	require.Equal(t, res.Value, again.Value)
	require.Equal(t, []string{"book flight", "book hotel", "book car"}, tripLog.of(lima))
}

// Two harnesses never see each other's runs.
func TestHarnessesAreIsolated(t *testing.T) {
	t.Parallel()
	h1, h2 := reactortest.New(t, trip), reactortest.New(t, trip)
	require.NotEqual(t, h1.Prefix, h2.Prefix)
	require.NotEqual(t, h1.Queue, h2.Queue)
	res, err := h1.Run(context.Background(), trip, map[string]any{"city": unique("Rome")}, reactor.WithRunID("shared"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	_, err = h2.Engine.Get(context.Background(), "shared")
	require.ErrorIs(t, err, reactor.ErrNotFound)
}

func TestOptions(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	release := make(chan struct{})
	slow := reactor.MustDefine("slow", reactor.Step("wait", reactor.StepConfig[reactor.Args, int]{
		Run: func(ctx context.Context, _ reactor.Args) (int, error) {
			select {
			case <-release:
				return 1, nil
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		},
	}))
	h := reactortest.NewWithOptions(t, reactortest.Options{
		Engine: func(c *reactor.Config) {
			c.Prefix = "ignored" // the harness keeps its own
			c.Middleware = append(c.Middleware, func(ctx context.Context, _ reactor.Call, next func(context.Context) error) error {
				calls.Add(1)
				return next(ctx)
			})
		},
		Worker:  func(c *worker.Config) { c.Concurrency = 2 },
		Timeout: 100 * time.Millisecond,
	}, slow)
	require.NotEqual(t, "ignored", h.Prefix)

	res, err := h.Run(context.Background(), slow, nil, reactor.WithRunID("slow-1"))
	require.ErrorIs(t, err, context.DeadlineExceeded, "Run gives up after Options.Timeout")
	require.Nil(t, res)
	close(release)
	final, err := h.Wait(context.Background(), "slow-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)
	require.Equal(t, int32(1), calls.Load())
}

// fakeT records the failure an assertion reports instead of ending the
// test.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(format string, args ...any) {
	if f.msg == "" {
		f.msg = fmt.Sprintf(format, args...)
	}
}

// The assertions fail with messages that say what the run did.
func TestAssertionsReportWhatHappened(t *testing.T) {
	t.Parallel()
	h := reactortest.New(t, trip)
	ctx := context.Background()
	failed, err := h.Run(ctx, trip, map[string]any{"city": unique("Atlantis")}, reactor.WithRunID("atl"))
	require.NoError(t, err)
	done, err := h.Run(ctx, trip, map[string]any{"city": unique("Paris")}, reactor.WithRunID("par"))
	require.NoError(t, err)

	check := func(assert func(testing.TB), want ...string) {
		t.Helper()
		ft := &fakeT{TB: t}
		assert(ft)
		if len(want) == 0 {
			require.Empty(t, ft.msg)
			return
		}
		for _, w := range want {
			require.Contains(t, ft.msg, w)
		}
	}
	check(func(ft testing.TB) { h.RequireStatus(ft, failed.RunID, reactor.StatusFailed) })
	check(func(ft testing.TB) { h.RequireStatus(ft, failed.RunID, reactor.StatusCompleted) },
		`run atl of "trip" is failed, want completed`,
		"completed steps: [flight, hotel]",
		`failure: reactor: step "car" failed: no car in Atlantis-`,
		"undo hotel: compensated", "undo flight: compensated")
	check(func(ft testing.TB) { h.RequireUndone(ft, failed.RunID, "flight", "hotel") },
		`run atl of "trip" undid [hotel, flight], want [flight, hotel] (newest first)`)
	check(func(ft testing.TB) { h.RequireUndone(ft, done.RunID, "car") },
		`run par of "trip" undid nothing, want [car]`)
	check(func(ft testing.TB) { h.RequireCompleted(ft, failed.RunID) },
		`run atl of "trip" is failed, want completed`)
	check(func(ft testing.TB) { h.RequireCompleted(ft, done.RunID, "flight", "car") },
		`run par of "trip" completed steps [flight, hotel, car], want [flight, car]`)
	check(func(ft testing.TB) { h.RequireCompleted(ft, done.RunID, "flight", "hotel", "car") })
	check(func(ft testing.TB) { h.RequireStatus(ft, "nope", reactor.StatusFailed) },
		"reactortest: read run nope:", "not found")
}

func Example() {
	// In a _test.go file, with the redis-server reactortest may start
	// stopped at the end:
	//
	//	func TestMain(m *testing.M) { reactortest.Main(m) }
	testTrip := func(t *testing.T) {
		t.Parallel()
		h := reactortest.New(t, trip)
		res, err := h.Run(context.Background(), trip, map[string]any{"city": "Atlantis"})
		if err != nil {
			t.Fatal(err)
		}
		h.RequireStatus(t, res.RunID, reactor.StatusFailed)
		h.RequireUndone(t, res.RunID, "hotel", "flight") // newest first
	}
	_ = testTrip
}
