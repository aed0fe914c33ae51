package store

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/interrupt.lua
	interruptSrc    string
	interruptScript = redis.NewScript(interruptSrc)
	//go:embed lua/corr.lua
	corrSrc    string
	corrScript = redis.NewScript(corrSrc)
)

// Interrupt names the interrupt a run waits on: the step's path and the
// run's pause number.
type Interrupt struct {
	Path     string
	Instance int
}

// Interrupt states (the record's field is).
const (
	InterruptWaiting  = "w"
	InterruptAdopted  = "d"
	InterruptTimedOut = "t"
	InterruptClosed   = "c"
)

// Payload is one payload an interrupt holds.
type Payload struct {
	Data []byte
	At   int64 // server time it was recorded, ms
	By   string
}

// InterruptRecord is an interrupt as its run's state hash holds it.
type InterruptRecord struct {
	Received, Accepts int
	State             string
	Deadline, Now     int64 // server times, ms (Deadline 0: none)
	Payloads          []Payload
}

// ErrInterruptMoved: the run's record names another interrupt than the
// caller's (the caller's state is stale).
var ErrInterruptMoved = errors.New("store: the run's interrupt record names another interrupt")

func (s *Store) interrupt(ctx context.Context, t Target, args ...any) ([]any, error) {
	var res []any
	err := rideOut(ctx, func() (err error) {
		res, err = interruptScript.Run(ctx, s.rdb, []string{t.State, t.Lock}, args...).Slice()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: interrupt %s: %w", args[0], err)
	}
	if n, ok := res[0].(int64); ok {
		switch n {
		case -1:
			return nil, ErrLockNotHeld
		case -2:
			return nil, ErrInterruptMoved
		}
	}
	return res, nil
}

// OpenInterrupt records interrupt in as the one run t waits on, accepting
// accepts payloads, with a deadline timeout from now on the server's clock
// (0: none). A record of in already there is kept (a resumed pause). It
// returns the record's deadline and the server's time.
func (s *Store) OpenInterrupt(ctx context.Context, t Target, token string, in Interrupt, accepts int, timeout time.Duration) (deadline, now int64, err error) {
	res, err := s.interrupt(ctx, t, "open", token, in.Path, in.Instance, accepts, timeout.Milliseconds())
	if err != nil {
		return 0, 0, err
	}
	return toInt(res[3]), toInt(res[4]), nil
}

// ReadInterrupt reads interrupt in of run t, turning it timed out if it is
// short of payloads past its deadline.
func (s *Store) ReadInterrupt(ctx context.Context, t Target, token string, in Interrupt) (InterruptRecord, error) {
	res, err := s.interrupt(ctx, t, "read", token, in.Path, in.Instance)
	if err != nil {
		return InterruptRecord{}, err
	}
	r := InterruptRecord{Received: int(toInt(res[1])), Accepts: int(toInt(res[2])), State: toStr(res[3]),
		Deadline: toInt(res[4]), Now: toInt(res[5])}
	for i := 6; i+2 < len(res); i += 3 {
		r.Payloads = append(r.Payloads, Payload{Data: []byte(toStr(res[i])), At: toInt(res[i+1]), By: toStr(res[i+2])})
	}
	return r, nil
}

// AdoptInterrupt marks interrupt in as taken by the run.
func (s *Store) AdoptInterrupt(ctx context.Context, t Target, token string, in Interrupt) error {
	_, err := s.interrupt(ctx, t, "adopt", token, in.Path, in.Instance)
	return err
}

// RefusePayload drops payload k (1-based) of interrupt in, recording why;
// it returns how many payloads the interrupt holds after.
func (s *Store) RefusePayload(ctx context.Context, t Target, token string, in Interrupt, k int, why string) (int, error) {
	res, err := s.interrupt(ctx, t, "refuse", token, in.Path, in.Instance, k, why)
	if err != nil {
		return 0, err
	}
	return int(toInt(res[1])), nil
}

// CloseInterrupt closes interrupt in if it still waits: a later continue is
// told the run no longer waits.
func (s *Store) CloseInterrupt(ctx context.Context, t Target, token string, in Interrupt) error {
	_, err := s.interrupt(ctx, t, "close", token, in.Path, in.Instance)
	if errors.Is(err, ErrInterruptMoved) {
		return nil
	}
	return err
}

// Continue outcomes.
const (
	ContinueOK        = "ok"
	ContinueAlready   = "already"
	ContinueTimedOut  = "timedout"
	ContinueClosed    = "closed"
	ContinueNotPaused = "notpaused"
	ContinueFinished  = "finished"
	ContinueGone      = "gone"
)

// ContinueReply is what a continue found.
type ContinueReply struct {
	Outcome string
	// Received and Accepts count the interrupt's payloads after an ok.
	Received, Accepts int
	// Instance is the interrupt's instance (ok); Fills how many times it
	// has been full, this payload's included (0 while it is not).
	Instance, Fills int
	// At is the server time of the recorded payload (ok), of the first
	// payload (already), or the deadline (timedout), ms.
	At int64
}

// ContinueInterrupt records payload for the interrupt at step path of run t
// (instance 0: whichever is on record), without the run's lock, and appends
// a continued entry to the run's audit stream.
func (s *Store) ContinueInterrupt(ctx context.Context, t Target, path string, instance int, payload []byte, by, digest, trace string) (ContinueReply, error) {
	inst := ""
	if instance > 0 {
		inst = strconv.Itoa(instance)
	}
	var res []any
	err := rideOut(ctx, func() (err error) {
		res, err = interruptScript.Run(WithAcks(ctx, s.acks), s.rdb, []string{t.State, t.Audit},
			"continue", path, inst, payload, by, t.AuditCapOrDefault(), digest, trace).Slice()
		return err
	})
	if err != nil {
		return ContinueReply{}, fmt.Errorf("store: continue: %w", err)
	}
	r := ContinueReply{Outcome: toStr(res[0])}
	switch r.Outcome {
	case ContinueOK:
		r.Received, r.Accepts, r.At, r.Instance, r.Fills = int(toInt(res[1])), int(toInt(res[2])), toInt(res[3]), int(toInt(res[4])), int(toInt(res[5]))
	case ContinueAlready, ContinueTimedOut:
		if len(res) > 1 {
			r.At = toInt(res[1])
		}
	}
	return r, nil
}

// InterruptFields reads run t's state hash whole, as it stands, without the
// lock and without changing it (a reader's view: a dashboard, the CLI): the
// encoded state (field d) and the interrupt's record beside it, in one
// command. ErrNotFound when the run has no state.
func (s *Store) InterruptFields(ctx context.Context, t Target) (map[string]string, error) {
	m, err := s.rdb.HGetAll(ctx, t.State).Result()
	if err != nil {
		return nil, fmt.Errorf("store: read interrupt: %w", err)
	}
	if _, ok := m["d"]; !ok {
		return nil, ErrNotFound
	}
	return m, nil
}

// corr runs corr.lua on the claim of id.
func (s *Store) corr(ctx context.Context, id string, args ...any) ([]any, error) {
	var res []any
	err := rideOut(ctx, func() (err error) {
		res, err = corrScript.Run(WithAcks(ctx, s.acks), s.rdb, []string{s.keys.Corr(id)}, args...).Slice()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: correlation %s: %w", args[0], err)
	}
	return res, nil
}

// ClaimCorrelation takes correlation id id for holder unless another holds
// it; stale, when not empty, is a holder the caller found stale and may
// replace. It returns "" when taken, else the holder.
func (s *Store) ClaimCorrelation(ctx context.Context, id, holder, stale string, ttl time.Duration) (string, error) {
	var res []any
	var err error
	if stale == "" {
		res, err = s.corr(ctx, id, "claim", holder, ttl.Milliseconds())
	} else {
		res, err = s.corr(ctx, id, "swap", holder, ttl.Milliseconds(), stale)
	}
	if err != nil {
		return "", err
	}
	if toInt(res[0]) == 1 {
		return "", nil
	}
	return toStr(res[1]), nil
}

// ReleaseCorrelation deletes the claim of id if holder still has it.
func (s *Store) ReleaseCorrelation(ctx context.Context, id, holder string) error {
	_, err := s.corr(ctx, id, "release", holder)
	return err
}

// RetireCorrelation keeps the claim of id (if holder has it) for ttl more,
// then lets it expire.
func (s *Store) RetireCorrelation(ctx context.Context, id, holder string, ttl time.Duration) error {
	_, err := s.corr(ctx, id, "retire", holder, max(1, ttl.Milliseconds()))
	return err
}

// CorrelationHolder reads who holds correlation id id ("" for nobody).
func (s *Store) CorrelationHolder(ctx context.Context, id string) (string, error) {
	v, err := s.rdb.Get(ctx, s.keys.Corr(id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("store: read correlation %s: %w", id, err)
	}
	return v, nil
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func toStr(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}
