package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// Where the soak keeps goreactor's keys and its own.
const (
	prefix  = "soak"        // goreactor's key prefix
	queue   = "soak"        // the asynq queue
	own     = "soak-check:" // the soak's own records
	mapStep = "fan"
)

// The soak's own records, all written with HSET under a fresh field, so that
// a command retried after a lost reply is counted once:
//
//	soak-check:fwd:<owner>     "<element>/<step>/<token>" -> "<pid>/<ms>"  one per forward execution
//	soak-check:undo:<owner>    the same per undo call
//	soak-check:comp:<owner>    the same per compensation that found its step's effect and reversed it
//	soak-check:finish:<owner>  "<token>" -> "<pid>/<ms>"  one per terminal event of the owner
//	soak-check:locklost        "<run>|<pid>|<token>" -> "<ms>"  one per lost run lock
//	soak-check:claims:<map>    "<kind>:<from>:<token>" -> "<to>/<pid>/<ms>"  one per claim
//	soak-check:violations      a list, written by the sweeper replicas
//	soak-check:notes           a list of what the sweeper replicas saw that is worth a look
//	soak-check:killed          a set of the pids the soak killed (added before the kill)
//	soak-check:kills           "<pid>" -> "<ms>" when the kill was done
//	soak-check:stats           sweeper counters
//
// The owner's own steps use element index -1.
func fwdKey(owner string) string    { return own + "fwd:" + owner }
func undoKey(owner string) string   { return own + "undo:" + owner }
func compKey(owner string) string   { return own + "comp:" + owner }
func finishKey(owner string) string { return own + "finish:" + owner }
func claimsKey(mapID string) string { return own + "claims:" + mapID }

const (
	lockLostKey   = own + "locklost"
	violationsKey = own + "violations"
	notesKey      = own + "notes"
	killedKey     = own + "killed"
	killsKey      = own + "kills"
	statsKey      = own + "stats"
)

// item is one element of an owner's map.
type item struct {
	Owner string `json:"o"`
	Index int    `json:"i"`
	Fail  bool   `json:"f"`
}

// recorder writes the soak's records from inside steps and hooks.
type recorder struct {
	rdb redis.UniversalClient
	pid string
}

func newRecorder(rdb redis.UniversalClient, pid int) *recorder {
	return &recorder{rdb: rdb, pid: strconv.Itoa(pid)}
}

