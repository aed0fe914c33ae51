// Package liveness is goreactor's lease per worker: a worker proves it is
// alive with a key that expires unless its heartbeat refreshes it, and records
// which asynq tasks it has taken, so that the sweeper can tell a task whose
// worker died (redeliver it now) from one whose worker is alive (leave it).
//
// asynq alone cannot tell that fast enough: an active task's lease lasts 30 s
// and is extended every 5 s, and asynq's server records (asynq:servers:{...},
// asynq:workers:{...}) are written every 5 s with a 10 s expiry, listing only
// the tasks running at that beat, so a task taken and killed between two beats
// is never listed anywhere. The record here is written before the task's
// handler runs, and the worker's alive key lives a few seconds.
//
// Keys, under the engines' prefix P:
//
//	P:{worker:<id>}:alive  string "<host>:<pid>", expires TTL after the last beat
//	P:{worker:<id>}:tasks  hash task id -> "<seq> <queue>", the deliveries the
//	                       worker took and has not yet reported finished;
//	                       expires RecordTTL after the last beat or delivery
//	P:{worker:<id>}:name   string "<host>:<pid>", expires RecordTTL after the
//	                       last beat: which asynq server the worker is
//	P:idx:workers          zset worker id -> last beat (ms, the worker's clock),
//	                       how the sweeper finds the records
//
// A worker's two keys share a hash tag, so its beat is one script in one
// cluster slot; the registry is one key written and read with single-key
// commands, like asynq's own asynq:servers. A verdict never compares clocks:
// alive is whether the alive key exists, by the Redis server's expiry.
//
// The verdicts are evidence for recovery, not for safety: a task's run or
// element lock is what keeps two deliveries apart. A live worker whose alive
// key lapsed (Redis unreachable from it for a TTL) only has its unlocked
// tasks delivered once more, which the lock and the first-writer settles make
// harmless; a slow step on a live worker holds its lock, and the sweeper never
// looks at a locked run or element.
package liveness

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RecordTTL is how long a worker's task record outlives its last beat: long
// enough for the sweeper to find the tasks of a dead worker (asynq keeps
// them active, for nobody, for 30 s and more), short enough that a dead
// worker's record does not linger.
const RecordTTL = 10 * time.Minute

// maxFinished bounds the finished deliveries a worker keeps while its beats
// fail (Redis unreachable); older ones are dropped and their entries expire
// with the record.
const maxFinished = 100_000

var (
	//go:embed lua/beat.lua
	beatSrc    string
	beatScript = redis.NewScript(beatSrc)
)

// Keys builds the liveness keys under one prefix.
type Keys struct{ prefix string }

// NewKeys returns the key builder of prefix.
func NewKeys(prefix string) Keys { return Keys{prefix: prefix} }

// Registry is the zset of worker ids the sweeper reads.
func (k Keys) Registry() string { return k.prefix + ":idx:workers" }

// Alive is worker id's alive key.
func (k Keys) Alive(id string) string { return k.prefix + ":{worker:" + id + "}:alive" }

// Tasks is worker id's record of the deliveries it took.
func (k Keys) Tasks(id string) string { return k.prefix + ":{worker:" + id + "}:tasks" }

// Name is worker id's "<host>:<pid>", kept as long as its record.
func (k Keys) Name(id string) string { return k.prefix + ":{worker:" + id + "}:name" }

// Name is the name of the process with host name host and process id pid,
// as a lease records it: what asynq's server records say of a server too.
func Name(host string, pid int) string { return host + ":" + strconv.Itoa(pid) }

// Config configures a Lease.
type Config struct {
	// Client is the Redis the worker's queue is on. Required.
	Client redis.UniversalClient
	// Prefix is the engines' key prefix. Required.
	Prefix string
	// TTL is how long the alive key lives after a beat; the lease beats
	// every third of it. Required.
	TTL time.Duration
	// Logger receives a warning when a beat fails. Default slog.Default().
	Logger *slog.Logger
}

