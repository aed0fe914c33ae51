package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/inspect"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/store"
	"github.com/goreactor/goreactor/reactor"
)

// A stall is a live run (pending, running, paused, rolling back) that made
// no progress for Config.StallAfter: no state write of its own and no
// settle of its fan-out maps (forward or rollback), while no worker holds
// its lock. It is computed from data the engines keep anyway, never by a
// keyspace scan:
//
//   - the active-runs index (idx:active) names the live runs: at most
//     Config.StallScan of its entries are read, oldest first, with the
//     server time of each one's last state write (one pipelined HGET each);
//   - only those older than StallAfter are examined further (at most
//     maxStallDetail): the run, its maps' counters and last settles, its
//     lock, the needs-human index, asynq's server registry (servedQueues)
//     and the queue info of the queues involved (one read per queue);
//   - the result is cached for stallTTL, so the overview's poll, the
//     /metrics scrape and the API share one examination.
//
// Why a run stalled is the first of these that applies (each one found is
// also listed in Details):
//
//	waiting_for_person  an undo conflicted and waits for a person to resolve
//	                    it (not counted as stalled: re-dispatch cannot help)
//	waiting_for_payload paused at an interrupt step that waits for payloads
//	                    (not counted as stalled: continue it, GET /api/paused)
//	no_definition       the workers lack the run's definition (a rolling deploy)
//	no_worker           no worker serves the run's queue, or its maps' task queues
//	tasks_pending       its queue's oldest pending task is older than StallAfter
//	element_lock        an element of one of its maps is held, with no settle
//	lost                none of these: its tasks were lost; re-dispatch
const (
	stallWaiting      = "waiting_for_person"
	stallPayload      = "waiting_for_payload"
	stallNoDefinition = "no_definition"
	stallNoWorker     = "no_worker"
	stallPending      = "tasks_pending"
	stallElementLock  = "element_lock"
	stallLost         = "lost"
)

// stallKinds lists the kinds in order of precedence.
var stallKinds = []string{stallWaiting, stallPayload, stallNoDefinition, stallNoWorker, stallPending, stallElementLock, stallLost}

// stallTTL is how long one examination of the stalls is served.
const stallTTL = 3 * time.Second

// maxStallDetail bounds the runs one examination reads in full: those past
// it are counted (stallsView.Truncated) but not explained.
const maxStallDetail = 100

// elementLockWindow bounds the element locks read per map: the most
// recently claimed positions, where a held lock can be (a map has at most
// a batch and a half claimed and unsettled).
const elementLockWindow = 64

// stallView is one stalled run (Stall in docs/dashboard-api.md).
type stallView struct {
	RunID   string         `json:"run_id"`
	Reactor string         `json:"reactor"`
	Status  reactor.Status `json:"status"`
	// ProgressAt is the last progress: the run's last state write or its
	// maps' last settle, whichever is newer; IdleMS is how long ago.
	ProgressAt string `json:"progress_at"`
	IdleMS     int64  `json:"idle_ms"`
	// Queue is where the run's tasks go: the queue it recorded, else the
	// dashboard's ControlQueue (QueueDefault).
	Queue        string `json:"queue"`
	QueueDefault bool   `json:"queue_default"`
	// Kind is why, one of stallKinds; Why says it in a sentence, Details
	// every cause found.
	Kind    string   `json:"kind"`
	Why     string   `json:"why"`
	Details []string `json:"details"`
	// Stalled is false for a run waiting for a person (Kind
	// waiting_for_person): shown, not counted.
	Stalled bool `json:"stalled"`
}

