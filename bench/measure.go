package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// rollbackRun is one measured run of an owner whose map is followed by a
// failing step.
type rollbackRun struct {
	fanOut   bool
	n, batch int
	undo     time.Duration
	// heapEvery is how often the sampler reads this process's heap (after
	// a GC); 0 samples once a second.
	heapEvery time.Duration
	// persistence watches Redis persistence during the run (the -heap
	// run's figures).
	persistence bool
	label       string
}

// rollbackResult is what one run measured.
type rollbackResult struct {
	// Run is the owner's run id (the key of its burst counts).
	Run               string
	Forward, Rollback time.Duration
	// HeapInuse is this process's largest HeapInuse (after GC) sampled
	// during the rollback.
	HeapInuse uint64
	// MaxPending is the largest number of tasks seen waiting in the queue
	// (asynq's pending list, sampled), MaxQueued the largest
	// pending+active. (The per-action count is read with maxBurst once
	// the workers have stopped.)
	MaxPending, MaxQueued int
	// Persistence is what Redis persistence did from the run's start to
	// its end (forward and rollback), with rollbackRun.persistence; nil
	// otherwise or when this Redis does not report it.
	Persistence *persistActivity
}

const (
	statusPoll  = 10 * time.Millisecond
	queuePoll   = 2 * time.Millisecond
	heapDefault = time.Second
)

// rollback runs r once on the bench's owner engine and checks the outcome:
// the run ends failed at "boom" with no rollback failure, the map's
// rollback settled every element, and every element's undo is recorded
// exactly once in Redis. A wrong outcome is recorded in b.failures (the run
// goes on and exits non-zero); an error means it could not be measured.
func (b *bench) rollback(ctx context.Context, r rollbackRun) (rollbackResult, error) {
	var res rollbackResult
	mode := map[bool]string{false: "in", true: "fo"}[r.fanOut]
	id := mode + "-" + shortID()
	res.Run = id
	counts, mark := b.prefix+":bench:undos:"+id, b.prefix+":bench:failed-at:"+id
	def := b.host.inline
	if r.fanOut {
		def = b.host.fanOut[r.batch]
	}
	inputs := map[string]any{"n": r.n, "undo_ns": int64(r.undo), "counts": counts, "mark": mark, "fail": true}
	mapID := mapstep.MapID(id, mapStep)

	s := newSampler(b.admin, b.queue, r.fanOut, r.heapEvery)
	if b.cfg.cpuProfile != "" {
		s.profile = filepath.Join(b.cfg.cpuProfile, "heap-"+strings.ReplaceAll(strings.ReplaceAll(r.label, " ", "-"), ",", "")+".pprof")
	}
	stopPersist := func() *persistActivity { return nil }
	if r.persistence {
		stopPersist = watchPersistence(b.admin)
	}
	stopSampler := s.start()
	stopBar := b.bar.track(r.label, func(ctx context.Context) (string, int, int) {
		if p, ok, err := mapstep.RollbackProgressOf(ctx, b.host.engine, mapID); err == nil && ok {
			return "rollback", p.Settled, p.Total
		}
		if p, ok, err := mapstep.ProgressOf(ctx, b.host.engine, mapID); err == nil && ok {
			return "forward", p.Settled, p.Total
		}
		return "starting", 0, r.n
	})
	start := time.Now()
	run, err := b.runToEnd(ctx, def, inputs, id)
	stopBar()
	stopSampler()
	res.Persistence = stopPersist()
	if err != nil {
		return res, fmt.Errorf("%s: %w", r.label, err)
	}

	failedAt, err := b.admin.Get(ctx, mark).Int64()
	if err != nil {
		return res, fmt.Errorf("%s: read the failure time: %w", r.label, err)
	}
	began := time.Unix(0, failedAt)
	res.Forward, res.Rollback = began.Sub(start), run.UpdatedAt.Sub(began)
	res.HeapInuse, res.MaxPending, res.MaxQueued = s.results(began)

	b.check(ctx, r.label, run, mapID, counts, r.n)
	return res, nil
}

// runToEnd runs def with inputs as run id and returns the run once it is
// terminal: engine.Run returns there for an inline map; a fan-out map's run
// is dispatched, and polled until it ends.
func (b *bench) runToEnd(ctx context.Context, def *reactor.Definition, inputs map[string]any, id string) (*reactor.Run, error) {
	if _, err := b.host.engine.Run(ctx, def, inputs, reactor.WithRunID(id)); err != nil {
		return nil, err
	}
	return awaitRun(ctx, b.host.engine, id)
}

// awaitRun polls run id until it is terminal.
func awaitRun(ctx context.Context, e *reactor.Engine, id string) (*reactor.Run, error) {
	t := time.NewTicker(statusPoll)
	defer t.Stop()
	for {
		run, err := e.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if run.Status.Terminal() {
			return run, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("run %s still %s: %w", id, run.Status, ctx.Err())
		case <-t.C:
		}
	}
}