// Lease is one worker's liveness: its alive key, kept by a heartbeat, and
// the record of the deliveries it took.
type Lease struct {
	cfg  Config
	keys Keys
	id   string
	name string

	mu       sync.Mutex
	seq      uint64
	finished []string // pairs of task id, value
	failing  bool     // the last beat failed (logged once until one succeeds)

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// Start writes a new worker's alive key and starts its heartbeat. A first
// beat that fails is logged, not returned: the heartbeat tries again, and
// until it succeeds the sweeper merely knows nothing of this worker.
func Start(ctx context.Context, cfg Config) (*Lease, error) {
	if cfg.Client == nil || cfg.Prefix == "" || cfg.TTL <= 0 {
		return nil, errors.New("liveness: Config needs Client, Prefix and a positive TTL")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	l := &Lease{cfg: cfg, keys: NewKeys(cfg.Prefix), id: hex.EncodeToString(b[:]),
		name: Name(host, os.Getpid()), stop: make(chan struct{}), done: make(chan struct{})}
	l.beat(ctx)
	go l.loop()
	return l, nil
}

// ID returns the worker's id in the liveness keys.
func (l *Lease) ID() string { return l.id }

// Begin records that the worker took the delivery of task id from queue,
// before the task's handler runs, and returns the function to call when the
// handler returned. The record is one round trip; what finished is removed
// at the next beat. An error recording it is returned with a usable end:
// the task may run regardless (the sweeper then knows nothing of it).
func (l *Lease) Begin(ctx context.Context, queue, id string) (end func(), err error) {
	l.mu.Lock()
	l.seq++
	v := strconv.FormatUint(l.seq, 10) + " " + queue
	l.mu.Unlock()
	key := l.keys.Tasks(l.id)
	_, err = l.cfg.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, id, v)
		p.PExpire(ctx, key, RecordTTL)
		return nil
	})
	if err != nil {
		err = fmt.Errorf("liveness: record task %s: %w", id, err)
	}
	return func() {
		l.mu.Lock()
		if len(l.finished) >= 2*maxFinished {
			l.finished = l.finished[2:]
		}
		l.finished = append(l.finished, id, v)
		l.mu.Unlock()
	}, err
}

func (l *Lease) loop() {
	defer close(l.done)
	t := time.NewTicker(l.cfg.TTL / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL/3)
			l.beat(ctx)
			cancel()
		}
	}
}

// beat keeps the alive key and forgets the finished deliveries.
func (l *Lease) beat(ctx context.Context) {
	l.mu.Lock()
	pairs := l.finished
	l.finished = nil
	l.mu.Unlock()
	args := make([]any, 0, 3+len(pairs))
	args = append(args, l.cfg.TTL.Milliseconds(), l.name, RecordTTL.Milliseconds())
	for _, s := range pairs {
		args = append(args, s)
	}
	err := beatScript.Run(ctx, l.cfg.Client, []string{l.keys.Alive(l.id), l.keys.Tasks(l.id), l.keys.Name(l.id)}, args...).Err()
	if err == nil {
		err = l.cfg.Client.ZAdd(ctx, l.keys.Registry(), redis.Z{Score: float64(time.Now().UnixMilli()), Member: l.id}).Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		// Kept for the next beat (ahead of what finished since).
		l.finished = append(pairs, l.finished...)
		if !l.failing {
			l.cfg.Logger.Warn("worker heartbeat failed; if it keeps failing for the lease's TTL, the sweeper may deliver "+
				"this worker's unlocked tasks again", "event", "worker.liveness.beat_failed", "worker", l.id, "error", err)
		}
		l.failing = true
		return
	}
	l.failing = false
}

