// Package store is goreactor's access to run state in Redis: create, load and
// the fenced write, plus the global run indexes. It deals in encoded bytes; the
// reactor package owns the shape of the state.
package store

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
)

var (
	//go:embed lua/create.lua
	createSrc string
	//go:embed lua/write.lua
	writeSrc string
	//go:embed lua/zrem_if.lua
	zremIfSrc string
	//go:embed lua/cancel.lua
	cancelSrc string
	//go:embed lua/time.lua
	timeSrc string

	createScript = redis.NewScript(createSrc)
	writeScript  = redis.NewScript(writeSrc)
	zremIfScript = redis.NewScript(zremIfSrc)
	cancelScript = redis.NewScript(cancelSrc)
	timeScript   = redis.NewScript(timeSrc)
)

// ErrNotFound is returned when a run has no stored state.
var ErrNotFound = errors.New("store: run not found")

// ErrLockNotHeld is returned by a fenced write or create when the caller's
// token is not the lock's value: the lock expired or another process took it.
var ErrLockNotHeld = errors.New("store: lock not held by this writer")

// VersionConflictError is returned by a fenced write whose expected version is
// not the stored one: the caller's copy of the state is stale.
type VersionConflictError struct {
	Expected, Stored int64
}

func (e *VersionConflictError) Error() string {
	return fmt.Sprintf("store: stale write: read version %d, stored version is %d", e.Expected, e.Stored)
}

// Target names the keys of one state record: a run or a map element run.
// All its keys must share a hash tag.
type Target struct {
	State, Lock string
	// Cancel is the key earlier versions of goreactor kept a cancel request
	// in (a request is now the state's field cx): RequestCancel sets it too,
	// for an hour, so that such a process executing the run during a rolling
	// deploy sees the request.
	Cancel string
	// Audit is the record's audit stream, appended to by the fenced write
	// (WriteOptions.Audit).
	Audit string
	// Done is the shard channel a terminal write publishes on, in the same
	// slot as State; empty for targets nobody waits on (map elements).
	Done string
	// AuditCap, when positive, replaces AuditCap for this target's stream:
	// a map's elements share their map's stream, which their number bounds.
	AuditCap int
}

// Snapshot is a stored state and the version it was read at.
type Snapshot struct {
	Data    []byte
	Version int64
	// Cancel is whether a cancel request is stored (RequestCancel): read
	// by Load with the state, in the same command.
	Cancel bool
}

// Store reads and writes run state. It is safe for concurrent use.
type Store struct {
	rdb     redis.UniversalClient
	keys    keys.Keys
	watcher *Watcher
	// ordered: one node serves every key, so the commands of one pipeline
	// run in the order they were queued. A cluster client splits a
	// pipeline by node and sends the parts concurrently.
	ordered bool
	batch   *batcher
	// acks, when set (SetAcks), makes checkpoints wait for replicas.
	acks *Acks
}

// New returns a Store and loads its scripts, so a broken script or an
// unreachable Redis fails here rather than on the first write.
func New(ctx context.Context, rdb redis.UniversalClient, k keys.Keys) (*Store, error) {
	for _, s := range []*redis.Script{createScript, writeScript, zremIfScript, cancelScript, timeScript} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return nil, fmt.Errorf("store: load script: %w", err)
		}
	}
	_, ordered := rdb.(*redis.Client)
	return &Store{rdb: rdb, keys: k, watcher: NewWatcher(rdb), ordered: ordered,
		batch: newBatcher(rdb)}, nil
}

// SetAcks makes the writes that record a run's progress (Create,
// CreateNew, Write) wait for a.Replicas replicas (see Acks), installing the
// WAIT hook on the client. Call it before the Store is used.
func (s *Store) SetAcks(ctx context.Context, a *Acks) error {
	if a == nil || a.Replicas <= 0 {
		s.acks = nil
		return nil
	}
	if err := InstallAcks(ctx, s.rdb); err != nil {
		return err
	}
	s.acks = a
	return nil
}

