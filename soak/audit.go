package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/redisnode"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// ---- the claim audit ----
//
// Every process's Redis client carries claimAudit, a go-redis hook that
// reads the replies of the map scripts (start, settle, claim and their
// rollback twins, and the rollback hand-off) and records each batch they
// claimed and each owner signal they took, by map, kind and first position.
// The same first position claimed twice is a double claim, whoever made it
// (a settle, a sweeper, a re-entered owner). A claim whose reply was lost,
// or whose process died before the record, goes unrecorded; that can hide
// a double claim but never invent one.

// claim is one batch claimed (From..To) or one owner signal taken (kind
// "fsig" or "rsig<gen>", From 0).
type claim struct {
	MapID    string
	Kind     string // "fwd", "rb<gen>", "fsig", "rsig<gen>"
	From, To int
}

type claimAudit struct {
	rdb redis.UniversalClient
	rec *recorder
	// delay, when set, bounds a random pause after each claim recorded.
	delay time.Duration
}

func (claimAudit) DialHook(next redis.DialHook) redis.DialHook { return next }

func (claimAudit) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (a claimAudit) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil {
			return err
		}
		claims := parseClaims(cmd)
		for _, c := range claims {
			field := fmt.Sprintf("%s:%d:%s", c.Kind, c.From, token())
			val := strconv.Itoa(c.To) + "/" + a.rec.stamp()
			persistFor(ctx, 2*time.Second, func(ctx context.Context) error {
				return a.rdb.HSet(ctx, claimsKey(c.MapID), field, val).Err()
			})
		}
		if len(claims) > 0 && a.delay > 0 {
			pause(ctx, a.delay)
		}
		return nil
	}
}

// parseClaims returns the claims a successful map script command made.
func parseClaims(cmd redis.Cmder) []claim {
	name := strings.ToLower(cmd.Name())
	if name != "evalsha" && name != "eval" {
		return nil
	}
	args := cmd.Args()
	if len(args) < 4 {
		return nil
	}
	nkeys, ok := toInt(args[2])
	if !ok || nkeys < 1 || len(args) < 3+nkeys {
		return nil
	}
	first, _ := args[3].(string)
	mapID, suffix, ok := splitMapKey(first)
	if !ok {
		return nil
	}
	nargs := len(args) - 3 - nkeys
	c, _ := cmd.(*redis.Cmd)
	if c == nil {
		return nil
	}
	reply := ints(c.Val())
	var out []claim
	batch := func(kind string, from, to int) {
		if from >= 0 && to >= from {
			out = append(out, claim{MapID: mapID, Kind: kind, From: from, To: to})
		}
	}
	// elem_finish.lua names 9 keys and settle.lua 6 since the settles keep
	// the dashboard's element states (KEYS[9], KEYS[6]); 8 and 5 before.
	if strings.HasPrefix(suffix, "el:") && (nkeys == 8 || nkeys == 9) && len(reply) == 7 && reply[0] > 0 {
		// elem_finish.lua, either direction: an element's terminal
		// write with its map's settle; KEYS[4] names the direction.
		third, _ := args[3+3].(string)
		_, metaSuffix, _ := splitMapKey(third)
		kind, sig := "fwd", "fsig"
		if g, rest, ok := strings.Cut(strings.TrimPrefix(metaSuffix, "rb:"), ":"); ok && rest == "meta" && strings.HasPrefix(metaSuffix, "rb:") {
			kind, sig = "rb"+g, "rsig"+g
		}
		batch(kind, reply[4], reply[5])
		if reply[6] == 1 {
			out = append(out, claim{MapID: mapID, Kind: sig})
		}
		return out
	}
	gen, rbSuffix, isRb := strings.Cut(strings.TrimPrefix(suffix, "rb:"), ":")
	isRb = isRb && strings.HasPrefix(suffix, "rb:")
	switch {
	case suffix == "meta" && nkeys == 2 && len(reply) == 2 && nargs > 2: // start.lua
		if reply[0] == 1 {
			batch("fwd", 0, reply[1]-1)
		}
	case suffix == "meta" && nkeys == 3 && len(reply) == 2: // claim.lua
		batch("fwd", reply[0], reply[1])
	case suffix == "meta" && (nkeys == 5 || nkeys == 6) && len(reply) == 4: // settle.lua
		batch("fwd", reply[1], reply[2])
		if reply[3] == 1 {
			out = append(out, claim{MapID: mapID, Kind: "fsig"})
		}
	case isRb && rbSuffix == "meta" && nkeys == 3 && len(reply) == 2 && nargs == 6: // rb_start.lua
		if reply[0] == 1 {
			batch("rb"+gen, 0, reply[1]-1)
		}
	case isRb && rbSuffix == "meta" && nkeys == 2 && len(reply) == 2 && nargs == 1: // claim.lua, a rollback generation's (2 keys)
		batch("rb"+gen, reply[0], reply[1])
	case isRb && rbSuffix == "meta" && (nkeys == 5 || nkeys == 6) && len(reply) == 4: // settle.lua, a rollback generation's
		batch("rb"+gen, reply[1], reply[2])
		if reply[3] == 1 {
			out = append(out, claim{MapID: mapID, Kind: "rsig" + gen})
		}
	case isRb && rbSuffix == "handed_off" && nkeys == 4: // rb_handoff.lua
		if n, ok := toInt(c.Val()); ok && n == 1 {
			out = append(out, claim{MapID: mapID, Kind: "rsig" + gen})
		}
	}
	return out
}

