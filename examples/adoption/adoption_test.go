package adoption_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// ---- the team's code: types, an order saga, a fan-out label printer

type ReserveIn struct {
	Item string `json:"item"`
	Qty  int    `json:"qty"`
}

type Reservation struct {
	ID  string `json:"id"`
	Qty int    `json:"qty"`
}

type ChargeIn struct {
	Reservation string `json:"reservation"`
	Card        string `json:"card"`
}

type LabelIn struct {
	Order string `json:"order"`
}

type CountIn struct {
	Labels mapstep.Results[string] `json:"labels"`
}

// shop records what the saga did to the outside world.
type shop struct {
	mu       sync.Mutex
	reserved map[string]int
	charged  map[string]bool
	seen     []reactor.RunInfo
}

func (s *shop) note(ctx context.Context) {
	if info, ok := reactor.RunInfoFrom(ctx); ok {
		s.mu.Lock()
		s.seen = append(s.seen, info)
		s.mu.Unlock()
	}
}

func (s *shop) definitions() (order, labels *reactor.Definition) {
	order = reactor.MustDefine("adoption.order",
		reactor.Input[string]("item", reactor.Required()),
		reactor.Input[int]("qty", reactor.Default(1)),
		reactor.Input[string]("card", reactor.Required()),
		reactor.Step("reserve", reactor.StepConfig[ReserveIn, Reservation]{
			Args: reactor.Bindings{"item": reactor.FromInput("item"), "qty": reactor.FromInput("qty")},
			Run: func(ctx context.Context, in ReserveIn) (Reservation, error) {
				s.note(ctx)
				info, _ := reactor.RunInfoFrom(ctx)
				s.mu.Lock()
				defer s.mu.Unlock()
				id := info.RunID + "/" + in.Item
				s.reserved[id] += in.Qty
				return Reservation{ID: id, Qty: in.Qty}, nil
			},
			Undo: func(ctx context.Context, _ ReserveIn, r Reservation) error {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.reserved[r.ID] -= r.Qty
				return nil
			},
		}),
		reactor.Step("charge", reactor.StepConfig[ChargeIn, string]{
			Args: reactor.Bindings{"reservation": reactor.FromStep("reserve", "id"), "card": reactor.FromInput("card")},
			Run: func(ctx context.Context, in ChargeIn) (string, error) {
				s.note(ctx)
				if in.Card == "declined" {
					return "", reactor.Permanent(errors.New("card declined"))
				}
				s.mu.Lock()
				defer s.mu.Unlock()
				s.charged[in.Reservation] = true
				return "receipt-" + in.Reservation, nil
			},
		}),
		reactor.Returns(reactor.FromStep("charge")),
	)
	label := reactor.MustDefine("adoption.label",
		reactor.Input[string]("order", reactor.Required()),
		reactor.Step("print", reactor.StepConfig[LabelIn, string]{
			Args: reactor.Bindings{"order": reactor.FromInput("order")},
			Run: func(ctx context.Context, in LabelIn) (string, error) {
				s.note(ctx)
				return "label:" + in.Order, nil
			},
		}),
		reactor.Returns(reactor.FromStep("print")),
	)
	labels = reactor.MustDefine("adoption.labels",
		reactor.Input[[]string]("orders", reactor.Required()),
		mapstep.Map("print_all", mapstep.Config{Element: label, Items: reactor.FromInput("orders"), Input: "order", FanOut: true, BatchSize: 10}),
		reactor.Step("count", reactor.StepConfig[CountIn, int]{
			Args: reactor.Bindings{"labels": reactor.FromStep("print_all")},
			Run: func(ctx context.Context, in CountIn) (int, error) {
				values, err := in.Labels.Values(ctx)
				return len(values), err
			},
		}),
		reactor.Returns(reactor.FromStep("count")),
	)
	return order, labels
}

// ---- the test

// redisAddr is the Redis the team's tests use: REDIS_URL, else localhost.
func redisAddr(t *testing.T) *redis.Options {
	t.Helper()
	url := os.Getenv("REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("REDIS_URL: %v", err)
	}
	c := redis.NewClient(opts)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Skipf("no Redis answers at %s: %v", url, err)
	}
	return opts
}