// Acks returns what SetAcks set, nil for none.
func (s *Store) Acks() *Acks { return s.acks }

// Ordered reports whether the commands of one pipeline run in the order
// they were queued: the client talks to one Redis (or one failover group),
// not to a cluster, whose client splits a pipeline by node.
func (s *Store) Ordered() bool { return s.ordered }

// Keys returns the key builder.
func (s *Store) Keys() keys.Keys { return s.keys }

// Client returns the Redis client.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// RunTarget returns the keys of run id.
func (s *Store) RunTarget(id string) Target {
	return Target{State: s.keys.RunState(id), Lock: s.keys.RunLock(id), Cancel: s.keys.RunCancel(id),
		Audit: s.keys.RunAudit(id), Done: s.keys.RunDone(id)}
}

// ElemTarget returns the keys of element run id: in its map's slot, its
// audit entries in its map's stream (keys.ElemAudit).
func (s *Store) ElemTarget(id string) Target {
	return Target{State: s.keys.ElemState(id), Lock: s.keys.ElemLock(id), Cancel: s.keys.ElemCancel(id),
		Audit: s.keys.ElemAudit(id), AuditCap: mapAuditCap}
}

// LegacyElemTarget returns the keys of element run id in the layout of maps
// started before element runs moved into their map's slot.
func (s *Store) LegacyElemTarget(id string) Target {
	k := s.keys
	return Target{State: k.LegacyElemState(id), Lock: k.LegacyElemLock(id),
		Cancel: k.LegacyElemCancel(id), Audit: k.LegacyElemAudit(id)}
}

// mapAuditCap bounds a map's audit stream, which the entries of all its
// elements share: far above what any map writes (a few entries per
// element), so that no element's entry is trimmed.
const mapAuditCap = 1 << 40

// Create stores data as version 1 unless a state exists. It returns the
// existing snapshot and created=false when one does.
func (s *Store) Create(ctx context.Context, t Target, token string, data []byte) (Snapshot, bool, error) {
	ctx = WithAcks(ctx, s.acks)
	var res []any
	err := rideOut(ctx, func() (err error) {
		res, err = Eval(ctx, s.rdb, createScript, []string{t.State, t.Lock}, token, data).Slice()
		return err
	})
	if err != nil {
		return Snapshot{}, false, fmt.Errorf("store: create: %w", err)
	}
	return createResult(res, data)
}

