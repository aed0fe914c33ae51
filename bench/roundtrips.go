package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/redisnode"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// The round-trip phase runs its workers in this process whatever -procs
// says, so that one go-redis hook per client sees every round trip: the
// engine's client (goreactor's own), asynq's client (server and enqueues),
// the bench's bookkeeping client and its polling client. It also reads
// INFO commandstats around each segment: the server-side count includes the
// commands Lua scripts run, which the client cannot see. Per element is the
// slope between a small and a large map, so each map's fixed cost (start,
// resumes, adoption) drops out.

// tally counts round trips (one per command or pipeline) and commands (one
// per command, pipelined or not) on one client. The connection handshake
// (HELLO, CLIENT SETINFO) is not counted.
type tally struct {
	rts, cmds atomic.Int64
}

func (t *tally) DialHook(next redis.DialHook) redis.DialHook { return next }

func (t *tally) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "hello" {
			t.rts.Add(1)
			t.cmds.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (t *tally) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() != "hello" && cmds[0].Name() != "client" {
			t.rts.Add(1)
			t.cmds.Add(int64(len(cmds)))
		}
		return next(ctx, cmds)
	}
}

// counts is a snapshot of every counter.
type counts struct {
	engine, asynq, books, poll int64 // round trips
	ownCmds                    int64 // commands of the books and poll clients
	server                     int64 // INFO commandstats calls, INFO itself excluded
}

func (c counts) sub(o counts) counts {
	return counts{engine: c.engine - o.engine, asynq: c.asynq - o.asynq, books: c.books - o.books, poll: c.poll - o.poll,
		ownCmds: c.ownCmds - o.ownCmds, server: c.server - o.server}
}

// rtResult is what the round-trip phase measured, per element (or task).
type rtResult struct {
	EngineForward, EngineRollback float64 // goreactor's own round trips
	AsynqForward, AsynqRollback   float64 // asynq's round trips in the map
	CmdsForward, CmdsRollback     float64 // Redis commands (server side, all clients of the map)
	BareRTs, BareCmds             float64 // a bare asynq no-op task
	Small, Large                  int
	ServerCounts                  bool // false when INFO commandstats is unavailable
	// OtherClients is the most connections of other clients seen on the
	// Redis during the phase: their commands are in the server counts.
	OtherClients int
}

// commandCalls sums the calls of INFO commandstats, except INFO's own,
// over every master of a cluster.
func commandCalls(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
	var total atomic.Int64
	err := redisnode.EachMaster(ctx, rdb, func(ctx context.Context, node *redis.Client) error {
		info, err := node.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		n, err := parseCommandCalls(info)
		total.Add(n)
		return err
	})
	return total.Load(), err
}

// parseCommandCalls sums the calls in the text of INFO commandstats,
// except INFO's own.
func parseCommandCalls(info string) (int64, error) {
	var total int64
	found := false
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		found = true
		if name == "cmdstat_info" {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("INFO commandstats: %q: %w", line, err)
				}
				total += n
			}
		}
	}
	if !found {
		return 0, fmt.Errorf("INFO commandstats lists no commands")
	}
	return total, nil
}

