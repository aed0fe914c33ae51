package dashboard

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// GuardFixture is the clobber scenario of reactor's guard tests, in a
// composed child so that its entry ids hold a slash and a '#': child
// "book" sets Key twice with guarded steps fix1 and fix2 ("book/fix1#1",
// "book/fix2#2"), then the parent's step support changes Key behind the
// run's back and fails. The rollback writes nothing: book/fix2 needs a
// person, book/fix1 is blocked by it.
type GuardFixture struct {
	RDB redis.UniversalClient
	Key string
	Def *reactor.Definition
}

// Values Key takes: Old before the run, New after fix1, Newer after fix2,
// Clobbered after support.
const (
	GuardOld       = "ada@old.test"
	GuardNew       = "ada@new.test"
	GuardNewer     = "ada@newer.test"
	GuardClobbered = "ada@corrected.test"
)

// NewGuardFixture defines reactor name (and its child name+"-book") on key.
func NewGuardFixture(rdb redis.UniversalClient, name, key string) *GuardFixture {
	return NewGuardFixtureWith(rdb, name, key)
}

// NewGuardFixtureWith is NewGuardFixture with more parts in the parent
// (inputs, say).
func NewGuardFixtureWith(rdb redis.UniversalClient, name, key string, parts ...reactor.Part) *GuardFixture {
	f := &GuardFixture{RDB: rdb, Key: key}
	g := reactor.Guarded(reactor.GuardConfig[string]{
		Probe: func(ctx context.Context, k string) (string, error) { return f.Get(ctx), nil },
		Restore: func(ctx context.Context, k, before, _ string) (reactor.RestoreResult, error) {
			return reactor.RestoreWritten, rdb.Set(ctx, k, before, 0).Err()
		},
	})
	set := func(step, value string, after ...string) reactor.Part {
		return reactor.Step(step, reactor.StepConfig[reactor.Args, string]{
			After: after,
			Guard: g,
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				before := f.Get(ctx)
				if err := rdb.Set(ctx, key, value, 0).Err(); err != nil {
					return "", err
				}
				return value, reactor.RecordEffect(ctx, reactor.Effect{Resource: key, Before: before, After: value, Label: "set the e-mail address to " + value})
			},
		})
	}
	child := reactor.MustDefine(name+"-book", set("fix1", GuardNew), set("fix2", GuardNewer, "fix1"))
	f.Def = reactor.MustDefine(name, append(parts, reactor.Compose("book", child, reactor.ComposeConfig{}),
		reactor.Step("support", reactor.StepConfig[reactor.Args, string]{
			After: []string{"book"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				// The support desk corrects the address meanwhile; then
				// the run fails.
				if err := rdb.Set(ctx, key, GuardClobbered, 0).Err(); err != nil {
					return "", err
				}
				return "", reactor.Permanent(errors.New("downstream refused"))
			},
		}))...)
	return f
}

// Get reads Key ("" when unset).
func (f *GuardFixture) Get(ctx context.Context) string {
	v, err := f.RDB.Get(ctx, f.Key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		panic(err)
	}
	return v
}

// Run sets Key to GuardOld and runs the reactor in-process on engine (which
// must have Def registered), returning the run id of the failed run.
func (f *GuardFixture) Run(ctx context.Context, engine *reactor.Engine, id string) (string, error) {
	return f.RunInputs(ctx, engine, id, nil)
}

// RunInputs is Run with the run's inputs.
func (f *GuardFixture) RunInputs(ctx context.Context, engine *reactor.Engine, id string, inputs map[string]any) (string, error) {
	if err := f.RDB.Set(ctx, f.Key, GuardOld, 0).Err(); err != nil {
		return "", err
	}
	res, err := engine.Run(ctx, f.Def, inputs, reactor.WithRunID(id))
	if err != nil {
		return "", err
	}
	if res.Status != reactor.StatusFailed {
		return "", errors.New("the clobber run did not fail: " + string(res.Status))
	}
	return res.RunID, nil
}

// TierDefs is a fan-out map whose elements set an account's tier to gold
// with a guarded step; somebody else changes account 1 before the owner
// fails, so element 1's undo conflicts. Keys are under prefix.
func TierDefs(rdb redis.UniversalClient, prefix string) (owner, element *reactor.Definition, key func(int) string) {
	key = func(n int) string { return fmt.Sprintf("%s:acct:%d:tier", prefix, n) }
	get := func(ctx context.Context, k string) (string, error) {
		v, err := rdb.Get(ctx, k).Result()
		if errors.Is(err, redis.Nil) {
			return "", nil
		}
		return v, err
	}
	guard := reactor.Guarded(reactor.GuardConfig[string]{
		Probe: get,
		Restore: func(ctx context.Context, k, before, _ string) (reactor.RestoreResult, error) {
			return reactor.RestoreWritten, rdb.Set(ctx, k, before, 0).Err()
		},
	})
	type in struct {
		N int `json:"n"`
	}
	element = reactor.MustDefine("tier-el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("upgrade", reactor.StepConfig[in, string]{
			Args:  reactor.Bindings{"n": reactor.FromInput("item")},
			Guard: guard,
			Run: func(ctx context.Context, in in) (string, error) {
				before, err := get(ctx, key(in.N))
				if err != nil {
					return "", err
				}
				if err := rdb.Set(ctx, key(in.N), "gold", 0).Err(); err != nil {
					return "", err
				}
				return "gold", reactor.RecordEffect(ctx, reactor.Effect{Resource: key(in.N), Before: before, After: "gold", Label: "tier upgrade"})
			},
		}))
	owner = reactor.MustDefine("tier-owner",
		reactor.Input[[]int]("items", reactor.Required()),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true, BatchSize: 2}),
		reactor.Step("decline", reactor.StepConfig[reactor.Args, string]{
			After: []string{"each"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				if err := rdb.Set(ctx, key(1), "platinum (support desk)", 0).Err(); err != nil {
					return "", err
				}
				return "", reactor.Permanent(errors.New("declined"))
			},
		}))
	return owner, element, key
}
