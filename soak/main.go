// Command soak is goreactor's bounded chaos loop (make soak):
//
//	go run ./soak [-duration 4m] [-seed N] [-workers 4] [-runs 40] [-redis-restarts 2] [-keep] [-v]
//
// It starts a redis-server of its own (append-only, fsync on every write, in
// a temporary directory), a few worker processes (this binary again, in
// worker mode, each with a sweeper replica under the sweeper's leader lock),
// and enqueues owner runs drawn from the seed: each owner runs an undoable
// step, a fan-out map of 50 to 400 elements (batch size 20, 35 or 50, atomic
// or partial) whose elements have two undoable steps and fail by plan, and a
// step after the map that fails for some runs; some runs are cancelled a
// few seconds in. Meanwhile it kills a random worker with SIGKILL every few
// seconds (and starts a replacement), and restarts Redis on the same port
// and files, alternately after SIGTERM and SIGKILL. Runs are launched over
// the first 65% of -duration, the chaos stops at 75%, and the runs must have
// ended 15 s before the end.
//
// When every run has ended, or at the bound, it stops the workers and checks
// the invariants from what Redis holds (see check.go): every completed step
// of a run that rolled back was undone, and nothing of a run that completed;
// a step cut short mid-Run in a run that rolled back was compensated if its
// effect had happened; a step ran, or was undone or compensated, again only
// where a kill, a Redis restart or a lost lock cut the earlier call short
// (so an undo runs at most twice, unless two interruptions hit the same
// entry in a row); every owner finished once, with the status its plan
// implies; nobody claimed a batch or an owner signal twice; the sweepers
// never enqueued more than a batch per map per pass, nor for a run or
// element that was alive; and no run was left unfinished. It prints each
// violation on a line of its own, notes (counters, and what is worth a look
// without being a violation), then a one-line summary last, and exits 1 on
// any violation (2 when it could not set up). The whole soak, drain and
// checks included, stays within -duration (at most 5 minutes). Child
// processes are killed on exit, on Ctrl-C, and should the soak itself die;
// the temporary directory is removed unless -keep.
//
// Summary fields: runs (owner runs) by final status; elements (element runs
// that started); undone (undoable step entries undone or compensated, each
// counted once, the owners' included) and undo_twice (entries undone or
// compensated twice); compensated (entries of steps cut short mid-Run whose
// Compensate found their effect and reversed it); worker_kills;
// redis_restarts; sweeper_recovered (tasks the sweepers enqueued); and the
// number of violations.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

func main() {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(workerMain(spec))
	}
	os.Exit(run(os.Args[1:]))
}

// maxDuration caps -duration: the whole soak, drain and checks included.
const maxDuration = 5 * time.Minute

// checkReserve is the part of the duration kept for stopping the workers
// and checking.
const checkReserve = 15 * time.Second

type config struct {
	duration time.Duration
	seed     uint64
	workers  int
	runs     int
	restarts int
	verbose  bool
	keep     bool
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.DurationVar(&c.duration, "duration", 4*time.Minute, "bound of the whole soak, drain and checks included (at most 5m)")
	fs.Uint64Var(&c.seed, "seed", 0, "seed of the workload and the chaos (0: random)")
	fs.IntVar(&c.workers, "workers", 4, "worker processes")
	fs.IntVar(&c.runs, "runs", 40, "owner runs")
	fs.IntVar(&c.restarts, "redis-restarts", 2, "Redis restarts (alternately SIGTERM and SIGKILL)")
	fs.BoolVar(&c.verbose, "v", false, "info-level worker logs")
	fs.BoolVar(&c.keep, "keep", false, "keep the temporary directory (Redis files, worker logs)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case c.duration > maxDuration:
		return c, fmt.Errorf("-duration %s is over the %s cap", c.duration, maxDuration)
	case c.duration < time.Minute:
		return c, errors.New("-duration must be at least 1m")
	case c.workers < 2:
		return c, errors.New("-workers must be at least 2 (one is killed at a time)")
	case c.runs < 1:
		return c, errors.New("-runs must be at least 1")
	}
	if c.seed == 0 {
		c.seed = rand.Uint64N(1 << 31)
	}
	return c, nil
}

