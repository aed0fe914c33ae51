package engine

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/goreactor/goreactor/internal/codec"
)

// A spawn step starts an independent run of another reactor (Spawn): its
// own id, queue, retention and fate. The spawning run does not wait for it
// and its failure is not the spawning run's. The step is a plain step whose
// Run enqueues the run under an id derived from the spawning run's and the
// step's path (SpawnID), so a step run again (a crash, a retry) finds the
// run it started instead of starting another; the link is recorded both
// ways, in the spawned run (SpawnedBy) and in the spawning one (Spawned).

// SpawnUndo is what the spawning run's rollback does to a run it spawned.
type SpawnUndo uint8

const (
	// SpawnKept (the default): the spawned run is left alone. The spawn
	// step has no undo: a rollback reports it kept
	// (no_compensation_registered), as any step without an Undo.
	SpawnKept SpawnUndo = iota
	// SpawnCancelled: the rollback cancels the spawned run if it has not
	// finished (it rolls itself back, Engine.Cancel), undoes it if it
	// completed (Engine.Undo), and leaves it if it already failed or was
	// cancelled.
	SpawnCancelled
)

// SpawnConfig describes a step that starts an independent run of another
// reactor.
type SpawnConfig struct {
	// Args binds the spawned run's inputs.
	Args Bindings
	// After lists steps that must complete first.
	After []string
	// Queue is the asynq queue of the spawned run (WithQueue). Default: the
	// queue of the engine's Enqueuer.
	Queue string
	// Undo is what the spawning run's rollback does to the spawned run.
	// Default SpawnKept.
	Undo SpawnUndo
}

// Spawned is a spawn step's result, what later steps bind with FromStep:
// the run it started.
type Spawned struct {
	RunID   string `msgpack:"run" json:"run_id"`
	Reactor string `msgpack:"reactor" json:"reactor"`
}

// SpawnLink links a run to a run one of its steps spawned, or to the run
// that spawned it (Run.Spawned, Run.SpawnedBy).
type SpawnLink struct {
	// Run is the other run's id. Reactor is the spawned run's reactor in
	// Run.Spawned, and in Run.SpawnedBy the definition the spawning step
	// belongs to (a composed child's, for a step of the child).
	Run     string `msgpack:"r"`
	Reactor string `msgpack:"re"`
	// Step is the spawning step's path in the spawning run ("notify",
	// "book/notify").
	Step string `msgpack:"s"`
}

// SpawnID is the id of the run that step (a path) of run id spawns.
func SpawnID(id, step string) string { return id + "+" + strings.ReplaceAll(step, "/", "+") }

// Spawn declares a step that starts an independent run of child, with its
// inputs bound by cfg.Args, on the queue cfg.Queue. It needs workers (an
// engine with an Enqueuer). Its result is a Spawned.
func Spawn(name string, child *Definition, cfg SpawnConfig) Part {
	return partFunc(func(d *Definition) error {
		if child == nil {
			return &DefinitionError{Reactor: d.name, Step: name, Reason: "spawn of a nil definition"}
		}
		if cfg.Undo > SpawnCancelled {
			return &DefinitionError{Reactor: d.name, Step: name, Reason: fmt.Sprintf("SpawnConfig.Undo %d is not a SpawnUndo", cfg.Undo)}
		}
		if cfg.Queue != "" && strings.TrimSpace(cfg.Queue) == "" {
			return &DefinitionError{Reactor: d.name, Step: name, Reason: "SpawnConfig.Queue is blank"}
		}
		probe := &stepDef{name: name, args: cfg.Args, child: child}
		if err := checkChildBindings(d.name, probe); err != nil {
			return err
		}
		for _, in := range child.inputs {
			if _, bound := cfg.Args[in.name]; !bound && in.required && in.def == nil {
				return &DefinitionError{Reactor: d.name, Step: name, Reason: fmt.Sprintf("spawned reactor %q needs input %q, which Args does not bind", child.name, in.name)}
			}
		}
		s := &stepDef{name: name, kind: kindPlain, args: cfg.Args, after: cfg.After, spawn: child,
			inType: argsType, outType: reflect.TypeFor[Spawned]()}
		s.run = func(ctx context.Context, raw Raw) (Raw, error) {
			return spawnRun(ctx, child, cfg, raw)
		}
		if cfg.Undo == SpawnCancelled {
			s.undo = func(ctx context.Context, _, result Raw) error { return undoSpawned(ctx, result) }
		}
		return d.addStep(s)
	})
}

// spawnRun enqueues the spawned run (idempotent under its id).
func spawnRun(ctx context.Context, child *Definition, cfg SpawnConfig, raw Raw) (Raw, error) {
	e := engineFrom(ctx)
	info, ok := RunInfoFrom(ctx)
	if e == nil || !ok {
		return nil, Permanent(errors.New("reactor: a spawn step runs only inside a run"))
	}
	var args map[string]codec.Raw
	if len(raw) > 0 {
		if err := codec.Unmarshal(raw, &args); err != nil {
			return nil, Permanent(fmt.Errorf("reactor: spawn %q: decode its arguments: %w", info.Step, err))
		}
	}
	inputs := make(map[string]any, len(args))
	for k, v := range args {
		inputs[k] = v
	}
	id := SpawnID(info.RunID, info.Step)
	opts := []RunOption{WithRunID(id), func(o *runOptions) {
		o.spawnedBy = &SpawnLink{Run: info.RunID, Reactor: info.Reactor, Step: info.Step}
	}}
	if cfg.Queue != "" {
		opts = append(opts, WithQueue(cfg.Queue))
	}
	_, err := e.Enqueue(ctx, child, inputs, opts...)
	var ie *InputError
	switch {
	case errors.Is(err, ErrNoEnqueuer):
		return nil, Permanent(fmt.Errorf("reactor: spawn %q starts a run on workers: give the engine an Enqueuer (a worker.Client): %w", info.Step, err))
	case errors.As(err, &ie), errors.Is(err, errTaken), errors.Is(err, ErrRunIDReused):
		return nil, Permanent(fmt.Errorf("reactor: spawn %q: %w", info.Step, err))
	case err != nil:
		return nil, err
	}
	return codec.Marshal(Spawned{RunID: id, Reactor: child.name})
}

// undoSpawned cancels a spawned run that has not finished, undoes one that
// completed, and leaves one that failed, was cancelled, or is gone.
func undoSpawned(ctx context.Context, result Raw) error {
	e := engineFrom(ctx)
	var sp Spawned
	if err := codec.Unmarshal(result, &sp); err != nil || sp.RunID == "" {
		return fmt.Errorf("reactor: the spawn step's result names no run: %v", err)
	}
	err := e.Cancel(ctx, sp.RunID)
	switch {
	case err == nil, errors.Is(err, ErrNotFound), errors.Is(err, ErrRollbackInProgress):
		return nil
	case !errors.Is(err, ErrAlreadyFinished):
		return err
	}
	_, err = e.Undo(ctx, sp.RunID)
	var se *StatusError
	if errors.As(err, &se) || errors.Is(err, ErrNotFound) {
		return nil // failed or cancelled: nothing of it stands
	}
	return err
}

// noteSpawned records, with the root run, the run that spawn step path
// started (its result, val).
func (x *execution) noteSpawned(path string, val Raw) {
	var sp Spawned
	if codec.Unmarshal(val, &sp) != nil || sp.RunID == "" {
		return
	}
	for _, l := range x.st.Spawned {
		if l.Run == sp.RunID {
			return
		}
	}
	x.st.Spawned = append(x.st.Spawned, SpawnLink{Run: sp.RunID, Reactor: sp.Reactor, Step: path})
}
