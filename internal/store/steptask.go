package store

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/steptask.lua
	stepTaskSrc    string
	stepTaskScript = redis.NewScript(stepTaskSrc)
)

// A step task is a step that runs as an asynq task of its own
// (StepConfig.Task) while its run waits, parked. Its record lives in the
// owner run's hash (keys.RunTasks), one set of fields per dispatch token;
// steptask.lua keeps the attempt protocol: one attempt at a time under a
// lease, first outcome wins, a stop that no later attempt passes.

// StepTask names one dispatch of a step task.
type StepTask struct {
	Owner string // the owner run (the hash's tag)
	Token string
}

// Step task begin verdicts (StepBegin.State).
const (
	StepTaskOK      = "ok"      // the attempt may run: it holds the lease
	StepTaskSettled = "settled" // the step has its outcome
	StepTaskStop    = "stop"    // a rollback stopped the step before it ran
	StepTaskStale   = "stale"   // the task is an older attempt's (Next names the current)
	StepTaskBusy    = "busy"    // another holder's attempt runs (Left)
	StepTaskLost    = "lost"    // the caller no longer holds the lease
	StepTaskRunning = "running" // stop: an attempt runs (Left)
	StepTaskDead    = "dead"    // stop: an attempt's holder died unsettled
	StepTaskIdle    = "idle"    // stop: no attempt runs and none settled
)

// StepVerdict is what a step task script decided.
type StepVerdict struct {
	State string
	// Tries counts the attempts begun, interrupted ones included; Dead
	// counts those whose holder died (begin).
	Tries, Dead int
	// Next is the attempt whose task may run (stale).
	Next int
	// Left is what remains of another holder's lease (busy, running).
	Left time.Duration
	// Stop is set when a renewal found a stop request.
	Stop bool
}

func (s *Store) stepTask(ctx context.Context, t StepTask, mode string, args ...any) (StepVerdict, error) {
	argv := append([]any{mode, t.Token}, args...)
	res, err := s.script(ctx, stepTaskScript, []string{s.keys.RunTasks(t.Owner)}, argv...)
	if err != nil {
		return StepVerdict{}, fmt.Errorf("store: step task %s of run %s (%s): %w", t.Token, t.Owner, mode, err)
	}
	if len(res) == 0 {
		return StepVerdict{}, errors.New("store: steptask.lua returned nothing")
	}
	v := StepVerdict{State: fmt.Sprint(res[0])}
	num := func(i int) int64 {
		if i < len(res) {
			n, _ := res[i].(int64)
			return n
		}
		return 0
	}
	switch v.State {
	case StepTaskOK:
		if mode == "begin" {
			v.Tries, v.Dead = int(num(1)), int(num(2))
		}
		if mode == "renew" {
			v.Stop = num(1) == 1
		}
	case StepTaskStale:
		v.Next = int(num(1))
	case StepTaskBusy, StepTaskRunning:
		v.Left = time.Duration(num(1)) * time.Millisecond
	}
	return v, nil
}

// StartStepTask writes a new dispatch's arguments, its first attempt next.
// The step's path names its latest dispatch ("step:<path>").
func (s *Store) StartStepTask(ctx context.Context, t StepTask, path string, args []byte) error {
	key := s.keys.RunTasks(t.Owner)
	err := rideOut(ctx, func() error {
		return s.rdb.HSet(ctx, key, t.Token+":args", args, t.Token+":next", 1, "step:"+path, t.Token).Err()
	})
	if err != nil {
		return fmt.Errorf("store: start step task %s of run %s: %w", t.Token, t.Owner, err)
	}
	return nil
}

// BeginStepAttempt asks to run attempt n under holder's lease.
func (s *Store) BeginStepAttempt(ctx context.Context, t StepTask, n int, holder string, lease time.Duration) (StepVerdict, error) {
	return s.stepTask(ctx, t, "begin", n, holder, lease.Milliseconds())
}

// RenewStepLease extends holder's lease, and tells whether a stop was asked.
func (s *Store) RenewStepLease(ctx context.Context, t StepTask, holder string, lease time.Duration) (StepVerdict, error) {
	return s.stepTask(ctx, t, "renew", holder, lease.Milliseconds())
}

// SettleStep stores the step's outcome if it has none, holder still holding
// the lease (holder "": only while no live lease is held).
func (s *Store) SettleStep(ctx context.Context, t StepTask, holder string, outcome []byte) (StepVerdict, error) {
	return s.stepTask(ctx, t, "settle", holder, outcome)
}

// RetryStep lets attempt next run, holder giving up its lease.
func (s *Store) RetryStep(ctx context.Context, t StepTask, holder string, next int) (StepVerdict, error) {
	return s.stepTask(ctx, t, "retry", holder, next)
}

// StopStep asks the step to stop: no attempt begins after it. It reports
// what runs: settled, running (a live lease), dead (a lapsed one) or idle.
func (s *Store) StopStep(ctx context.Context, t StepTask) (StepVerdict, error) {
	return s.stepTask(ctx, t, "stop")
}

// StepLook is where a dispatch stands, as its owner sees it.
type StepLook struct {
	Outcome []byte // nil until settled
	Next    int
	Tries   int
	// Lease is "none", "live" or "dead" (an attempt's holder stopped
	// renewing it, its worker gone).
	Lease   string
	Stopped bool
}