func run(args []string) int {
	cfg, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// go-redis logs every failed dial; the outages make plenty.
	redis.SetLogger(quietLogger{})
	s := &soak{cfg: cfg, start: time.Now(), log: os.Stderr, launches: map[string]*launch{}}
	defer s.close()
	if err := s.setup(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "soak: setup: %v\n", err)
		return 2
	}
	s.logf("seed=%d duration=%s workers=%d runs=%d redis=%s dir=%s", cfg.seed, cfg.duration, cfg.workers, cfg.runs, s.redis.addr(), s.dir)
	plans := makePlans(cfg.seed, cfg.runs, cfg.duration*13/20)
	s.drive(ctx, plans)
	if ctx.Err() != nil {
		fmt.Println("soak: interrupted")
		return 1
	}
	s.stopWorkers()
	f := s.check(ctx, plans)
	for _, v := range f.violations {
		fmt.Println("soak: VIOLATION " + v)
	}
	for _, n := range f.notes {
		fmt.Println("soak: note " + n)
	}
	fmt.Println(f.summary(s))
	if len(f.violations) > 0 {
		return 1
	}
	return 0
}

// soak is the parent process: Redis, the workers, the runs and the chaos.
type soak struct {
	cfg   config
	start time.Time
	log   io.Writer
	dir   string

	redis  *redisServer
	rdb    redis.UniversalClient
	rec    *recorder
	engine *reactor.Engine
	defs   map[string]*reactor.Definition

	mu       sync.Mutex
	workers  []*workerProc
	spawned  int
	kills    []kill
	outages  []outage
	launches map[string]*launch
	fatal    error
}

type kill struct {
	pid int
	at  time.Time
}

// outage is a Redis restart: down when the signal was sent, up when the
// server answered again.
type outage struct {
	down, up time.Time
	signal   string
}

// launch is what happened to a run on the client side.
type launch struct {
	enqueued bool
	cancel   string // how Cancel answered, once called
	done     bool   // terminal, as last seen
}

func (s *soak) logf(format string, args ...any) {
	fmt.Fprintf(s.log, "soak: %5.1fs "+format+"\n", append([]any{time.Since(s.start).Seconds()}, args...)...)
}

func (s *soak) setup(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "goreactor-soak-")
	if err != nil {
		return err
	}
	s.dir = dir
	if s.redis, err = startRedis(dir); err != nil {
		return err
	}
	s.rdb, s.rec = newClient(s.redis.addr(), os.Getpid(), 0)
	s.engine, err = newEngine(ctx, reactor.Config{Client: s.rdb, Enqueuer: worker.NewClient(s.rdb, queue),
		Logger: slog.New(slog.DiscardHandler), Hooks: []reactor.Hook{s.rec.hook()}})
	if err != nil {
		return err
	}
	s.defs = map[string]*reactor.Definition{}
	for _, d := range s.rec.definitions() {
		s.defs[d.Name()] = d
	}
	for _, d := range s.defs {
		if err := s.engine.Register(d); err != nil {
			return err
		}
	}
	rng := rand.New(rand.NewPCG(s.cfg.seed, 1))
	for range s.cfg.workers {
		if err := s.spawn(ctx, rng); err != nil {
			return err
		}
	}
	return nil
}

// spawn starts one more worker process, with a concurrency of 2 to 6.
func (s *soak) spawn(ctx context.Context, rng *rand.Rand) error {
	s.mu.Lock()
	s.spawned++
	n := s.spawned
	s.mu.Unlock()
	spec := workerSpec{Addr: s.redis.addr(), Concurrency: 2 + rng.IntN(5), Sweep: true, Verbose: s.cfg.verbose}
	w, err := spawnWorker(ctx, spec, filepath.Join(s.dir, fmt.Sprintf("worker-%02d.log", n)))
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.workers = append(s.workers, w)
	s.mu.Unlock()
	return nil
}

// close stops every child process and removes the temporary directory.
func (s *soak) close() {
	s.stopWorkers()
	if s.rdb != nil {
		_ = s.rdb.Close()
	}
	if s.redis != nil {
		s.redis.stop(syscall.SIGKILL)
	}
	if s.dir == "" {
		return
	}
	if s.cfg.keep {
		fmt.Fprintf(s.log, "soak: kept %s\n", s.dir)
		return
	}
	_ = os.RemoveAll(s.dir)
}