// splitMapKey splits "<prefix>:{map:<id>}:<suffix>".
func splitMapKey(key string) (mapID, suffix string, ok bool) {
	_, rest, ok := strings.Cut(key, ":{map:")
	if !ok {
		return "", "", false
	}
	return strings.Cut(rest, "}:")
}

func toInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case string:
		i, err := strconv.Atoi(n)
		return i, err == nil
	}
	return 0, false
}

// ints converts a script's array reply of integers; anything else is nil.
func ints(v any) []int {
	vals, ok := v.([]any)
	if !ok {
		return nil
	}
	out := make([]int, len(vals))
	for i, x := range vals {
		n, ok := toInt(x)
		if !ok {
			return nil
		}
		out[i] = n
	}
	return out
}

// ---- the sweeper's enqueues ----

// sweepEnqueuer is the Enqueuer of a sweeper replica's engine: everything
// the sweeper dispatches goes through it. It counts the element tasks and
// rollback jobs of each pass by map (more than the map's batch size in one
// pass breaks back pressure), and checks that the sweeper never wakes or
// redelivers work that is alive: the run's or element's lock must be free
// when the sweeper enqueues for it, and a redelivery under a fresh id must
// replace a task that no live worker is running.
type sweepEnqueuer struct {
	*worker.Client
	rdb  redis.UniversalClient
	keys keys.Keys
	insp *asynq.Inspector

	mu     sync.Mutex
	perMap map[string]int
	issues []string
	notes  []string
	// checked counts the checks of the pass, by what they found.
	checked map[string]int64
}

func newSweepEnqueuer(rdb redis.UniversalClient) *sweepEnqueuer {
	return &sweepEnqueuer{Client: worker.NewClient(rdb, queue), rdb: rdb, keys: keys.New(prefix),
		insp: asynq.NewInspectorFromRedisClient(rdb), perMap: map[string]int{}, checked: map[string]int64{}}
}

// Fresh ids: the map sweeper appends ":r<n>" to the id of a task that died
// active (n = 1, 2, ... past the redeliveries that died too), the run
// sweeper appends ":<ms>" to a spent sweep id.
var (
	mapFresh = regexp.MustCompile(`^(.*):(r\d+)$`)
	runFresh = regexp.MustCompile(`^(resume:.*:sweep:\d+):\d+$`)
)

// replaced lists the ids a redelivery under id+":"+suffix replaces: id,
// and the redeliveries before it (":r1" ... up to the one before suffix).
func replaced(id, suffix string) []string {
	out := []string{id}
	n, err := strconv.Atoi(strings.TrimPrefix(suffix, "r"))
	if !strings.HasPrefix(suffix, "r") || err != nil {
		return out
	}
	for k := 1; k < n; k++ {
		out = append(out, id+":r"+strconv.Itoa(k))
	}
	return out
}