// stallsView is GET /api/stalls.
type stallsView struct {
	StallAfterMS int64 `json:"stall_after_ms"`
	// Stalled counts the stalled runs found; Waiting the live runs waiting
	// for a person; ByKind both, by kind.
	Stalled int            `json:"stalled"`
	Waiting int            `json:"waiting_for_person"`
	ByKind  map[string]int `json:"by_kind"`
	// Active is the number of live runs (ZCARD idx:active); Examined of
	// them were read. Truncated is set when some live runs were not
	// examined or not explained (Config.StallScan, maxStallDetail).
	Active    int64       `json:"active"`
	Examined  int         `json:"examined"`
	Truncated bool        `json:"truncated"`
	CheckedAt string      `json:"checked_at"`
	Runs      []stallView `json:"runs"`
}

// stallCache holds the last examination.
type stallCache struct {
	ttl    time.Duration // stallTTL
	mu     sync.Mutex
	readAt time.Time
	view   stallsView
}

// stalls serves GET /api/stalls?kind=: the stalled runs with why, and the
// live runs waiting for a person. kind keeps the runs of one kind.
func (h *Handler) stalls(w http.ResponseWriter, r *http.Request) {
	kind := r.URL.Query().Get("kind")
	if kind != "" && !slices.Contains(stallKinds, kind) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("kind %q is not one of %v", kind, stallKinds))
		return
	}
	v, err := h.stallsNow(r.Context())
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	if kind != "" {
		out := []stallView{}
		for _, s := range v.Runs {
			if s.Kind == kind {
				out = append(out, s)
			}
		}
		v.Runs = out
	}
	writeJSON(w, http.StatusOK, v)
}

// stallsNow returns the cached examination, or a fresh one when it is
// older than stallTTL. Concurrent callers share one examination.
func (h *Handler) stallsNow(ctx context.Context) (stallsView, error) {
	c := h.stallCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.readAt.IsZero() && time.Since(c.readAt) < c.ttl {
		return c.view, nil
	}
	v, err := h.examineStalls(ctx)
	if err != nil {
		return stallsView{}, err
	}
	c.view, c.readAt = v, time.Now()
	return v, nil
}

// forgetStalls drops the cached examination (a re-dispatch changed it).
func (h *Handler) forgetStalls() {
	h.stallCache.mu.Lock()
	h.stallCache.readAt = time.Time{}
	h.stallCache.mu.Unlock()
}

// stallProbe is what one examination shares between runs: the server time,
// the served queues, the queue info read so far.
type stallProbe struct {
	now    time.Time
	served map[string]bool
	queues map[string]*asynq.QueueInfo // nil: the queue does not exist yet
}

func (h *Handler) newProbe(ctx context.Context) (*stallProbe, error) {
	now, err := h.rdb.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("read the server time: %w", err)
	}
	served, err := h.served.queues(ctx)
	if err != nil {
		return nil, err
	}
	return &stallProbe{now: now, served: served, queues: map[string]*asynq.QueueInfo{}}, nil
}

func (p *stallProbe) queueInfo(insp *asynq.Inspector, q string) (*asynq.QueueInfo, error) {
	if info, ok := p.queues[q]; ok {
		return info, nil
	}
	info, err := insp.GetQueueInfo(q)
	if errors.Is(err, asynq.ErrQueueNotFound) {
		info, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read asynq queue %s: %w", q, err)
	}
	p.queues[q] = info
	return info, nil
}