// Stop ends the heartbeat and deletes the worker's keys: call it once the
// worker runs no task any more. It is idempotent.
func (l *Lease) Stop(ctx context.Context) error {
	var err error
	l.once.Do(func() {
		close(l.stop)
		<-l.done
		if err = l.cfg.Client.Del(ctx, l.keys.Alive(l.id), l.keys.Tasks(l.id), l.keys.Name(l.id)).Err(); err == nil {
			err = l.cfg.Client.ZRem(ctx, l.keys.Registry(), l.id).Err()
		}
		if err != nil {
			err = fmt.Errorf("liveness: delete the lease of worker %s: %w", l.id, err)
		}
	})
	return err
}

// Verdict is what the worker records say of one active task.
type Verdict int

const (
	// Unknown: no worker's record lists the task (it runs on a worker
	// without a lease, or was taken after the records were read).
	Unknown Verdict = iota
	// Live: a worker whose alive key exists lists it.
	Live
	// Dead: only workers whose alive key expired list it.
	Dead
)

func (v Verdict) String() string {
	switch v {
	case Live:
		return "live"
	case Dead:
		return "dead"
	}
	return "unknown"
}

// View is the worker records as read at one moment.
type View struct {
	tasks map[string]Verdict // queue + "\x00" + task id
	names map[string]bool    // the workers' names, live or dead
	// Live and Dead count the workers read; Forgotten the registry entries
	// of workers gone for good (no alive key, no record), removed.
	Live, Dead, Forgotten int
}

// Of returns the verdict on task id of queue. A task listed by a live worker
// is live even if a dead one lists it too (that worker finished it and died
// before its beat forgot it, and the task was delivered again).
func (v View) Of(queue, id string) Verdict { return v.tasks[queue+"\x00"+id] }

// Leased reports whether a registered worker, live or dead, is process
// name (see Name): whether that process records its deliveries.
func (v View) Leased(name string) bool { return v.names[name] }

// Read reads every registered worker's alive key, task record and name,
// and removes from the registry the workers that have none of them left.
func Read(ctx context.Context, rdb redis.UniversalClient, prefix string) (View, error) {
	k := NewKeys(prefix)
	ids, err := rdb.ZRange(ctx, k.Registry(), 0, -1).Result()
	if err != nil {
		return View{}, fmt.Errorf("liveness: read the worker registry: %w", err)
	}
	v := View{tasks: map[string]Verdict{}, names: map[string]bool{}}
	if len(ids) == 0 {
		return v, nil
	}
	alive := make([]*redis.IntCmd, len(ids))
	tasks := make([]*redis.MapStringStringCmd, len(ids))
	names := make([]*redis.StringCmd, len(ids))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			alive[i] = p.Exists(ctx, k.Alive(id))
			tasks[i] = p.HGetAll(ctx, k.Tasks(id))
			names[i] = p.Get(ctx, k.Name(id))
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return View{}, fmt.Errorf("liveness: read the worker records: %w", err)
	}
	var gone []any
	for i, id := range ids {
		live := alive[i].Val() == 1
		rec := tasks[i].Val()
		if n := names[i].Val(); n != "" {
			v.names[n] = true
		}
		switch {
		case live:
			v.Live++
		case len(rec) == 0 && names[i].Val() == "":
			gone = append(gone, id)
			continue
		default:
			v.Dead++
		}
		for task, val := range rec {
			_, queue, ok := strings.Cut(val, " ")
			if !ok {
				continue
			}
			key := queue + "\x00" + task
			if live {
				v.tasks[key] = Live
			} else if v.tasks[key] != Live {
				v.tasks[key] = Dead
			}
		}
	}
	if len(gone) > 0 {
		// A worker that comes back (its beats failed for longer than its
		// record lives) registers again at its next beat.
		if err := rdb.ZRem(ctx, k.Registry(), gone...).Err(); err != nil {
			return v, fmt.Errorf("liveness: trim the worker registry: %w", err)
		}
		v.Forgotten = len(gone)
	}
	return v, nil
}