func (q *sweepEnqueuer) Enqueue(ctx context.Context, w reactor.Wake) error {
	// A run sweeper wake-up of an owner whose map resume is queued or
	// running is a known redundancy (noted, not a violation); so is the
	// owner's lock, held by that resume, when the check comes a moment
	// after the sweeper's. So is the converse: the map sweeper's resume of
	// an owner the run sweeper has just woken.
	switch {
	case strings.HasPrefix(w.ID, "resume:"+w.RunID+":sweep:") && q.redundantWake(ctx, w):
	case isOwnerResume(w) && q.redundantResume(ctx, w):
	default:
		q.lockFree(ctx, q.keys.RunLock(w.RunID), "run "+w.RunID+" (task "+w.ID+")", "resume:"+w.RunID+":")
	}
	if m := runFresh.FindStringSubmatch(w.ID); m != nil {
		q.spent(ctx, []string{m[1]}, w.ID)
	} else if m := mapFresh.FindStringSubmatch(w.ID); m != nil {
		q.spent(ctx, replaced(m[1], m[2]), w.ID)
	}
	return q.Client.Enqueue(ctx, w)
}

func (q *sweepEnqueuer) EnqueueElement(ctx context.Context, t maptask.ElementTask) error {
	q.count(t.MapID)
	q.lockFree(ctx, q.keys.ElemLock(mapstep.ElementID(t.MapID, t.Index)), "element task "+t.TaskID(),
		maptask.ElementTask{MapID: t.MapID, Index: t.Index}.TaskID())
	if t.Redelivery != "" {
		q.spent(ctx, replaced(maptask.ElementTask{MapID: t.MapID, Index: t.Index}.TaskID(), t.Redelivery), t.TaskID())
	}
	return maptask.MustAdapt(q.Client).EnqueueElement(ctx, t)
}

func (q *sweepEnqueuer) EnqueueRollback(ctx context.Context, t maptask.RollbackTask) error {
	q.count(t.MapID)
	q.lockFree(ctx, q.keys.ElemLock(mapstep.ElementID(t.MapID, t.Index)), "rollback job "+t.TaskID(),
		maptask.RollbackTask{MapID: t.MapID, Gen: t.Gen, Pos: t.Pos}.TaskID())
	if t.Redelivery != "" {
		q.spent(ctx, replaced(maptask.RollbackTask{MapID: t.MapID, Gen: t.Gen, Pos: t.Pos}.TaskID(), t.Redelivery), t.TaskID())
	}
	return maptask.MustAdapt(q.Client).EnqueueRollback(ctx, t)
}

func (q *sweepEnqueuer) count(mapID string) {
	q.mu.Lock()
	q.perMap[mapID]++
	q.mu.Unlock()
}

func (q *sweepEnqueuer) tally(what string) {
	q.mu.Lock()
	q.checked[what]++
	q.mu.Unlock()
}

func (q *sweepEnqueuer) issue(format string, args ...any) {
	q.mu.Lock()
	q.issues = append(q.issues, fmt.Sprintf(format, args...))
	q.mu.Unlock()
}

// redundantWake notes, and reports, a run sweeper wake-up of an owner whose
// map resume (which the run's state does not name) is still queued, or
// running on a live worker: the wake-up then snoozes or finds nothing to
// do, but the run was not lost.
func (q *sweepEnqueuer) redundantWake(ctx context.Context, w reactor.Wake) bool {
	mapID := mapstep.MapID(w.RunID, mapStep)
	var ids []string
	for _, base := range []string{"resume:" + w.RunID + ":fwd:" + mapID, "resume:" + w.RunID + ":rb:" + mapID + ":1"} {
		ids = append(ids, replaced(base, "r4")...) // and its redeliveries
	}
	for _, id := range ids {
		// A task picked up that recently is still the run's only if it
		// holds the run (a worker killed that soon left an expired lock,
		// which is why the sweeper woke the run).
		state, ok := q.stillQueued(ctx, id, func() bool { return q.rdb.Exists(ctx, q.keys.RunLock(w.RunID)).Val() == 1 })
		if !ok {
			continue
		}
		q.tally("wakes_with_queued_resume")
		q.mu.Lock()
		q.notes = append(q.notes, fmt.Sprintf("run sweeper woke %s (%s) while its resume %s was %s", w.RunID, w.ID, id, state))
		q.mu.Unlock()
		return true
	}
	return false
}

// isOwnerResume reports whether w is a map's resume of its owner, forward
// or rolling back, or a redelivery of one.
func isOwnerResume(w reactor.Wake) bool {
	return strings.HasPrefix(w.ID, "resume:"+w.RunID+":fwd:") || strings.HasPrefix(w.ID, "resume:"+w.RunID+":rb:")
}