func random() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func TestAdoptionThroughThePublicAPI(t *testing.T) {
	opts := redisAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix, queue, other := "adoption-"+random(), "adoption-"+random(), "adoption-vip-"+random()
	s := &shop{reserved: map[string]int{}, charged: map[string]bool{}}
	order, labels := s.definitions()
	t.Cleanup(func() { cleanUp(t, opts, prefix, queue, other) })

	// The team's worker: their definitions and one call, as in cmd/worker.
	workerCtx, stopWorker := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() {
		stopped <- worker.Run(workerCtx, worker.Options{
			Definitions: []*reactor.Definition{order, labels},
			Args: []string{"-redis", "redis://" + opts.Addr + "/" + strconv.Itoa(opts.DB), "-prefix", prefix,
				"-queue", queue + "," + other, "-concurrency", "8"},
			Getenv: func(string) string { return "" },
			Stderr: io.Discard,
		})
	}()

	// The team's API process: an engine that hands runs to the workers.
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	engine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: worker.NewClient(rdb, queue),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.Register(order, labels); err != nil {
		t.Fatal(err)
	}

	// An order saga on the workers, on its own queue, with a deadline.
	res, err := engine.Enqueue(ctx, order, map[string]any{"item": "book", "qty": 2, "card": "visa"},
		reactor.WithRunID("order-1"), reactor.WithQueue(other), reactor.WithTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	res, err = engine.Wait(ctx, res.RunID)
	if err != nil {
		t.Fatal(err)
	}
	receipt, err := reactor.ValueOf[string](res)
	if err != nil || res.Status != reactor.StatusCompleted || receipt != "receipt-order-1/book" {
		t.Fatalf("order-1: %s %q %v %v", res.Status, receipt, err, res.Failure)
	}

	// A declined card rolls the reservation back.
	res, err = engine.Run(ctx, order, map[string]any{"item": "pen", "card": "declined"}, reactor.WithRunID("order-2"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != reactor.StatusFailed || res.Failure.Step != "charge" {
		t.Fatalf("order-2: %s %v", res.Status, res.Failure)
	}
	s.mu.Lock()
	left := s.reserved["order-2/pen"]
	s.mu.Unlock()
	if left != 0 {
		t.Fatalf("order-2's reservation was not released: %d left", left)
	}

	// A typed fan-out map: Run runs to the end, waiting on the workers.
	orders := make([]string, 35)
	for i := range orders {
		orders[i] = "o" + strconv.Itoa(i)
	}
	res, err = engine.Run(ctx, labels, map[string]any{"orders": orders}, reactor.WithRunID("labels-1"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := reactor.ValueOf[int](res)
	if err != nil || res.Status != reactor.StatusCompleted || n != len(orders) {
		t.Fatalf("labels-1: %s %d %v %v", res.Status, n, err, res.Failure)
	}

	// What the steps learned of where they ran.
	s.mu.Lock()
	var elements, orderSteps int
	for _, info := range s.seen {
		if info.TraceID == "" || info.Attempt < 1 {
			t.Errorf("run info without a trace id or attempt: %+v", info)
		}
		switch {
		case info.Element != nil:
			elements++
			if info.Element.Owner != "labels-1" || info.Element.Step != "print_all" {
				t.Errorf("element run info: %+v", info.Element)
			}
		case strings.HasPrefix(info.RunID, "order-"):
			orderSteps++
			if info.Deadline.IsZero() && info.RunID == "order-1" {
				t.Errorf("order-1 has a deadline: %+v", info)
			}
		}
	}
	s.mu.Unlock()
	if elements != len(orders) || orderSteps != 4 {
		t.Fatalf("run infos: %d elements, %d order steps", elements, orderSteps)
	}

	stopWorker()
	if err := <-stopped; err != nil {
		t.Fatalf("worker: %v", err)
	}
}

// cleanUp deletes the test's keys and queues from the shared Redis.
func cleanUp(t *testing.T, opts *redis.Options, prefix string, queues ...string) {
	ctx := context.Background()
	c := redis.NewClient(opts)
	defer c.Close()
	patterns := []string{prefix + ":*"}
	for _, q := range queues {
		patterns = append(patterns, "asynq:{"+q+"}:*")
		c.SRem(ctx, "asynq:queues", q)
	}
	for _, pat := range patterns {
		iter := c.Scan(ctx, 0, pat, 1000).Iterator()
		for iter.Next(ctx) {
			c.Unlink(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("clean up %s: %v", pat, err)
		}
	}
}

// TestAdoptionUsesNoInternalPackage keeps this package honest: it is the
// public API or nothing.
func TestAdoptionUsesNoInternalPackage(t *testing.T) {
	for _, name := range []string{"adoption_test.go", "doc.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if strings.Contains(imp.Path.Value, "/internal/") {
				t.Errorf("%s imports %s", name, imp.Path.Value)
			}
		}
	}
}
