package store

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// batcher coalesces the writes of concurrent runs into shared pipelines
// (group commit): a write queues its commands and waits; a flusher sends
// everything queued as one pipeline, so that under load one round trip
// carries many runs' writes, and Redis and this process each pay one read
// and one write system call for all of them. A write that finds a flusher
// slot free is sent at once, so an idle engine adds no delay; only while
// maxFlushes pipelines are in flight do writes wait and group.
//
// Each request's commands stay together and in order within the pipeline
// (on one Redis, a pipeline runs in the order it was queued), and each
// request reads only its own commands' results: one run's failed command
// never fails another's.
type batcher struct {
	rdb redis.UniversalClient

	mu       sync.Mutex
	pending  []*batchReq
	flushing int // flushers running
}

// maxFlushes bounds the pipelines in flight at once: enough to keep Redis
// busy while replies travel, few enough that a loaded engine groups its
// writes rather than spreading them over as many connections. (Measured
// on a 3-step run from 64 goroutines: 1 to 4 alike, 8 and 16 cost more
// CPU per run on both sides.)
const maxFlushes = 4

// maxBatch bounds the requests of one pipeline, so that one flush's reply
// stays a few hundred kilobytes at most.
const maxBatch = 256

type batchReq struct {
	ctx   context.Context
	queue func(p redis.Pipeliner)
	cmds  []redis.Cmder
	done  chan struct{}
}

func newBatcher(rdb redis.UniversalClient) *batcher { return &batcher{rdb: rdb} }

// do queues queue's commands on the next shared pipeline, waits for its
// reply, and returns the commands queue added (each with its own result or
// error). A ctx that ends first returns ctx.Err(); the commands may still
// be sent, as a command whose reply is abandoned may have been.
func (b *batcher) do(ctx context.Context, queue func(p redis.Pipeliner)) ([]redis.Cmder, error) {
	r := &batchReq{ctx: ctx, queue: queue, done: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, r)
	if b.flushing < maxFlushes {
		b.flushing++
		go b.flushLoop()
	}
	b.mu.Unlock()
	select {
	case <-r.done:
		return r.cmds, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// flushLoop sends pipelines until nothing is queued, then ends: no
// goroutine outlives the writes it serves.
func (b *batcher) flushLoop() {
	for {
		b.mu.Lock()
		n := min(len(b.pending), maxBatch)
		if n == 0 {
			b.flushing--
			b.mu.Unlock()
			return
		}
		batch := b.pending[:n:n]
		b.pending = b.pending[n:]
		if len(b.pending) == 0 {
			b.pending = nil
		}
		b.mu.Unlock()
		b.flush(batch)
	}
}

func (b *batcher) flush(batch []*batchReq) {
	// The flush serves many callers: none's cancellation may cut the
	// others' writes short. go-redis bounds it by its own timeouts.
	ctx := context.Background()
	for _, r := range batch {
		// One request that waits for replicas (WithAcks) makes the
		// pipeline end with WAIT: it covers every write before it.
		if a := acksOf(r.ctx); a != nil && r.ctx.Err() == nil {
			ctx = WithAcks(ctx, a)
			break
		}
	}
	p := b.rdb.Pipeline()
	marks := make([]int, len(batch)+1)
	for i, r := range batch {
		// A caller that gave up before its turn is not sent: as with a
		// single command, only a write already on its way may land.
		if r.ctx.Err() == nil {
			r.queue(p)
		}
		marks[i+1] = p.Len()
	}
	var cmds []redis.Cmder
	if p.Len() > 0 {
		cmds, _ = p.Exec(ctx)
	}
	for i, r := range batch {
		if len(cmds) == marks[len(batch)] && marks[i+1] > marks[i] {
			r.cmds = cmds[marks[i]:marks[i+1]]
		}
		close(r.done)
	}
}