// LookStep reads where a dispatch stands, in one script.
func (s *Store) LookStep(ctx context.Context, t StepTask) (StepLook, error) {
	res, err := s.script(ctx, stepTaskScript, []string{s.keys.RunTasks(t.Owner)}, "look", t.Token)
	if err != nil {
		return StepLook{}, fmt.Errorf("store: look at step task %s of run %s: %w", t.Token, t.Owner, err)
	}
	if len(res) < 5 {
		return StepLook{}, errors.New("store: steptask.lua look returned too little")
	}
	var l StepLook
	if out, _ := res[0].(string); out != "" {
		l.Outcome = []byte(out)
	}
	l.Next, _ = strconv.Atoi(fmt.Sprint(res[1]))
	l.Tries, _ = strconv.Atoi(fmt.Sprint(res[2]))
	l.Lease = fmt.Sprint(res[3])
	l.Stopped = fmt.Sprint(res[4]) == "1"
	return l, nil
}

// StepRecord is what a step task's record holds of one dispatch.
type StepRecord struct {
	Args, Outcome []byte
	Next          int
	Stopped       bool
	// Undo is the outcome of the undo of generation Gen asked for (nil: none yet).
	Undo []byte
}

// ReadStep reads a dispatch's record, with its undo outcome of generation
// gen (0: none asked).
func (s *Store) ReadStep(ctx context.Context, t StepTask, gen int) (StepRecord, error) {
	fields := []string{t.Token + ":args", t.Token + ":out", t.Token + ":next", t.Token + ":stop"}
	if gen > 0 {
		fields = append(fields, t.Token+":u"+strconv.Itoa(gen))
	}
	var vals []any
	err := rideOut(ctx, func() (err error) {
		vals, err = s.rdb.HMGet(ctx, s.keys.RunTasks(t.Owner), fields...).Result()
		return err
	})
	if err != nil {
		return StepRecord{}, fmt.Errorf("store: read step task %s of run %s: %w", t.Token, t.Owner, err)
	}
	str := func(i int) []byte {
		if i < len(vals) {
			if v, ok := vals[i].(string); ok {
				return []byte(v)
			}
		}
		return nil
	}
	r := StepRecord{Args: str(0), Outcome: str(1), Stopped: str(3) != nil}
	if n := str(2); n != nil {
		r.Next, _ = strconv.Atoi(string(n))
	}
	if gen > 0 {
		r.Undo = str(4)
	}
	return r, nil
}

// RecordStepUndo stores the outcome of the undo of generation gen, the
// first one written winning. It reports whether this one was.
func (s *Store) RecordStepUndo(ctx context.Context, t StepTask, gen int, outcome []byte) (bool, error) {
	var set bool
	err := rideOut(ctx, func() (err error) {
		set, err = s.rdb.HSetNX(ctx, s.keys.RunTasks(t.Owner), t.Token+":u"+strconv.Itoa(gen), outcome).Result()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("store: record the undo of step task %s of run %s: %w", t.Token, t.Owner, err)
	}
	return set, nil
}

// RecordStepAttempt stores the record of the n-th delivery begun (encoded
// by the engine), for the dashboard and Engine.StepTasks.
func (s *Store) RecordStepAttempt(ctx context.Context, t StepTask, n int, rec []byte) error {
	err := rideOut(ctx, func() error {
		return s.rdb.HSet(ctx, s.keys.RunTasks(t.Owner), t.Token+":a"+strconv.Itoa(n), rec).Err()
	})
	if err != nil {
		return fmt.Errorf("store: record attempt %d of step task %s of run %s: %w", n, t.Token, t.Owner, err)
	}
	return nil
}

// StepAttempts reads the attempt records of the latest dispatch of each
// task step of run owner, by step path, in attempt order: one HGETALL.
func (s *Store) StepAttempts(ctx context.Context, owner string) (map[string][][]byte, error) {
	var all map[string]string
	err := rideOut(ctx, func() (err error) {
		all, err = s.rdb.HGetAll(ctx, s.keys.RunTasks(owner)).Result()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: read the step tasks of run %s: %w", owner, err)
	}
	out := map[string][][]byte{}
	for field, tok := range all {
		path, ok := strings.CutPrefix(field, "step:")
		if !ok {
			continue
		}
		var recs [][]byte
		for n := 1; ; n++ {
			v, ok := all[tok+":a"+strconv.Itoa(n)]
			if !ok {
				break
			}
			recs = append(recs, []byte(v))
		}
		out[path] = recs
	}
	return out, nil
}

// StepLeaseUntil returns when the latest lease held on one of run owner's
// task steps ends (Unix ms by the server's clock that wrote it; 0 when
// none is held): while it has not, a worker runs an attempt of the step,
// and the run, parked for it, executes.
func (s *Store) StepLeaseUntil(ctx context.Context, owner string) (int64, error) {
	var all map[string]string
	err := rideOut(ctx, func() (err error) {
		all, err = s.rdb.HGetAll(ctx, s.keys.RunTasks(owner)).Result()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("store: read the step leases of run %s: %w", owner, err)
	}
	return StepLeaseEnd(all), nil
}

// StepLeaseEnd returns when the latest lease in a run's task record (the
// hash keys.RunTasks, read whole) ends, in Unix ms; 0 for none.
func StepLeaseEnd(record map[string]string) int64 {
	var until int64
	for f, v := range record {
		if !strings.HasSuffix(f, ":lease") {
			continue
		}
		_, exp, _ := strings.Cut(v, "|")
		if ms, err := strconv.ParseInt(exp, 10, 64); err == nil {
			until = max(until, ms)
		}
	}
	return until
}
