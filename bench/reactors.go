package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// The benchmark's reactors. Every process that executes them (this one and
// the worker subprocesses) builds them with the same names from the same
// code, so parameters that vary between runs (size, undo latency, where to
// count undos) travel as inputs, never as definition constants. Only the
// batch size is part of a definition (mapstep.Config.BatchSize), hence one
// fan-out owner per batch size, named after it.

const (
	elementName = "bench.element"
	inlineName  = "bench.inline"
	mapStep     = "each"
	failStep    = "boom"
)

func fanOutName(batch int) string { return "bench.fanout.b" + strconv.Itoa(batch) }

// errBoom is the failure of the step after the map.
var errBoom = errors.New("bench: the step after the map fails, so that every element is rolled back")

// world is what the benchmark's step functions reach outside the run: the
// Redis client that records undos and failure times. It is separate from
// the engine's and asynq's clients so that its commands are never counted
// as goreactor's.
type world struct {
	rdb redis.UniversalClient
	// onFail, when set, is called by the failing step before it fails
	// (in-process runs only: the round-trip phase snapshots its counters
	// there, between the forward pass and the rollback).
	onFail func(ctx context.Context)
	// doubleUndo, when >= 0, records the undo of that item twice: a wrong
	// result injected by tests to prove that the checks catch it.
	doubleUndo int
	// bursts counts the enqueues of this process's actions; fakeBurst,
	// when > 0, makes the action that runs element 0 forward note that
	// many fake enqueues too (tests: an action over the bound must fail
	// the check).
	bursts    *burstCounter
	fakeBurst int
}

// elementIn is the element step's arguments.
type elementIn struct {
	Item   int    `json:"item"`
	WorkNS int64  `json:"work_ns"`
	UndoNS int64  `json:"undo_ns"`
	Counts string `json:"counts"`
}

// boomIn is the failing step's arguments.
type boomIn struct {
	Fail bool   `json:"fail"`
	Mark string `json:"mark"`
}

// rangeSource pages through the integers [0, n), n being the map's With
// argument "n": the owner never holds the items, whatever the map's size.
type rangeSource struct{}

func (rangeSource) Len(_ context.Context, with reactor.Args) (int, error) {
	return reactor.Arg[int](with, "n")
}

func (rangeSource) Page(_ context.Context, with reactor.Args, offset, limit int) ([]any, error) {
	n, err := reactor.Arg[int](with, "n")
	if err != nil {
		return nil, err
	}
	if offset < 0 || offset+limit > n {
		return nil, fmt.Errorf("bench: page [%d, %d) outside [0, %d)", offset, offset+limit, n)
	}
	out := make([]any, limit)
	for i := range out {
		out[i] = offset + i
	}
	return out, nil
}

// definitions builds the element reactor, the inline owner and one fan-out
// owner per batch size. Each owner maps the element over [0, n) and then,
// with input fail, fails in its step "boom", so every element is undone.
func (w *world) definitions(batches []int) (inline *reactor.Definition, fanOut map[int]*reactor.Definition, err error) {
	element, err := reactor.Define(elementName,
		reactor.Input[int]("item", reactor.Required()),
		reactor.Input[int]("n", reactor.Required()),
		reactor.Input[int64]("work_ns", reactor.Default[int64](0)),
		reactor.Input[int64]("undo_ns", reactor.Default[int64](0)),
		reactor.Input[string]("counts", reactor.Required()),
		reactor.Step("work", reactor.StepConfig[elementIn, int]{
			Args: reactor.Bindings{"item": reactor.FromInput("item"), "work_ns": reactor.FromInput("work_ns"),
				"undo_ns": reactor.FromInput("undo_ns"), "counts": reactor.FromInput("counts")},
			Run:  w.work,
			Undo: w.undo,
		}),
		reactor.Returns(reactor.FromStep("work")),
	)
	if err != nil {
		return nil, nil, err
	}
	owner := func(name string, fan bool, batch int) (*reactor.Definition, error) {
		return reactor.Define(name,
			reactor.Input[int]("n", reactor.Required()),
			reactor.Input[int64]("work_ns", reactor.Default[int64](0)),
			reactor.Input[int64]("undo_ns", reactor.Default[int64](0)),
			reactor.Input[string]("counts", reactor.Required()),
			reactor.Input[string]("mark", reactor.Required()),
			reactor.Input[bool]("fail", reactor.Default(true)),
			mapstep.Map(mapStep, mapstep.Config{
				Element: element,
				Pages:   rangeSource{},
				With: reactor.Bindings{"n": reactor.FromInput("n"), "work_ns": reactor.FromInput("work_ns"),
					"undo_ns": reactor.FromInput("undo_ns"), "counts": reactor.FromInput("counts")},
				FanOut:    fan,
				BatchSize: batch,
			}),
			reactor.Step(failStep, reactor.StepConfig[boomIn, int]{
				Args:  reactor.Bindings{"fail": reactor.FromInput("fail"), "mark": reactor.FromInput("mark")},
				After: []string{mapStep},
				Run:   w.boom,
			}),
		)
	}
	if inline, err = owner(inlineName, false, 0); err != nil {
		return nil, nil, err
	}
	fanOut = map[int]*reactor.Definition{}
	for _, b := range batches {
		if _, ok := fanOut[b]; ok {
			continue
		}
		if fanOut[b], err = owner(fanOutName(b), true, b); err != nil {
			return nil, nil, err
		}
	}
	return inline, fanOut, nil
}

// work is an element's forward step: it models its work as latency (none
// unless the run asks, as the forward comparison with bare asynq does) and
// returns the item.
func (w *world) work(ctx context.Context, in elementIn) (int, error) {
	if err := sleep(ctx, time.Duration(in.WorkNS)); err != nil {
		return 0, err
	}
	if w.fakeBurst > 0 && in.Item == 0 && w.bursts != nil {
		// The counts key ends with the benchmark run's id (see rollback).
		run := in.Counts[strings.LastIndex(in.Counts, ":")+1:]
		for i := range w.fakeBurst {
			w.bursts.note(ctx, run, fmt.Sprintf("fake:%s:%d", run, i))
		}
	}
	return in.Item, nil
}

// undo models an element's undo work as latency, then records it in Redis
// (HINCRBY of the element's field in the run's counts hash), so undos done
// in any process are counted in one place.
func (w *world) undo(ctx context.Context, in elementIn, _ int) error {
	if err := sleep(ctx, time.Duration(in.UndoNS)); err != nil {
		return err
	}
	field := strconv.Itoa(in.Item)
	if err := w.rdb.HIncrBy(ctx, in.Counts, field, 1).Err(); err != nil {
		return fmt.Errorf("bench: record the undo of element %d: %w", in.Item, err)
	}
	if in.Item == w.doubleUndo {
		return w.rdb.HIncrBy(ctx, in.Counts, field, 1).Err()
	}
	return nil
}

// boom fails when asked to, after recording when (the start of the
// rollback) under its mark key.
func (w *world) boom(ctx context.Context, in boomIn) (int, error) {
	if !in.Fail {
		return 0, nil
	}
	if err := w.rdb.SetNX(ctx, in.Mark, time.Now().UnixNano(), 0).Err(); err != nil {
		return 0, fmt.Errorf("bench: record the failure time: %w", err)
	}
	if w.onFail != nil {
		w.onFail(ctx)
	}
	return 0, reactor.Permanent(errBoom)
}

// sleep is modelled work: d of latency, cut short by ctx. The element steps
// and the bare asynq handler share it, so both sides wait alike.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