// CreateNew indexes new run id (IndexStart's entries, queued by index) and
// creates its state, taking its lock in the create script: the caller did
// not hold it before, and holds it with token for lockTTL when it returns
// created. Where the index and the create can share a pipeline in that
// order (Ordered), it is one round trip; on a cluster the index entries are
// written first, then the state, as a start with a held lock does. It
// returns ErrLockNotHeld when someone else holds the lock (the caller's
// index entries stay: the run sweeper trims an active entry without a
// live run), and the existing snapshot with created=false when the state
// exists. It is for ids nobody else can know yet (generated by the
// engine); a caller-given id takes the lock first.
//
// index queues the run's index entries (QueueIndexStart); reactorName is
// the reactor whose name a cluster's start adds to idx:reactors with the
// create, once the entries' reply is in (QueueReactorName).
func (s *Store) CreateNew(ctx context.Context, t Target, token string, lockTTL time.Duration, data []byte,
	reactorName string, index func(p redis.Pipeliner)) (Snapshot, bool, error) {
	ctx = WithAcks(ctx, s.acks)
	ttl := strconv.FormatInt(max(1, lockTTL.Milliseconds()), 10)
	keys := []string{t.State, t.Lock}
	var res []any
	if s.ordered {
		var create *redis.Cmd
		cmds, err := s.batch.do(ctx, func(p redis.Pipeliner) {
			index(p)
			create = createScript.EvalSha(ctx, p, keys, token, data, ttl)
		})
		if err == nil {
			err = firstErr(cmds)
		}
		if err != nil && create != nil && create.Err() != nil && redis.HasErrorPrefix(create.Err(), "NOSCRIPT") {
			// The server lost its script cache (a restart, SCRIPT FLUSH):
			// the index entries landed; the create goes again by source.
			res, err = Eval(ctx, s.rdb, createScript, keys, token, data, ttl).Slice()
		} else if err == nil {
			res, err = create.Slice()
		}
		if err != nil {
			return Snapshot{}, false, fmt.Errorf("store: index and create run: %w", err)
		}
	} else {
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error { index(p); return nil }); err != nil {
			return Snapshot{}, false, fmt.Errorf("store: index run: %w", err)
		}
		// The reactor's name goes after the entries (QueueIndexStart), beside
		// the create: no round trip more than the create's.
		var named sync.WaitGroup
		var nameErr error
		if reactorName != "" {
			named.Go(func() {
				nameErr = rideOut(ctx, func() error { return s.rdb.SAdd(ctx, s.keys.Reactors(), reactorName).Err() })
			})
		}
		err := rideOut(ctx, func() (err error) {
			res, err = Eval(ctx, s.rdb, createScript, keys, token, data, ttl).Slice()
			return err
		})
		named.Wait()
		if err == nil && nameErr != nil {
			return Snapshot{}, false, fmt.Errorf("store: index run: %w", nameErr)
		}
		if err != nil {
			return Snapshot{}, false, fmt.Errorf("store: create: %w", err)
		}
	}
	return createResult(res, data)
}

// AuditCapOrDefault is the cap of t's audit stream: its own, else AuditCap.
func (t Target) AuditCapOrDefault() int {
	if t.AuditCap > 0 {
		return t.AuditCap
	}
	return AuditCap
}

// AppendAudit appends audit entries to a script's arguments in the form
// the fenced writes read (write.lua and the map element scripts): their
// count, then each entry as its number of field/value pairs followed by the
// pairs.
func AppendAudit(args []any, audit [][]string) ([]any, error) {
	args = append(args, len(audit))
	for _, e := range audit {
		if len(e)%2 != 0 {
			return nil, fmt.Errorf("store: write: audit entry %q has an odd number of fields and values", e)
		}
		args = append(args, len(e)/2)
		for _, v := range e {
			args = append(args, v)
		}
	}
	return args, nil
}

// script runs sc through the shared pipelines (batch.go), by hash; a
// server that lost its script cache gets it by source.
//
// A write refused while Redis Cluster moves its slot or fails over is sent
// again until the transition is over (rideOut).
func (s *Store) script(ctx context.Context, sc *redis.Script, keys []string, args ...any) (res []any, err error) {
	err = rideOut(ctx, func() error {
		res, err = s.scriptOnce(ctx, sc, keys, args...)
		return err
	})
	return res, err
}

func (s *Store) scriptOnce(ctx context.Context, sc *redis.Script, keys []string, args ...any) ([]any, error) {
	var c *redis.Cmd
	cmds, err := s.batch.do(ctx, func(p redis.Pipeliner) { c = sc.EvalSha(ctx, p, keys, args...) })
	if err != nil {
		return nil, err
	}
	if len(cmds) == 0 {
		return nil, errBatchLost
	}
	if c.Err() != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
		return Eval(ctx, s.rdb, sc, keys, args...).Slice()
	}
	return c.Slice()
}