// redundantResume notes, and reports, the map sweeper's resume of an owner
// (the map settled, its resume lost) that the run sweeper has woken for the
// same loss, in this pass (the run sweeper goes first) or just before: its
// wake-up is still queued, or running on a live worker, where it holds or
// will hold the owner's lock. The map sweeper checks the owner's lock but
// does not look for that wake-up, so the lock can be taken between its
// check and this one; the resume then finds the run locked or moved on.
func (q *sweepEnqueuer) redundantResume(ctx context.Context, w reactor.Wake) bool {
	taskKey := "asynq:{" + queue + "}:t:"
	for _, key := range q.scan(ctx, taskKey+"resume:"+w.RunID+":sweep:*") {
		id := strings.TrimPrefix(key, taskKey)
		state, ok := q.stillQueued(ctx, id, func() bool { return true })
		if !ok {
			continue
		}
		q.tally("resumes_with_queued_wake")
		q.mu.Lock()
		q.notes = append(q.notes, fmt.Sprintf("map sweeper resumed %s (%s) while the run sweeper's wake-up %s was %s", w.RunID, w.ID, id, state))
		q.mu.Unlock()
		return true
	}
	return false
}

// stillQueued reports whether task id is still queued, or running on a
// live worker, and says how. An active task on no listed worker counts only
// if it was picked up within the last heartbeat (5 s: its worker is not
// listed yet) and picked() confirms it; any other active task was orphaned
// by a kill.
func (q *sweepEnqueuer) stillQueued(ctx context.Context, id string, picked func() bool) (string, bool) {
	info, err := q.insp.GetTaskInfo(queue, id)
	if err != nil {
		return "", false
	}
	switch info.State {
	case asynq.TaskStatePending, asynq.TaskStateRetry, asynq.TaskStateScheduled:
		return info.State.String(), true
	case asynq.TaskStateActive:
		pid, holder := q.holder(ctx, id)
		switch {
		case holder == holderLive:
			return fmt.Sprintf("active on live worker pid %d", pid), true
		case holder == holderUnlisted && q.leaseAhead(ctx, id) > 25*time.Second && picked():
			return "active, just picked up", true
		}
	}
	return "", false
}

// lockFree flags an enqueue for a run or element whose lock is held. The
// issue carries the lock's remaining time and the states of the tasks that
// may hold it (taskPrefix: the ids of the run's or element's tasks).
func (q *sweepEnqueuer) lockFree(ctx context.Context, lockKey, what, taskPrefix string) {
	ttl, err := q.rdb.PTTL(ctx, lockKey).Result()
	if err != nil {
		return
	}
	q.tally("checked_locks")
	if ttl == -2*time.Nanosecond { // no such key (go-redis keeps PTTL's -2 as a Duration)
		return
	}
	q.issue("sweeper enqueued %s while its lock was held (a live run; lock expires in %s; tasks: %s)",
		what, ttl, q.taskStates(ctx, taskPrefix))
}

