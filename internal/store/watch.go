package store

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrWatchUnsupported is returned by Watcher.Watch when the server has no
// sharded pub/sub (Redis before 7.0): callers poll instead.
var ErrWatchUnsupported = errors.New("store: the Redis server has no sharded pub/sub (SSUBSCRIBE, Redis 7+)")

const (
	// watchHealthEvery is how long a shared subscriber connection may stay
	// silent before it is pinged; a ping unanswered for as long again
	// replaces the connection.
	watchHealthEvery = 5 * time.Second
	// watchBackoffMax caps the pause between attempts to replace a broken
	// subscriber connection.
	watchBackoffMax = 5 * time.Second
)

// Watcher tells waiters that a run's terminal write was announced on its
// Done channel (write.lua SPUBLISHes it). It multiplexes every waiter of a
// process over shared shard pub/sub connections: one for a single Redis,
// one per master node for a Redis Cluster (a shard channel can only be
// subscribed on the node serving its slot). A channel is subscribed while
// it has a waiter and unsubscribed when its last waiter leaves; a
// connection is closed when it serves no channel.
//
// A Watch's C also fires when its subscription is confirmed, also after a
// connection was replaced: a waiter re-reads the run then, so a terminal
// write published while nobody listened is not missed. Delivery is not
// guaranteed (a connection can break between a publish and its delivery):
// waiters keep a slow poll as a fallback.
//
// It is safe for concurrent use.
type Watcher struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // nil: one connection serves every channel

	probeMu  sync.Mutex
	probed   bool
	probeErr error // ErrWatchUnsupported, once probed

	mu     sync.Mutex
	shards map[string]*shard       // by master address ("" without a cluster)
	chans  map[string]*watchedChan // by channel
}

type watchedChan struct {
	shard   *shard
	waiters map[*Watch]struct{}
}

// shard is one shared subscriber connection and the channels it serves.
type shard struct {
	addr   string
	ps     *redis.PubSub
	chans  map[string]struct{}
	closed bool
	stop   chan struct{} // closed with the shard: ends its receive loop
}

// Watch is one waiter's interest in one channel. Close it when done.
type Watch struct {
	// C receives (coalesced, never blocking the sender) when the channel
	// carried a message or its subscription was (re)confirmed: read the
	// watched state again.
	C <-chan struct{}
	c chan struct{}

	w       *Watcher
	channel string
	once    sync.Once
}

// NewWatcher returns a Watcher over rdb. It connects only once something is
// watched.
func NewWatcher(rdb redis.UniversalClient) *Watcher {
	cc, _ := rdb.(*redis.ClusterClient)
	return &Watcher{rdb: rdb, cluster: cc, shards: map[string]*shard{}, chans: map[string]*watchedChan{}}
}

// Watcher returns the store's Watcher, shared by every waiter of the store.
func (s *Store) Watcher() *Watcher { return s.watcher }

// probe asks the server, once, whether it knows SSUBSCRIBE. A transport
// error is no answer: the next Watch asks again.
func (w *Watcher) probe(ctx context.Context) error {
	w.probeMu.Lock()
	defer w.probeMu.Unlock()
	if w.probed {
		return w.probeErr
	}
	res, err := w.rdb.Do(ctx, "COMMAND", "INFO", "SSUBSCRIBE").Slice()
	if err != nil {
		return err
	}
	w.probed = true
	if len(res) == 0 || res[0] == nil {
		w.probeErr = ErrWatchUnsupported
	}
	return w.probeErr
}

// Watch subscribes to channel (or joins its subscription). The returned
// Watch fires once the subscription is confirmed; a caller that reads the
// watched state after that sees every later terminal write announced.
func (w *Watcher) Watch(ctx context.Context, channel string) (*Watch, error) {
	if err := w.probe(ctx); err != nil {
		return nil, err
	}
	addr := ""
	if w.cluster != nil {
		m, err := w.cluster.MasterForKey(ctx, channel)
		if err != nil {
			return nil, err
		}
		addr = m.Options().Addr
	}
	c := make(chan struct{}, 1)
	wt := &Watch{C: c, c: c, w: w, channel: channel}
	w.mu.Lock()
	defer w.mu.Unlock()
	if wc, ok := w.chans[channel]; ok {
		wc.waiters[wt] = struct{}{}
		// Already subscribed (or about to be confirmed, which wakes every
		// waiter): read once now.
		wt.wake()
		return wt, nil
	}
	sh := w.shards[addr]
	if sh == nil {
		sh = &shard{addr: addr, ps: w.rdb.SSubscribe(ctx), chans: map[string]struct{}{}, stop: make(chan struct{})}
		w.shards[addr] = sh
		go w.receive(sh)
	}
	sh.chans[channel] = struct{}{}
	w.chans[channel] = &watchedChan{shard: sh, waiters: map[*Watch]struct{}{wt: {}}}
	// The command is only written here; its confirmation arrives on the
	// receive loop. A write error leaves the channel registered: the
	// receive loop replaces the broken connection and subscribes it again.
	_ = sh.ps.SSubscribe(ctx, channel)
	return wt, nil
}