func (s *soak) stopWorkers() {
	s.mu.Lock()
	ws := s.workers
	s.workers = nil
	s.mu.Unlock()
	for _, w := range ws {
		w.kill()
	}
}

// drive launches the runs and the chaos, and returns when every run has
// ended, or at the bound, once the queue has settled.
func (s *soak) drive(ctx context.Context, plans []runPlan) {
	d := s.cfg.duration
	bound := s.start.Add(d - checkReserve)
	runCtx, cancel := context.WithDeadline(ctx, bound)
	defer cancel()
	for _, p := range plans {
		s.launches[p.ID] = &launch{}
	}
	var wg sync.WaitGroup
	for _, p := range plans {
		wg.Go(func() { s.launch(runCtx, p) })
	}
	chaosCtx, stopChaos := context.WithDeadline(runCtx, s.start.Add(d*3/4))
	wg.Go(func() { s.chaos(chaosCtx) })
	s.await(runCtx, plans)
	stopChaos()
	cancel()
	wg.Wait()
	s.settleQueue(ctx, bound.Add(checkReserve/2))
}

// launch enqueues run p at its time, and cancels it later if its plan says
// so. Redis trouble is retried until the bound.
func (s *soak) launch(ctx context.Context, p runPlan) {
	if !sleep(ctx, time.Until(s.start.Add(p.LaunchAt))) {
		return
	}
	def := s.defs[p.Shape.name()]
	for {
		_, err := s.engine.Enqueue(ctx, def, p.inputs(), reactor.WithRunID(p.ID))
		if err == nil {
			break
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return
		}
	}
	s.mu.Lock()
	s.launches[p.ID].enqueued = true
	s.mu.Unlock()
	if p.CancelAfter == 0 || !sleep(ctx, p.CancelAfter) {
		return
	}
	s.mu.Lock()
	s.launches[p.ID].cancel = "no answer" // it may have taken effect all the same
	s.mu.Unlock()
	for {
		err := s.engine.Cancel(ctx, p.ID)
		answer := ""
		switch {
		case err == nil:
			answer = "requested"
		case errors.Is(err, reactor.ErrAlreadyFinished):
			answer = "already finished"
		case errors.Is(err, reactor.ErrRollbackInProgress):
			answer = "rolling back"
		}
		if answer != "" {
			s.mu.Lock()
			s.launches[p.ID].cancel = answer
			s.mu.Unlock()
			return
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return
		}
	}
}

// await polls the runs until every one has ended or ctx ends, reporting
// progress every 15 s.
func (s *soak) await(ctx context.Context, plans []runPlan) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		ended := 0
		for _, p := range plans {
			s.mu.Lock()
			l := *s.launches[p.ID]
			s.mu.Unlock()
			if l.done {
				ended++
				continue
			}
			if !l.enqueued {
				continue
			}
			run, err := s.engine.Get(ctx, p.ID)
			if err == nil && run.Status.Terminal() {
				s.mu.Lock()
				s.launches[p.ID].done = true
				s.mu.Unlock()
				ended++
			}
		}
		if ended == len(plans) {
			s.logf("every run ended")
			return
		}
		if time.Since(last) >= 15*time.Second {
			last = time.Now()
			s.mu.Lock()
			kills, restarts := len(s.kills), len(s.outages)
			s.mu.Unlock()
			s.logf("runs ended %d/%d, worker kills %d, redis restarts %d", ended, len(plans), kills, restarts)
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				s.logf("bound reached with %d of %d runs ended", ended, len(plans))
			}
			return
		case <-tick.C:
		}
	}
}