// examineStalls reads the active index and explains its stalled runs.
func (h *Handler) examineStalls(ctx context.Context) (stallsView, error) {
	p, err := h.newProbe(ctx)
	if err != nil {
		return stallsView{}, err
	}
	v := stallsView{StallAfterMS: h.cfg.StallAfter.Milliseconds(), ByKind: map[string]int{}, Runs: []stallView{},
		CheckedAt: stamp(p.now)}
	var ids []string
	var total *redis.IntCmd
	var page *redis.StringSliceCmd
	if _, err := h.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		total = pl.ZCard(ctx, h.keys.Active())
		page = pl.ZRange(ctx, h.keys.Active(), 0, int64(h.cfg.StallScan)-1)
		return nil
	}); err != nil {
		return v, fmt.Errorf("read the active index: %w", err)
	}
	v.Active, ids = total.Val(), page.Val()
	v.Examined = len(ids)
	v.Truncated = v.Active > int64(len(ids))
	ats := make([]*redis.StringCmd, len(ids))
	if _, err := h.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, id := range ids {
			ats[i] = pl.HGet(ctx, h.keys.RunState(id), "at")
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return v, fmt.Errorf("read the runs' last writes: %w", err)
	}
	cutoff := p.now.Add(-h.cfg.StallAfter).UnixMilli()
	detailed := 0
	for i, id := range ids {
		if _, _, elem := keys.SplitElementID(id); elem {
			continue
		}
		at, err := strconv.ParseInt(ats[i].Val(), 10, 64)
		if err == nil && at > cutoff {
			continue // written within StallAfter
		}
		if detailed == maxStallDetail {
			v.Truncated = true
			break
		}
		detailed++
		s, err := h.examineRun(ctx, p, id, nil)
		if err != nil {
			return v, err
		}
		if s == nil {
			continue
		}
		v.Runs = append(v.Runs, *s)
		v.ByKind[s.Kind]++
		if s.Stalled {
			v.Stalled++
		} else {
			v.Waiting++
		}
	}
	// Longest idle first.
	slices.SortStableFunc(v.Runs, func(a, b stallView) int { return int(b.IdleMS - a.IdleMS) })
	return v, nil
}