// firstErr is the first error of cmds, errBatchLost for none.
func firstErr(cmds []redis.Cmder) error {
	if len(cmds) == 0 {
		return errBatchLost
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Pipelined queues fn's commands on a pipeline shared with other writers
// of this Store (batch.go) and returns them with their results. fn's
// commands stay together and in its order; on one Redis they run in that
// order. The error is the first command's error, or ctx's.
func (s *Store) Pipelined(ctx context.Context, fn func(p redis.Pipeliner)) ([]redis.Cmder, error) {
	cmds, err := s.batch.do(ctx, fn)
	if err != nil {
		return nil, err
	}
	return cmds, firstErr(cmds)
}

// errBatchLost reports a shared pipeline whose reply did not match what it
// sent: the caller's commands' fate is unknown, as after a lost reply.
var errBatchLost = errors.New("store: a shared pipeline's reply was incomplete")

func createResult(res []any, data []byte) (Snapshot, bool, error) {
	switch code := res[0].(int64); code {
	case -1:
		return Snapshot{}, false, ErrLockNotHeld
	case 1:
		return Snapshot{Data: data, Version: 1}, true, nil
	default:
		return Snapshot{Version: res[1].(int64), Data: []byte(res[2].(string))}, false, nil
	}
}

// Load reads the state of t. It returns ErrNotFound when there is none.
func (s *Store) Load(ctx context.Context, t Target) (Snapshot, error) {
	vals, err := s.rdb.HMGet(ctx, t.State, "v", "d", "cx").Result()
	if err != nil {
		return Snapshot{}, fmt.Errorf("store: load: %w", err)
	}
	if vals[0] == nil || vals[1] == nil {
		return Snapshot{}, ErrNotFound
	}
	var v int64
	if _, err := fmt.Sscan(vals[0].(string), &v); err != nil {
		return Snapshot{}, fmt.Errorf("store: load: bad version %q", vals[0])
	}
	return Snapshot{Data: []byte(vals[1].(string)), Version: v, Cancel: vals[2] != nil}, nil
}

// LoadMany reads the states of ts in one pipelined round trip. A target
// with no state has a Snapshot with nil Data.
func (s *Store) LoadMany(ctx context.Context, ts []Target) ([]Snapshot, error) {
	cmds := make([]*redis.SliceCmd, len(ts))
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, t := range ts {
			cmds[i] = p.HMGet(ctx, t.State, "v", "d")
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("store: load: %w", err)
	}
	out := make([]Snapshot, len(ts))
	for i, c := range cmds {
		vals := c.Val()
		if len(vals) != 2 || vals[0] == nil || vals[1] == nil {
			continue
		}
		var v int64
		if _, err := fmt.Sscan(vals[0].(string), &v); err != nil {
			return nil, fmt.Errorf("store: load: bad version %q", vals[0])
		}
		out[i] = Snapshot{Data: []byte(vals[1].(string)), Version: v}
	}
	return out, nil
}

// WriteOptions qualify a fenced write.
type WriteOptions struct {
	// Retention, when positive, marks the write terminal: the state expires
	// after it, any pending cancel request is dropped, and the write is
	// announced on the target's Done channel (see Watcher).
	Retention time.Duration
	// KeepForever marks the write terminal like Retention, but the state
	// (and its audit stream) never expires: a finished run with entries a
	// person must resolve. Retention is ignored.
	KeepForever bool
	// Release deletes the lock in the same script, after the write.
	Release bool
	// UnlessCancelled refuses the write with ErrCancelPending while a
	// cancel is requested: a run that completed or halted while a cancel
	// came in rolls back instead of finishing.
	UnlessCancelled bool
	// Audit are entries appended to the target's audit stream in the same
	// script, only if the write lands; each is a flat list of field/value
	// pairs (the script adds ts, the server time of the write in ms).
	Audit [][]string
}

// AuditCap is the length an audit stream is trimmed to (XADD MAXLEN ~, so
// Redis may keep a few more): past it the oldest entries are dropped. A
// run's stream holds the transitions of the run and its composed children;
// each map element run has its own, so a map's size does not count here.
const AuditCap = 10000

// ErrCancelPending is returned by a write with UnlessCancelled while a
// cancel request is pending.
var ErrCancelPending = errors.New("store: a cancel is requested")

// WriteResult is what a fenced write reports back.
type WriteResult struct {
	Version         int64
	CancelRequested bool
	// At is the Redis server's time of the write in Unix ms (0 when a
	// resend found its write already done).
	At int64
}

// Write stores data if token holds t's lock and version is the stored
// version. It returns ErrLockNotHeld or a *VersionConflictError otherwise.
func (s *Store) Write(ctx context.Context, t Target, token string, version int64, data []byte, o WriteOptions) (WriteResult, error) {
	release, unlessCancelled := "0", "0"
	if o.Release {
		release = "1"
	}
	if o.UnlessCancelled {
		unlessCancelled = "1"
	}
	// One nonce per call: go-redis resends the same arguments after a lost
	// reply, and only that resend may find its own write already done.
	var nb [8]byte
	_, _ = rand.Read(nb[:])
	nonce := hex.EncodeToString(nb[:])
	retention := o.Retention.Milliseconds()
	if o.KeepForever {
		retention = -1
	}
	args, err := AppendAudit([]any{token, version, data, retention, release, nonce, t.Done, unlessCancelled,
		t.AuditCapOrDefault()}, o.Audit)
	if err != nil {
		return WriteResult{}, err
	}
	keys := []string{t.State, t.Lock}
	if len(o.Audit) > 0 || retention != 0 {
		// Only a write that appends to the audit stream or expires it names
		// the stream, which does not exist until a first entry (write.lua).
		keys = append(keys, t.Audit)
	}
	res, err := s.script(WithAcks(ctx, s.acks), writeScript, keys, args...)
	if err != nil {
		return WriteResult{}, fmt.Errorf("store: write: %w", err)
	}
	switch code := res[0].(int64); code {
	case -1:
		return WriteResult{}, ErrLockNotHeld
	case -2:
		return WriteResult{}, &VersionConflictError{Expected: version, Stored: res[1].(int64)}
	case -3:
		return WriteResult{}, ErrCancelPending
	default:
		r := WriteResult{Version: code, CancelRequested: res[1].(int64) == 1}
		if len(res) > 2 {
			r.At, _ = res[2].(int64)
		}
		return r, nil
	}
}

// ServerTime reads the Redis server's clock, in Unix ms, on the node that
// holds t (on a cluster each node has its own clock: a run's readings all
// come from its own slot's node, like the times its writes record).
func (s *Store) ServerTime(ctx context.Context, t Target) (int64, error) {
	return ServerTimeAt(ctx, s.rdb, t.State)
}

// ServerTimeAt reads the Redis server's clock, in Unix ms, on the node
// that holds key.
func ServerTimeAt(ctx context.Context, rdb redis.Scripter, key string) (int64, error) {
	ms, err := timeScript.Run(ctx, rdb, []string{key}).Int64()
	if err != nil {
		return 0, fmt.Errorf("store: server time: %w", err)
	}
	return ms, nil
}

// RequestCancel asks the process executing run t to cancel it at its next
// checkpoint: the request lasts until the run's terminal write deletes it.
// A run that is already finished (or gone) gets no request: it could never be
// deleted by a terminal write, and it reports ErrAlreadyDone.
func (s *Store) RequestCancel(ctx context.Context, t Target) error {
	n, err := cancelScript.Run(ctx, s.rdb, []string{t.State, t.Cancel}).Int()
	if err != nil {
		return fmt.Errorf("store: request cancel: %w", err)
	}
	if n == 0 {
		return ErrAlreadyDone
	}
	return nil
}

// ErrAlreadyDone is returned by RequestCancel for a run that finished (or
// vanished) before the request could be stored.
var ErrAlreadyDone = errors.New("store: run already finished")

// CancelRequested reports whether a cancel was requested for t (the
// state's field cx, cancel.lua).
func (s *Store) CancelRequested(ctx context.Context, t Target) (bool, error) {
	n, err := s.rdb.HExists(ctx, t.State, "cx").Result()
	return n, err
}