// roundTrips measures the fan-out map's round trips and commands per
// element, forward and rollback, and a bare asynq task's.
func (b *bench) roundTrips(ctx context.Context) (rtResult, error) {
	res := rtResult{Large: b.cfg.elements, Small: max(b.cfg.elements/4, 10), ServerCounts: !b.tgt.embedded}
	if res.Small >= res.Large {
		res.Small = res.Large / 2
	}
	queue := b.queue + "-rt"
	b.queues = append(b.queues, queue)

	pool := b.cfg.workers*2 + 4
	var engineT, asynqT, booksT, pollT tally
	clients := make([]redis.UniversalClient, 0, 5)
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	newClient := func(t *tally) (redis.UniversalClient, error) {
		c := b.tgt.client(pool)
		if cc, ok := c.(*redis.ClusterClient); ok {
			// On each node: a cluster client's pipeline is one round
			// trip per node it splits over.
			cc.OnNewNode(func(node *redis.Client) { node.AddHook(t) })
		} else {
			c.AddHook(t)
		}
		clients = append(clients, c)
		return c, nil
	}
	engineRdb, err := newClient(&engineT)
	if err != nil {
		return res, err
	}
	asynqRdb, _ := newClient(&asynqT)
	booksRdb, _ := newClient(&booksT)
	pollRdb, _ := newClient(&pollT)

	snap := func(ctx context.Context) (counts, error) {
		c := counts{engine: engineT.rts.Load(), asynq: asynqT.rts.Load(), books: booksT.rts.Load(), poll: pollT.rts.Load(),
			ownCmds: booksT.cmds.Load() + pollT.cmds.Load()}
		if res.ServerCounts {
			n, err := commandCalls(ctx, b.admin)
			if err != nil {
				return c, err
			}
			c.server = n
		}
		return c, nil
	}

	spec := poolSpec{Prefix: b.prefix, Queue: queue, Batches: []int{b.cfg.batch}, DoubleUndo: -1}
	h, err := newHost(ctx, spec, engineRdb, asynqRdb, booksRdb, b.bursts)
	if err != nil {
		return res, err
	}
	defer h.close()
	var (
		mu      sync.Mutex
		atFail  counts
		failErr error
	)
	h.world.onFail = func(ctx context.Context) {
		c, err := snap(ctx)
		mu.Lock()
		atFail, failErr = c, err
		mu.Unlock()
	}
	poller, err := reactor.NewEngine(ctx, reactor.Config{Client: pollRdb, Prefix: b.prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return res, err
	}
	w := worker.New(h.engine, asynqRdb, worker.Config{Concurrency: b.cfg.workers, Queues: map[string]int{queue: 1},
		ShutdownTimeout: shutdownGrace, Logger: b.log})
	if err := w.Start(ctx); err != nil {
		return res, err
	}
	stopWorker := func() error {
		sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		return w.Stop(sctx)
	}
	defer func() { _ = stopWorker() }() // idempotent

	// measure runs one n-element map that fails after it, and returns the
	// forward (start to failure) and rollback (failure to quiet queue)
	// deltas.
	measure := func(n int) (fwd, rb counts, err error) {
		id := "rt-" + shortID()
		undos, mark := b.prefix+":bench:undos:"+id, b.prefix+":bench:failed-at:"+id
		s0, err := snap(ctx)
		if err != nil {
			return fwd, rb, err
		}
		if _, err := h.engine.Run(ctx, h.fanOut[b.cfg.batch], map[string]any{"n": n, "counts": undos, "mark": mark, "fail": true},
			reactor.WithRunID(id)); err != nil {
			return fwd, rb, err
		}
		run, err := awaitRun(ctx, poller, id)
		if err != nil {
			return fwd, rb, err
		}
		if err := queueDrained(ctx, pollRdb, queue); err != nil {
			return fwd, rb, err
		}
		s2, err := snap(ctx)
		if err != nil {
			return fwd, rb, err
		}
		mu.Lock()
		s1, ferr := atFail, failErr
		mu.Unlock()
		if ferr != nil {
			return fwd, rb, ferr
		}
		label := fmt.Sprintf("round trips (%d elements)", n)
		b.check(ctx, label, run, id+"~"+mapStep, undos, n)
		if _, err := b.checkBurst(ctx, label, id, b.cfg.batch); err != nil { // its workers are in this process
			return fwd, rb, err
		}
		return s1.sub(s0), s2.sub(s1), nil
	}
	if res.ServerCounts {
		oc, err := otherClients(ctx, b.admin)
		if err != nil {
			return res, err
		}
		res.OtherClients = oc
		defer func() {
			if oc, err := otherClients(ctx, b.admin); err == nil {
				res.OtherClients = max(res.OtherClients, oc)
			}
		}()
	}
	stopBar := b.bar.track("round trips and commands", func(context.Context) (string, int, int) {
		return "fan-out", int(engineT.rts.Load()), 0
	})
	fs, rs, err := measure(res.Small)
	if err != nil {
		stopBar()
		return res, fmt.Errorf("round trips: %w", err)
	}
	fl, rl, err := measure(res.Large)
	stopBar()
	if err != nil {
		return res, fmt.Errorf("round trips: %w", err)
	}
	per := func(small, large int64) float64 { return float64(large-small) / float64(res.Large-res.Small) }
	res.EngineForward, res.EngineRollback = per(fs.engine, fl.engine), per(rs.engine, rl.engine)
	res.AsynqForward, res.AsynqRollback = per(fs.asynq, fl.asynq), per(rs.asynq, rl.asynq)
	res.CmdsForward = per(fs.server-fs.ownCmds, fl.server-fl.ownCmds)
	res.CmdsRollback = per(rs.server-rs.ownCmds, rl.server-rl.ownCmds)
	if err := stopWorker(); err != nil { // its idle polling would count as the bare tasks' commands
		return res, err
	}

	// A bare asynq no-op task, counted the same way.
	bareQueue := b.queue + "-rt-bare"
	b.queues = append(b.queues, bareQueue)
	var bareT tally
	bareRdb, err := newClient(&bareT)
	if err != nil {
		return res, err
	}
	cfg := serverConfig(bareQueue, b.cfg.workers)
	cfg.Logger = asynqLog{b.log}
	srv := asynq.NewServerFromRedisClient(bareRdb, cfg)
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		return res, err
	}
	defer srv.Shutdown()
	bare := func(n int) (rts, cmds int64, err error) {
		before := bareT.rts.Load()
		c0, err := snap(ctx)
		if err != nil {
			return 0, 0, err
		}
		if _, err := bareAsynq(ctx, bareRdb, pollRdb, bareQueue, n); err != nil {
			return 0, 0, err
		}
		c1, err := snap(ctx)
		if err != nil {
			return 0, 0, err
		}
		d := c1.sub(c0)
		return bareT.rts.Load() - before, d.server - d.ownCmds, nil
	}
	rtS, cmdS, err := bare(res.Small)
	if err != nil {
		return res, err
	}
	rtL, cmdL, err := bare(res.Large)
	if err != nil {
		return res, err
	}
	res.BareRTs, res.BareCmds = per(rtS, rtL), per(cmdS, cmdL)
	return res, nil
}

// shortID is a random 8-character id.
func shortID() string { return reactor.NewRunID()[:8] }