// examineRun explains run id when it made no progress for StallAfter, or
// returns nil (progressing, finished, gone, or executing under its lock).
// maps, when not nil, are the run's maps as the caller read them.
func (h *Handler) examineRun(ctx context.Context, p *stallProbe, id string, maps []inspect.Map) (*stallView, error) {
	run, err := h.engine.Get(ctx, id)
	if errors.Is(err, reactor.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read run %s: %w", id, err)
	}
	if run.Status.Terminal() || run.Element != nil {
		return nil, nil
	}
	if maps == nil {
		if maps, err = h.maps.RunMaps(ctx, id); err != nil {
			return nil, err
		}
	}
	// The last progress: the run's own last write (the server time every
	// state write stamps), or a settle of one of its maps.
	var at *redis.StringCmd
	var lockTTL *redis.DurationCmd
	var human *redis.FloatCmd
	var tasks *redis.MapStringStringCmd
	touched := make([]*redis.StringCmd, len(maps))
	waiting := make([]*redis.StringCmd, len(maps))
	if _, err := h.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		at = pl.HGet(ctx, h.keys.RunState(id), "at")
		lockTTL = pl.PTTL(ctx, h.keys.RunLock(id))
		human = pl.ZScore(ctx, h.keys.NeedsHuman(), id)
		tasks = pl.HGetAll(ctx, h.keys.RunTasks(id))
		for i, m := range maps {
			meta := h.keys.MapMeta(m.ID)
			if m.Rollback != nil {
				meta = h.keys.MapRbMeta(m.ID, m.Rollback.Generation)
			}
			touched[i] = pl.HGet(ctx, meta, "touched")
			waiting[i] = pl.HGet(ctx, h.keys.MapHeld(m.ID), "#w")
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read the progress of run %s: %w", id, err)
	}
	last := run.UpdatedAt.UnixMilli()
	if n, err := strconv.ParseInt(at.Val(), 10, 64); err == nil {
		last = n
	}
	waitsForPerson := human.Err() == nil
	for i := range maps {
		if n, err := strconv.ParseInt(touched[i].Val(), 10, 64); err == nil && n > last {
			last = n
		}
		if n, _ := strconv.Atoi(waiting[i].Val()); n > 0 {
			waitsForPerson = true
		}
	}
	idle := p.now.Sub(time.UnixMilli(last))
	if idle < h.cfg.StallAfter {
		return nil, nil
	}
	if lockTTL.Val() > 0 {
		// A worker holds the run's lock and its heartbeat extends it: the
		// run executes (a long step). The sweeper would not touch it, and
		// neither can a re-dispatch.
		return nil, nil
	}
	if store.StepLeaseEnd(tasks.Val()) > p.now.UnixMilli() {
		// It waits, parked, for a step that runs as its own task, and a
		// worker's attempt holds that step's lease: it executes.
		return nil, nil
	}
	s := &stallView{RunID: id, Reactor: run.Reactor, Status: run.Status, ProgressAt: stamp(time.UnixMilli(last)),
		IdleMS: idle.Milliseconds(), Queue: run.Queue, Details: []string{}, Stalled: true}
	if s.Queue == "" {
		s.Queue, s.QueueDefault = h.cfg.ControlQueue, true
	}
	var kinds []string
	add := func(kind, why string) {
		kinds = append(kinds, kind)
		s.Details = append(s.Details, why)
	}
	if waitsForPerson {
		add(stallWaiting, "waiting for a person: an undo conflicted and nobody resolved it yet (the run page says what to do)")
	}
	if why, err := h.waitsForPayload(ctx, run, p.now); err != nil {
		return nil, err
	} else if why != "" {
		add(stallPayload, why)
	}
	if dw, err := h.engine.DefinitionWait(ctx, id); err != nil {
		return nil, fmt.Errorf("read the definition wait of run %s: %w", id, err)
	} else if dw != nil {
		add(stallNoDefinition, dw.String())
	}
	// The queues the run's work waits on: its own (wake-ups, resumes), and,
	// while a fan-out map has work outstanding, the map task queues (the
	// workers' queue and its shards, where their client puts them).
	queues := []string{s.Queue}
	var open []inspect.Map
	for _, m := range maps {
		if m.FanOut && outstanding(m) {
			open = append(open, m)
		}
	}
	if len(open) > 0 {
		for _, q := range append([]string{h.cfg.ControlQueue}, maptask.ShardQueues(h.cfg.ControlQueue, h.cfg.QueueShards)...) {
			if !slices.Contains(queues, q) {
				queues = append(queues, q)
			}
		}
	}
	for _, q := range queues {
		info, err := p.queueInfo(h.inspector, q)
		if err != nil {
			return nil, err
		}
		pending := ""
		if info != nil && info.Pending > 0 {
			pending = fmt.Sprintf("%s pending on it, the oldest for %s", plural(info.Pending, "task"), roundAge(info.Latency))
		}
		switch {
		case !p.served[q]:
			why := fmt.Sprintf("no worker serves queue %q", q)
			if pending != "" {
				why += " (" + pending + ")"
			}
			add(stallNoWorker, why+": start a worker serving it (worker -queue "+q+")")
		case info != nil && info.Pending > 0 && info.Latency >= h.cfg.StallAfter:
			add(stallPending, fmt.Sprintf("queue %q: %s; its workers are busy or stuck", q, pending))
		}
	}
	for _, m := range open {
		held, err := h.heldElement(ctx, m)
		if err != nil {
			return nil, err
		}
		if held != "" {
			add(stallElementLock, fmt.Sprintf("map %s: the lock of element %s is held, and the map settled nothing for %s", m.Step, held, roundAge(idle)))
		}
	}
	if len(kinds) == 0 {
		add(stallLost, fmt.Sprintf("no progress for %s, no worker holds it and its queue is served: its tasks were lost; re-dispatch asks the sweeper's recovery for it now", roundAge(idle)))
	}
	for _, k := range stallKinds {
		if i := slices.Index(kinds, k); i >= 0 {
			s.Kind, s.Why = k, s.Details[i]
			break
		}
	}
	s.Stalled = s.Kind != stallWaiting && s.Kind != stallPayload
	return s, nil
}