// check verifies a rolled-back run and records what is wrong.
func (b *bench) check(ctx context.Context, label string, run *reactor.Run, mapID, counts string, n int) {
	fail := func(format string, args ...any) {
		b.fail(fmt.Sprintf("%s: %s", label, fmt.Sprintf(format, args...)))
	}
	if run.Status != reactor.StatusFailed {
		fail("run %s ended %s, want failed", run.ID, run.Status)
	}
	if f := run.Failure; f == nil || f.Step != failStep {
		fail("run %s failed with %v, want a failure of step %q", run.ID, f, failStep)
	} else if k := len(f.RollbackFailures) + f.RollbackFailuresOmitted; k > 0 {
		fail("run %s: %d rollback failure(s), first: %s", run.ID, k, f.RollbackFailures[0].Message)
	}
	p, ok, err := mapstep.RollbackProgressOf(ctx, b.host.engine, mapID)
	switch {
	case err != nil:
		fail("read the map's rollback: %v", err)
	case !ok:
		fail("map %s has no rollback", mapID)
	case !p.Done || p.Total != n || p.Settled != n || p.Failed != 0:
		fail("map rollback incomplete: %d of %d positions settled (total %d), %d failed", p.Settled, n, p.Total, p.Failed)
	}
	undone, err := undoCounts(ctx, b.admin, counts, n)
	if err != nil {
		fail("read the undo counts: %v", err)
		return
	}
	var missing, twice []int
	for i, c := range undone {
		switch {
		case c == 0:
			missing = append(missing, i)
		case c > 1:
			twice = append(twice, i)
		}
	}
	if len(missing) > 0 {
		fail("%d element(s) never undone, e.g. %v", len(missing), head(missing))
	}
	if len(twice) > 0 {
		fail("%d element(s) undone more than once, e.g. %v (element %d: %d times)", len(twice), head(twice), twice[0], undone[twice[0]])
	}
}

// undoCounts reads the undo count of every element 0..n-1 from the counts
// hash, 1,000 fields at a time.
func undoCounts(ctx context.Context, rdb redis.UniversalClient, key string, n int) ([]int, error) {
	out := make([]int, n)
	var cursor uint64
	for {
		kv, next, err := rdb.HScan(ctx, key, cursor, "*", 1000).Result()
		if err != nil {
			return nil, err
		}
		for i := 0; i+1 < len(kv); i += 2 {
			el, err1 := strconv.Atoi(kv[i])
			c, err2 := strconv.Atoi(kv[i+1])
			if err1 != nil || err2 != nil || el < 0 || el >= n {
				return nil, fmt.Errorf("unexpected field %q=%q in %s", kv[i], kv[i+1], key)
			}
			out[el] = c
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

func head(xs []int) []int { return xs[:min(len(xs), 5)] }

// ---- sampling ----

// sampler watches, while a run is measured, the bench's queue (how many
// tasks wait, to check back pressure) and this process's heap.
type sampler struct {
	rdb             redis.UniversalClient
	pending, active string
	queue           bool
	heapEvery       time.Duration
	// profile, when set, receives a heap profile each time the heap
	// sampled is the largest yet.
	profile               string
	mu                    sync.Mutex
	maxPending, maxQueued int
	heap                  []heapSample
	maxHeap               uint64
}

type heapSample struct {
	at    time.Time
	inuse uint64
}

func newSampler(rdb redis.UniversalClient, queue string, watchQueue bool, heapEvery time.Duration) *sampler {
	if heapEvery <= 0 {
		heapEvery = heapDefault
	}
	return &sampler{rdb: rdb, pending: "asynq:{" + queue + "}:pending", active: "asynq:{" + queue + "}:active",
		queue: watchQueue, heapEvery: heapEvery}
}

// start samples until the returned function is called; that function
// waits for the samplers to end.
func (s *sampler) start() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { s.loop(done, s.heapEvery, s.sampleHeap) })
	if s.queue {
		wg.Go(func() { s.loop(done, queuePoll, s.sampleQueue) })
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			s.sampleHeap() // the run's end
		})
	}
}

func (s *sampler) loop(done <-chan struct{}, every time.Duration, f func()) {
	t := time.NewTicker(every)
	defer t.Stop()
	f()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			f()
		}
	}
}

func (s *sampler) sampleHeap() {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s.mu.Lock()
	s.heap = append(s.heap, heapSample{at: time.Now(), inuse: ms.HeapInuse})
	largest := ms.HeapInuse > s.maxHeap
	s.maxHeap = max(s.maxHeap, ms.HeapInuse)
	s.mu.Unlock()
	if largest && s.profile != "" {
		if f, err := os.Create(s.profile); err == nil {
			_ = pprof.Lookup("heap").WriteTo(f, 0)
			_ = f.Close()
		}
	}
}

func (s *sampler) sampleQueue() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var p, a *redis.IntCmd
	_, err := s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		p, a = pipe.LLen(ctx, s.pending), pipe.LLen(ctx, s.active)
		return nil
	})
	if err != nil {
		return
	}
	s.mu.Lock()
	s.maxPending = max(s.maxPending, int(p.Val()))
	s.maxQueued = max(s.maxQueued, int(p.Val()+a.Val()))
	s.mu.Unlock()
}

// results returns the largest heap sampled from since on, and the queue
// maxima.
func (s *sampler) results(since time.Time) (heap uint64, maxPending, maxQueued int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.heap {
		if !h.at.Before(since) {
			heap = max(heap, h.inuse)
		}
	}
	return heap, s.maxPending, s.maxQueued
}

// queueDrained waits until queue has no pending or active task.
func queueDrained(ctx context.Context, rdb redis.UniversalClient, queue string) error {
	pending, active := "asynq:{"+queue+"}:pending", "asynq:{"+queue+"}:active"
	for {
		var p, a *redis.IntCmd
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			p, a = pipe.LLen(ctx, pending), pipe.LLen(ctx, active)
			return nil
		})
		if err != nil {
			return err
		}
		if p.Val()+a.Val() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("queue %s: %d pending, %d active", queue, p.Val(), a.Val()), ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}
