package engine_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redistest"
)

type env struct {
	t      *testing.T
	rdb    redis.UniversalClient
	prefix string
	engine *engine.Engine
	trail  *trail
}

// newEnv gives a test an engine on a real Redis under its own prefix.
func newEnv(t *testing.T, mod ...func(*engine.Config)) *env {
	t.Helper()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	cfg := engine.Config{Client: rdb, Prefix: prefix, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, m := range mod {
		m(&cfg)
	}
	e, err := engine.NewEngine(context.Background(), cfg)
	require.NoError(t, err)
	return &env{t: t, rdb: rdb, prefix: prefix, engine: e, trail: &trail{}}
}

// trail records what user code ran, in order.
type trail struct {
	mu  sync.Mutex
	log []string
}

func (tr *trail) add(s string) {
	tr.mu.Lock()
	tr.log = append(tr.log, s)
	tr.mu.Unlock()
}

func (tr *trail) all() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.log)
}

func (tr *trail) count(s string) int {
	n := 0
	for _, e := range tr.all() {
		if e == s {
			n++
		}
	}
	return n
}

// simple builds a step with an undo that records "run:name" and
// "undo:name"; fail makes Run return err.
func simple(tr *trail, name string, fail error, after ...string) engine.Part {
	return engine.Step(name, engine.StepConfig[engine.Args, string]{
		After: after,
		Run: func(ctx context.Context, _ engine.Args) (string, error) {
			tr.add("run:" + name)
			if fail != nil {
				return "", fail
			}
			return name + "-done", nil
		},
		Undo: func(ctx context.Context, _ engine.Args, out string) error {
			tr.add("undo:" + name)
			if out != name+"-done" {
				return errors.New("undo saw the wrong result: " + out)
			}
			return nil
		},
	})
}

// takeoverLockExpiry is the lock expiry of the tests in which another
// process takes a run's lock over: the holder's heartbeat (every third of
// it) notices within 333ms, and one that comes up to 667ms late (a process
// starved by a parallel run under -race) still keeps the lock until then.
const takeoverLockExpiry = time.Second

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