// waitsForPayload says why paused run run is waiting, not stalled: its
// interrupt waits for payloads, and has no deadline or one not passed by
// StallAfter (a timer that long overdue was lost). "" when it is not
// paused, or its interrupt holds every payload it accepts (its wake-up is
// lost: stalled).
func (h *Handler) waitsForPayload(ctx context.Context, run *reactor.Run, now time.Time) (string, error) {
	if run.Status != reactor.StatusPaused {
		return "", nil
	}
	info, err := h.engine.Interrupt(ctx, run.ID)
	if errors.Is(err, reactor.ErrNotPaused) || errors.Is(err, reactor.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the interrupt of run %s: %w", run.ID, err)
	}
	if info.Received >= info.Accepts || (!info.Deadline.IsZero() && now.Sub(info.Deadline) >= h.cfg.StallAfter) {
		return "", nil
	}
	why := fmt.Sprintf("paused at interrupt step %s, waiting for %s (%d of %d received)", info.Step,
		plural(info.Accepts-info.Received, "payload"), info.Received, info.Accepts)
	if info.Correlation != "" {
		why += ", correlation id " + info.Correlation
	}
	return why + ": continue it from its page, or engine.Continue", nil
}

// outstanding reports whether map m has work left: its current rollback,
// or its forward pass, has positions without an outcome.
func outstanding(m inspect.Map) bool {
	if rb := m.Rollback; rb != nil {
		return rb.Settled < rb.Total
	}
	return m.Settled < m.Offset || (m.Offset < m.Total && m.Failed == 0)
}

// heldElement returns the id of an element of map m whose lock is held,
// among the most recently claimed positions (elementLockWindow), or "".
// A rollback's position p undoes element Total-1-p of its first
// generation; a later generation's positions name elements the map's work
// list holds, so only the forward window is read for those.
func (h *Handler) heldElement(ctx context.Context, m inspect.Map) (string, error) {
	var elems []int
	if rb := m.Rollback; rb != nil && rb.Generation == 1 {
		for p := max(0, rb.Offset-elementLockWindow); p < rb.Offset; p++ {
			if e := rb.Total - 1 - p; e >= 0 {
				elems = append(elems, e)
			}
		}
	} else {
		for i := max(0, m.Offset-elementLockWindow); i < m.Offset; i++ {
			elems = append(elems, i)
		}
	}
	if len(elems) == 0 {
		return "", nil
	}
	ttls := make([]*redis.DurationCmd, len(elems))
	if _, err := h.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i, e := range elems {
			ttls[i] = pl.PTTL(ctx, h.keys.ElemLock(m.ID+"."+strconv.Itoa(e)))
		}
		return nil
	}); err != nil {
		return "", fmt.Errorf("read the element locks of map %s: %w", m.ID, err)
	}
	for i, t := range ttls {
		if d := t.Val(); d > 0 || d == -1 {
			return m.ID + "." + strconv.Itoa(elems[i]), nil
		}
	}
	return "", nil
}

// plural is "1 task", "2 tasks".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// roundAge says d to the second, or the minute past ten minutes.
func roundAge(d time.Duration) string {
	if d >= 10*time.Minute {
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Second).String()
}

// stallCollector is the goreactor_dashboard_stalled_runs gauge, from the
// cached examination at each scrape.
type stallCollector struct {
	h    *Handler
	desc *prometheus.Desc
}

func newStallCollector(h *Handler) *stallCollector {
	return &stallCollector{h: h, desc: prometheus.NewDesc("goreactor_dashboard_stalled_runs",
		"Live runs that made no progress for the dashboard's stall-after, by why (kind); waiting_for_person runs are "+
			"listed apart, not stalled. Examined from at most the dashboard's stall-scan live runs.", []string{"kind"}, nil)}
}

func (c *stallCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stallCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := c.h.stallsNow(ctx)
	if err != nil {
		c.h.log.Warn("cannot examine the stalled runs for /metrics", "event", "reactor.dashboard.error", "error", err)
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, k := range stallKinds {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v.ByKind[k]), k)
	}
}