// chaos kills a random worker every 2 to 6 s (starting a replacement) and
// restarts Redis at evenly spaced times, until ctx ends.
func (s *soak) chaos(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.cfg.seed, 2))
	var restartAt []time.Duration
	for k := range s.cfg.restarts {
		restartAt = append(restartAt, s.cfg.duration/5+s.cfg.duration*time.Duration(2*(k+1))/time.Duration(5*(s.cfg.restarts+1)))
	}
	hard := false
	for {
		if !sleep(ctx, 2*time.Second+time.Duration(rng.Int64N(int64(4*time.Second)))) {
			return
		}
		if len(restartAt) > 0 && time.Since(s.start) >= restartAt[0] {
			restartAt = restartAt[1:]
			if err := s.restartRedis(hard); err != nil {
				s.logf("cannot restart redis: %v", err)
				s.mu.Lock()
				s.fatal = err
				s.mu.Unlock()
				return
			}
			hard = !hard
			continue
		}
		s.killWorker(ctx, rng)
	}
}

// restartRedis stops Redis (SIGTERM, or SIGKILL when hard), leaves it down
// for a second and a half, and starts it again on the same port and files.
func (s *soak) restartRedis(hard bool) error {
	sig, name := syscall.SIGTERM, "SIGTERM"
	if hard {
		sig, name = syscall.SIGKILL, "SIGKILL"
	}
	down := time.Now()
	s.redis.stop(sig)
	time.Sleep(1500 * time.Millisecond)
	err := s.redis.start()
	for try := 0; err != nil && try < 3; try++ {
		time.Sleep(time.Second)
		err = s.redis.start()
	}
	if err != nil {
		return err
	}
	up := time.Now()
	s.mu.Lock()
	s.outages = append(s.outages, outage{down: down, up: up, signal: name})
	s.mu.Unlock()
	s.logf("redis restarted after %s, down %.1fs", name, up.Sub(down).Seconds())
	return nil
}

// killWorker kills a random worker with SIGKILL and starts a replacement.
func (s *soak) killWorker(ctx context.Context, rng *rand.Rand) {
	s.mu.Lock()
	if len(s.workers) == 0 {
		s.mu.Unlock()
		return
	}
	j := rng.IntN(len(s.workers))
	w := s.workers[j]
	s.mu.Unlock()
	// The sweepers must know of the kill before anything of it can be
	// judged: no record, no kill.
	if err := s.rdb.SAdd(ctx, killedKey, w.pid).Err(); err != nil {
		return
	}
	w.kill()
	at := time.Now()
	s.mu.Lock()
	s.workers = slices.Delete(s.workers, j, j+1)
	s.kills = append(s.kills, kill{pid: w.pid, at: at})
	s.mu.Unlock()
	_ = s.rdb.HSet(ctx, killsKey, w.pid, at.UnixMilli()).Err() // for a post-mortem (-keep)
	// Not cut short when the chaos ends: the replacement serves the drain.
	if err := s.spawn(context.WithoutCancel(ctx), rng); err != nil {
		s.logf("cannot start a replacement worker: %v", err)
	}
}

// settleQueue waits, until limit, for the queue to hold no task waiting to
// run: late duplicates get their chance to do something wrong before the
// checks.
func (s *soak) settleQueue(ctx context.Context, limit time.Time) {
	insp := asynq.NewInspectorFromRedisClient(s.rdb)
	for time.Now().Before(limit) && ctx.Err() == nil {
		qi, err := insp.GetQueueInfo(queue)
		if err == nil && qi.Pending+qi.Scheduled+qi.Retry == 0 {
			return
		}
		if !sleep(ctx, 200*time.Millisecond) {
			return
		}
	}
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// sleep waits d or until ctx ends, and reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// summary is the last line the soak prints.
func (f *findings) summary(s *soak) string {
	s.mu.Lock()
	kills, restarts := len(s.kills), len(s.outages)
	s.mu.Unlock()
	return fmt.Sprintf("soak: runs=%d completed=%d failed=%d cancelled=%d elements=%d undone=%d undo_twice=%d compensated=%d "+
		"worker_kills=%d redis_restarts=%d sweeper_recovered=%d violations=%d duration=%ds",
		f.runs, f.statuses[reactor.StatusCompleted], f.statuses[reactor.StatusFailed], f.statuses[reactor.StatusCancelled],
		f.elements, f.undone, f.undoTwice, f.compensated, kills, restarts, f.recovered, len(f.violations), int(time.Since(s.start).Seconds()))
}