func token() string {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// stamp is the value of a record: who wrote it, and when.
func (r *recorder) stamp() string { return r.pid + "/" + strconv.FormatInt(time.Now().UnixMilli(), 10) }

// mark records one execution (kind "fwd") or undo (kind "undo") of step of
// element index of owner. It is the step's only effect. Redis trouble is
// waited out until ctx ends (the run lock lost, which discards the step's
// outcome): an error here would fail the step, and infrastructure must not
// turn into a business failure.
func (r *recorder) mark(ctx context.Context, key string, index int, step string) error {
	field := fmt.Sprintf("%d/%s/%s", index, step, token())
	return persist(ctx, func(ctx context.Context) error { return r.rdb.HSet(ctx, key, field, r.stamp()).Err() })
}

// Step latencies, drawn at random after each step's effect, so that a kill
// often lands between an effect and its checkpoint (the step then runs, or
// is undone, again). Owner steps and one element step in a hundred outlast
// the sweepers' StaleAfter, so the sweepers see live runs and elements that
// look idle.
func pause(ctx context.Context, upTo time.Duration) {
	t := time.NewTimer(rand.N(upTo))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// effect marks one execution or undo, then takes its time.
func (r *recorder) effect(ctx context.Context, key string, index int, step string, upTo time.Duration) error {
	if err := r.mark(ctx, key, index, step); err != nil {
		return err
	}
	pause(ctx, upTo)
	return nil
}

// compensate is the Compensate of the soak's undoable steps: it reverses
// what step of element index of owner may have done. The engine calls it
// for a step whose Run was called but whose result was never recorded (a
// kill or a lost lock mid-step, the run then rolled back), and for a step
// whose Run failed: either way the effect may or may not have happened, so
// it looks for it first. Finding one, it reverses it, which it records
// (kind "comp") before taking its time like an undo; finding none, it has
// nothing to reverse and records nothing.
func (r *recorder) compensate(ctx context.Context, owner string, index int, step string, upTo time.Duration) error {
	var happened bool
	err := persist(ctx, func(ctx context.Context) error {
		var err error
		happened, err = r.happened(ctx, owner, index, step)
		return err
	})
	if err != nil || !happened {
		return err
	}
	return r.effect(ctx, compKey(owner), index, step, upTo)
}

// happened reports whether step of element index of owner has an effect on
// record: one execution marked at least.
func (r *recorder) happened(ctx context.Context, owner string, index int, step string) (bool, error) {
	it := r.rdb.HScan(ctx, fwdKey(owner), 0, fmt.Sprintf("%d/%s/*", index, step), 1000).Iterator()
	if it.Next(ctx) {
		return true, nil
	}
	return false, it.Err()
}

// elementLatency is the latency of an element step: up to 10 ms, and one
// time in a hundred up to 2 s.
func elementLatency() time.Duration {
	if rand.IntN(100) == 0 {
		return 2 * time.Second
	}
	return 10 * time.Millisecond
}

// ownerLatency bounds the latency of the owners' steps.
const ownerLatency = 2 * time.Second

// persist calls write until it succeeds or ctx ends, backing off from 20 ms
// to 500 ms.
func persist(ctx context.Context, write func(context.Context) error) error {
	delay := 20 * time.Millisecond
	for {
		err := write(ctx)
		if err == nil {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %v)", context.Cause(ctx), err)
		case <-t.C:
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// persistFor is persist bounded by limit, detached from ctx's cancellation:
// for hooks, which record what already happened.
func persistFor(ctx context.Context, limit time.Duration, write func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	defer cancel()
	_ = persist(ctx, write)
}

// hook records each terminal event of an owner run and each lost run lock.
func (r *recorder) hook() reactor.Hook {
	return reactor.HookFunc(func(ctx context.Context, ev reactor.Event) {
		switch ev.Kind {
		case reactor.EventRunCompleted, reactor.EventRunFailed, reactor.EventRunHalted,
			reactor.EventRunCancelled, reactor.EventRunAborted:
			if ev.Step != "" || isElementRun(ev.RunID) {
				return
			}
			field, val := token(), r.stamp()
			persistFor(ctx, 3*time.Second, func(ctx context.Context) error {
				return r.rdb.HSet(ctx, finishKey(ev.RunID), field, val).Err()
			})
		case reactor.EventRunLockLost:
			field, val := ev.RunID+"|"+r.pid+"|"+token(), strconv.FormatInt(time.Now().UnixMilli(), 10)
			persistFor(ctx, 3*time.Second, func(ctx context.Context) error {
				return r.rdb.HSet(ctx, lockLostKey, field, val).Err()
			})
		}
	})
}

// isElementRun reports whether id is a map element's run id.
func isElementRun(id string) bool { return strings.Contains(id, "~") }

type elemIn struct {
	Item item `json:"item"`
}

type prepIn struct {
	Owner string `json:"owner"`
}

type postIn struct {
	Owner string         `json:"owner"`
	Fail  bool           `json:"fail"`
	Fan   mapstep.Result `json:"fan"`
}

// definitions returns the element reactor (two undoable steps; the second
// fails for a failing item) and one owner reactor per shape: prep
// (undoable), the fan-out map, and post, which fails when the run's
// fail_after input says so. Every undoable step has a Compensate as well as
// an Undo: without one, the rollback of a step interrupted mid-Run could not
// reverse what it may have done, and would report it as a failure.
func (r *recorder) definitions() []*reactor.Definition {
	elemArgs := reactor.Bindings{"item": reactor.FromInput("item")}
	elem := reactor.MustDefine("soak.element",
		reactor.Input[item]("item", reactor.Required()),
		reactor.Step("a", reactor.StepConfig[elemIn, string]{
			Args: elemArgs,
			Run: func(ctx context.Context, in elemIn) (string, error) {
				return "a", r.effect(ctx, fwdKey(in.Item.Owner), in.Item.Index, "a", elementLatency())
			},
			Undo: func(ctx context.Context, in elemIn, _ string) error {
				return r.effect(ctx, undoKey(in.Item.Owner), in.Item.Index, "a", elementLatency())
			},
			Compensate: func(ctx context.Context, in elemIn, _ error) error {
				return r.compensate(ctx, in.Item.Owner, in.Item.Index, "a", elementLatency())
			},
		}),
		reactor.Step("b", reactor.StepConfig[elemIn, string]{
			Args:  elemArgs,
			After: []string{"a"},
			Run: func(ctx context.Context, in elemIn) (string, error) {
				if in.Item.Fail {
					return "", reactor.Permanent(fmt.Errorf("element %d of %s fails by plan", in.Item.Index, in.Item.Owner))
				}
				return "b", r.effect(ctx, fwdKey(in.Item.Owner), in.Item.Index, "b", elementLatency())
			},
			Undo: func(ctx context.Context, in elemIn, _ string) error {
				return r.effect(ctx, undoKey(in.Item.Owner), in.Item.Index, "b", elementLatency())
			},
			// Called with b's own failure too, when nothing happened.
			Compensate: func(ctx context.Context, in elemIn, _ error) error {
				return r.compensate(ctx, in.Item.Owner, in.Item.Index, "b", elementLatency())
			},
		}),
	)
	defs := []*reactor.Definition{elem}
	for _, s := range shapes {
		defs = append(defs, reactor.MustDefine(s.name(),
			reactor.Input[string]("owner", reactor.Required()),
			reactor.Input[[]item]("items", reactor.Required()),
			reactor.Input[bool]("fail_after", reactor.Default(false)),
			reactor.Step("prep", reactor.StepConfig[prepIn, string]{
				Args: reactor.Bindings{"owner": reactor.FromInput("owner")},
				Run: func(ctx context.Context, in prepIn) (string, error) {
					return "prep", r.effect(ctx, fwdKey(in.Owner), -1, "prep", ownerLatency)
				},
				Undo: func(ctx context.Context, in prepIn, _ string) error {
					return r.effect(ctx, undoKey(in.Owner), -1, "prep", ownerLatency)
				},
				Compensate: func(ctx context.Context, in prepIn, _ error) error {
					return r.compensate(ctx, in.Owner, -1, "prep", ownerLatency)
				},
			}),
			mapstep.Map(mapStep, mapstep.Config{
				Element:   elem,
				Items:     reactor.FromInput("items"),
				Input:     "item",
				FanOut:    true,
				BatchSize: s.Batch,
				Partial:   s.Partial,
				After:     []string{"prep"},
			}),
			reactor.Step("post", reactor.StepConfig[postIn, string]{
				Args: reactor.Bindings{"owner": reactor.FromInput("owner"), "fail": reactor.FromInput("fail_after"),
					"fan": reactor.FromStep(mapStep)},
				Run: func(ctx context.Context, in postIn) (string, error) {
					if in.Fail {
						return "", reactor.Permanent(fmt.Errorf("the step after the map of %s fails by plan", in.Owner))
					}
					return "post", r.effect(ctx, fwdKey(in.Owner), -1, "post", ownerLatency)
				},
			}),
		))
	}
	return defs
}