func (wt *Watch) wake() {
	select {
	case wt.c <- struct{}{}:
	default:
	}
}

// Close ends the Watch; the channel is unsubscribed when it was its last
// waiter, and the connection closed when it served nothing else.
func (wt *Watch) Close() {
	wt.once.Do(func() { wt.w.unwatch(wt) })
}

func (w *Watcher) unwatch(wt *Watch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wc := w.chans[wt.channel]
	if wc == nil {
		return
	}
	delete(wc.waiters, wt)
	if len(wc.waiters) > 0 {
		return
	}
	delete(w.chans, wt.channel)
	sh := wc.shard
	delete(sh.chans, wt.channel)
	if len(sh.chans) > 0 {
		_ = sh.ps.SUnsubscribe(context.Background(), wt.channel)
		return
	}
	w.closeShardLocked(sh)
}

func (w *Watcher) closeShardLocked(sh *shard) {
	sh.closed = true
	close(sh.stop)
	if w.shards[sh.addr] == sh {
		delete(w.shards, sh.addr)
	}
	_ = sh.ps.Close()
}

// wakeChannel wakes every waiter of channel.
func (w *Watcher) wakeChannel(channel string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wc := w.chans[channel]; wc != nil {
		for wt := range wc.waiters {
			wt.wake()
		}
	}
}

// resubscribe subscribes channel on sh again if sh still serves it.
func (w *Watcher) resubscribe(ctx context.Context, sh *shard, channel string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wc := w.chans[channel]; wc != nil && wc.shard == sh && !sh.closed {
		_ = sh.ps.SSubscribe(ctx, channel)
	}
}

// receive reads shard sh's connection until the shard is closed.
func (w *Watcher) receive(sh *shard) {
	ctx := context.Background()
	var (
		pinged  bool
		backoff time.Duration
	)
	for {
		w.mu.Lock()
		if sh.closed {
			w.mu.Unlock()
			return
		}
		ps := sh.ps
		w.mu.Unlock()
		msg, err := ps.ReceiveTimeout(ctx, watchHealthEvery)
		if err == nil {
			pinged, backoff = false, 0
			switch m := msg.(type) {
			case *redis.Message:
				w.wakeChannel(m.Channel)
			case *redis.Subscription:
				switch m.Kind {
				case "ssubscribe":
					w.wakeChannel(m.Channel)
				case "sunsubscribe":
					// Ours, or the server's when the channel's slot
					// moved away: subscribe again if it is still
					// watched (a MOVED reply then re-routes it).
					w.resubscribe(ctx, sh, m.Channel)
				}
			}
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && !pinged {
			// Silence: make sure the connection is alive.
			pinged = true
			_ = ps.Ping(ctx)
			continue
		}
		// Closed, broken, a ping unanswered, or a Redis error reply (a slot
		// that moved; go-redis's own resubscribe after a reconnect sends
		// every channel in one SSUBSCRIBE, which a cluster refuses across
		// slots). Replace the connection and subscribe each channel again;
		// the confirmations wake the waiters, who re-read their runs.
		if backoff > 0 {
			select {
			case <-sh.stop:
				return
			case <-time.After(backoff):
			}
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), watchBackoffMax)
		pinged = false
		w.replace(ctx, sh)
	}
}

// replace gives shard sh a fresh connection and subscribes its channels
// again, one command per channel on a cluster (each SSUBSCRIBE must stay in
// one slot), one for all on a single Redis. On a cluster, channels whose
// slot moved to another master go to that master's shard.
func (w *Watcher) replace(ctx context.Context, sh *shard) {
	if w.cluster != nil {
		w.cluster.ReloadState(ctx)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if sh.closed {
		return
	}
	_ = sh.ps.Close()
	sh.ps = w.rdb.SSubscribe(ctx)
	if w.cluster == nil {
		chans := make([]string, 0, len(sh.chans))
		for ch := range sh.chans {
			chans = append(chans, ch)
		}
		_ = sh.ps.SSubscribe(ctx, chans...)
		return
	}
	for ch := range sh.chans {
		m, err := w.cluster.MasterForKey(ctx, ch)
		if err == nil && m.Options().Addr != sh.addr {
			w.moveLocked(ctx, ch, m.Options().Addr)
			continue
		}
		_ = sh.ps.SSubscribe(ctx, ch)
	}
	if len(sh.chans) == 0 {
		w.closeShardLocked(sh)
	}
}

// moveLocked moves channel to the shard of master addr.
func (w *Watcher) moveLocked(ctx context.Context, channel, addr string) {
	wc := w.chans[channel]
	delete(wc.shard.chans, channel)
	to := w.shards[addr]
	if to == nil {
		to = &shard{addr: addr, ps: w.rdb.SSubscribe(ctx), chans: map[string]struct{}{}, stop: make(chan struct{})}
		w.shards[addr] = to
		go w.receive(to)
	}
	to.chans[channel] = struct{}{}
	wc.shard = to
	_ = to.ps.SSubscribe(ctx, channel)
}

// Connections reports how many shared subscriber connections are open (for
// tests and metrics).
func (w *Watcher) Connections() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.shards)
}