// taskStates lists the queue's tasks whose ids start with prefix, with
// their states.
func (q *sweepEnqueuer) taskStates(ctx context.Context, prefix string) string {
	taskKey := "asynq:{" + queue + "}:t:"
	var out []string
	for _, key := range q.scan(ctx, taskKey+prefix+"*") {
		st, _ := q.rdb.HGet(ctx, key, "state").Result()
		out = append(out, strings.TrimPrefix(key, taskKey)+"="+st)
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// scan returns the keys matching pattern, on every master of a cluster; a
// scan that fails is noted and returns what it found.
func (q *sweepEnqueuer) scan(ctx context.Context, pattern string) []string {
	var keys []string
	err := redisnode.Scan(ctx, q.rdb, pattern, func(batch []string) error {
		keys = append(keys, batch...)
		return nil
	})
	if err != nil {
		q.mu.Lock()
		q.notes = append(q.notes, fmt.Sprintf("scan %s: %v", pattern, err))
		q.mu.Unlock()
	}
	return keys
}

// spent flags a redelivery under a fresh id of a task (or of an earlier
// redelivery of it) still active on a worker process the soak did not kill.
func (q *sweepEnqueuer) spent(ctx context.Context, ids []string, fresh string) {
	found := "spent_inactive" // gone, archived or completed since
	for _, id := range ids {
		info, err := q.insp.GetTaskInfo(queue, id)
		if err != nil || info.State != asynq.TaskStateActive {
			continue
		}
		if pid, holder := q.holder(ctx, id); holder == holderLive {
			q.tally("spent_live")
			q.issue("sweeper redelivered %s as %s while it was active on live worker pid %d", id, fresh, pid)
			return
		}
		found = "spent_dead"
	}
	q.tally(found)
}

// leaseAhead is how far ahead the lease of active task id runs: asynq
// keeps leases in asynq:{<queue>}:lease, scored by their expiry, 30 s after
// the pickup or the last extension (every 5 s while the worker lives).
func (q *sweepEnqueuer) leaseAhead(ctx context.Context, id string) time.Duration {
	exp, err := q.rdb.ZScore(ctx, "asynq:{"+queue+"}:lease", id).Result()
	if err != nil {
		return 0
	}
	return time.Until(time.Unix(int64(exp), 0))
}

// Who runs an active task, as far as asynq's server records tell: a live
// server refreshes its list of active tasks every 5 s, and a dead one's
// record expires 10 s after its last refresh.
const (
	holderUnlisted = iota // no record lists it
	holderLive            // a worker the soak did not kill
	holderKilled          // a worker the soak killed
)

// holder finds the worker process running task id.
func (q *sweepEnqueuer) holder(ctx context.Context, id string) (pid, holder int) {
	servers, err := q.insp.Servers()
	if err != nil {
		return 0, holderUnlisted
	}
	for _, s := range servers {
		for _, w := range s.ActiveWorkers {
			if w.TaskID != id {
				continue
			}
			killed, err := q.rdb.SIsMember(ctx, killedKey, strconv.Itoa(s.PID)).Result()
			switch {
			case err != nil:
			case killed:
				return s.PID, holderKilled
			default:
				return s.PID, holderLive
			}
		}
	}
	return 0, holderUnlisted
}

// pass runs one sweeper pass and checks what it enqueued.
func (q *sweepEnqueuer) pass(ctx context.Context, sw *sweeper.Sweeper) {
	q.begin()
	rep, err := sw.Once(ctx)
	if rep.Leader {
		q.end(ctx, rep, err)
	}
}

// begin starts counting a pass's enqueues.
func (q *sweepEnqueuer) begin() {
	q.mu.Lock()
	clear(q.perMap)
	q.mu.Unlock()
}

// end checks the pass's enqueues against each map's batch size, and
// records the pass's counters and any issue in Redis.
func (q *sweepEnqueuer) end(ctx context.Context, rep sweeper.Report, err error) {
	q.mu.Lock()
	per := maps.Clone(q.perMap)
	q.mu.Unlock()
	for id, n := range per {
		b, berr := q.rdb.HGet(ctx, q.keys.MapMeta(id), "batch_size").Int()
		if berr == nil && n > b {
			q.issue("sweeper enqueued %d tasks for map %s in one pass (batch size %d)", n, id, b)
		}
	}
	q.mu.Lock()
	issues, notes, checked := q.issues, q.notes, q.checked
	q.issues, q.notes, q.checked = nil, nil, map[string]int64{}
	q.mu.Unlock()
	errs := int64(0)
	if err != nil && !errors.Is(err, context.Canceled) {
		errs = 1
	}
	persistFor(ctx, 2*time.Second, func(ctx context.Context) error {
		_, err := q.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HIncrBy(ctx, statsKey, "passes", 1)
			p.HIncrBy(ctx, statsKey, "pass_errors", errs)
			p.HIncrBy(ctx, statsKey, "recovered", int64(rep.Recovered()))
			p.HIncrBy(ctx, statsKey, "runs_woken", int64(rep.Runs.Woken))
			p.HIncrBy(ctx, statsKey, "elements", int64(rep.Maps.Elements))
			p.HIncrBy(ctx, statsKey, "rollbacks", int64(rep.Maps.Rollbacks))
			p.HIncrBy(ctx, statsKey, "resumes", int64(rep.Maps.Resumes))
			p.HIncrBy(ctx, statsKey, "claims", int64(rep.Maps.Claims))
			p.HIncrBy(ctx, statsKey, "fresh_ids", int64(rep.Maps.Fresh))
			for what, n := range checked {
				p.HIncrBy(ctx, statsKey, what, n)
			}
			for _, s := range issues {
				p.RPush(ctx, violationsKey, s)
			}
			for _, s := range notes {
				p.RPush(ctx, notesKey, s)
			}
			return nil
		})
		return err
	})
}
