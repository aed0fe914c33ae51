package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/store"
	"github.com/goreactor/goreactor/reactor"
)

// Limits: a step's limits (reactor.StepConfig.Limits) live in Redis one key
// per limit and key: a concurrency limit's holders in the sorted set
// P:{lim:<name>:<key>} (member <run id>|<step path>|<random>, score the
// server ms its lease ends), a rate limit's admissions in
// P:{rate:<name>:<key>} (same members, score the server ms of the
// admission). GET /api/limits reads the keys of one limit and key, never a
// scan. Waiters are not in those keys: an attempt that finds a limit full
// waits in-process, then its task is snoozed. A worker that records them
// notes each refused attempt in P:{lim:<name>:<key>}:w (rate:
// P:{rate:<name>:<key>}:w), same slot, member <run id>|<step path>, score
// the server ms of its last refusal; the view reads those keys when they
// exist and says "waiters are not recorded" when they do not.

// Limits of the answer.
const (
	maxLimitKey     = 1024 // bytes of a limit's key in a query
	maxLimitHolders = 200  // holders listed (a concurrency limit of more lists the soonest to end)
	maxLimitRecent  = 20   // latest admissions listed
	maxLimitWaiters = 50   // latest waiters listed
)

// waitersSuffix names the waiters' record of a limit's key (see above).
const waitersSuffix = ":w"

// limitHolderView is one holder of a concurrency limit's slot.
type limitHolderView struct {
	RunID string `json:"run_id"`
	Step  string `json:"step"`
	// Holder is the member as stored (run id, step path, a random tag).
	Holder    string `json:"holder"`
	LeaseEnds string `json:"lease_ends"`
	// LeaseLeftMS is how long until the lease ends (0 once it ended).
	LeaseLeftMS int64 `json:"lease_left_ms"`
	// Expired: the lease ended (the holder died or stopped renewing); the
	// next acquire drops it, so it no longer counts against the limit.
	Expired bool `json:"expired"`
	// Parked: a run's own limit (reactor.RunLimits) held while the run
	// waits with no process (paused, on a fan-out map, at a checkpoint):
	// no lease; released when the run ends. LeaseEnds is "" then.
	Parked bool `json:"parked,omitempty"`
}

// holderView is the view of holder m, whose lease ends at server ms end,
// as of server ms now.
func holderView(m string, end, now int64) limitHolderView {
	run, step, _ := splitHolder(m, true)
	if end >= store.ParkedScore {
		return limitHolderView{RunID: run, Step: step, Holder: m, Parked: true}
	}
	return limitHolderView{RunID: run, Step: step, Holder: m, LeaseEnds: stamp(time.UnixMilli(end)),
		LeaseLeftMS: max(0, end-now), Expired: end <= now}
}

// limitWaiterView is one attempt a worker recorded waiting for the limit.
type limitWaiterView struct {
	RunID string `json:"run_id"`
	Step  string `json:"step"`
	// LastRefused is when it was last refused, AgoMS how long ago.
	LastRefused string `json:"last_refused"`
	AgoMS       int64  `json:"ago_ms"`
	// Holds: the same run and step holds a slot now (it got in since).
	Holds bool `json:"holds"`
	// Key is the key it waits for (a fair-shared limit's waiters only).
	Key string `json:"key,omitempty"`
}

// limitWaiters are the waiters a worker recorded for a limit's key.
type limitWaiters struct {
	// Recorded is false when the key holds no waiters' record: the
	// workers do not record waiters, or none waited lately.
	Recorded bool              `json:"recorded"`
	RedisKey string            `json:"redis_key"`
	Count    int64             `json:"count"`
	Waiters  []limitWaiterView `json:"waiters"`
}

// concurrencyView is what a concurrency limit's key holds.
type concurrencyView struct {
	RedisKey string `json:"redis_key"`
	// Held counts the holders whose lease has not ended; Expired those
	// whose lease ended (dropped by the next acquire).
	Held      int               `json:"held"`
	Expired   int               `json:"expired"`
	Holders   []limitHolderView `json:"holders"`
	Truncated bool              `json:"truncated"`
	Waiters   limitWaiters      `json:"waiters"`
}

// admissionView is one admission of a rate limit.
type admissionView struct {
	RunID string `json:"run_id"`
	Step  string `json:"step"`
	At    string `json:"at"`
}

// rateView is what a rate limit's key holds.
type rateView struct {
	RedisKey string `json:"redis_key"`
	// Last1s, Last10s and Last60s count the admissions in the last 1, 10
	// and 60 seconds (server time). The key keeps the admissions of the
	// limit's longest window only, so a count over a longer span sees no
	// more than that window.
	Last1s  int64 `json:"last_1s"`
	Last10s int64 `json:"last_10s"`
	Last60s int64 `json:"last_60s"`
	// Kept is every admission the key holds; LastAdmitted the latest's
	// time ("" for none), Recent the latest admissions, newest first.
	Kept         int64           `json:"kept"`
	LastAdmitted string          `json:"last_admitted"`
	Recent       []admissionView `json:"recent"`
	Waiters      limitWaiters    `json:"waiters"`
}

// fairTenant is one key of a fair-shared limit.
type fairTenant struct {
	Key string `json:"key"`
	// Holds counts its slots, Waiting its attempts refused lately.
	Holds   int `json:"holds"`
	Waiting int `json:"waiting"`
}

// fairView is what a fair-shared limit (reactor.Limit.Fair) holds: its
// slots are shared by all its keys, in P:{fair:<name>} (holders), :hk
// (holder -> key), :n (key -> slots held), :w (waiters, by last refusal),
// :wk (waiter -> key) and :wn (key -> waiters).
type fairView struct {
	RedisKey string `json:"redis_key"`
	// Held counts the holders whose lease has not ended, of every key.
	Held int `json:"held"`
	// Tenants are the keys holding or waiting, by key.
	Tenants []fairTenant `json:"tenants"`
	// Holders are the slots' holders (at most maxLimitHolders), with the
	// key each holds for.
	Holders []fairHolderView `json:"holders"`
	Waiters limitWaiters     `json:"waiters"`
}

type fairHolderView struct {
	limitHolderView
	Key string `json:"key"`
}

// limitsView is GET /api/limits.
type limitsView struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	// Now is the Redis server's time the leases and windows are read by.
	Now         string          `json:"now"`
	Concurrency concurrencyView `json:"concurrency"`
	Rate        rateView        `json:"rate"`
	// Fair is the limit's fair-shared slots, when it has any (absent
	// otherwise): the key's share among the keys that want it.
	Fair *fairView `json:"fair,omitempty"`
	// Declared lists the limits the steps of Config.Definitions declare
	// (absent without definitions).
	Declared []declaredLimit `json:"declared,omitempty"`
}

// declaredLimit is a limit as the definitions the dashboard was given
// declare it, with the steps that take it.
type declaredLimit struct {
	Name        string   `json:"name"`
	Concurrency int      `json:"concurrency,omitempty"`
	Fair        bool     `json:"fair,omitempty"`
	Ordered     bool     `json:"ordered,omitempty"`
	OnFull      string   `json:"on_full,omitempty"` // cancel-newest, cancel-oldest
	Rates       []string `json:"rates,omitempty"`   // "100 per 1s"
	OncePer     string   `json:"once_per,omitempty"`
	// Keyed: a step computes a key (else the limit has the one key "").
	Keyed bool `json:"keyed"`
	// Steps are "<reactor>/<step path>".
	Steps []string `json:"steps"`
}

// declaredLimits reads Config.Definitions' step limits, by name, in the
// order first declared.
func (h *Handler) declaredLimits() []declaredLimit {
	var out []declaredLimit
	at := map[string]int{}
	for _, d := range h.cfg.Definitions {
		sls := d.StepLimits()
		if rl := d.RunLimits(); len(rl) > 0 {
			sls = append([]reactor.StepLimits{{Step: "(run)", Limits: rl}}, sls...)
		}
		for _, sl := range sls {
			for _, l := range sl.Limits {
				i, ok := at[l.Name]
				if !ok {
					dl := declaredLimit{Name: l.Name, Concurrency: l.Concurrency, Keyed: l.Key != nil, Fair: l.Fair, Ordered: l.Ordered}
					if l.OnFull != 0 {
						dl.OnFull = l.OnFull.String()
					}
					for _, r := range l.Rates {
						dl.Rates = append(dl.Rates, fmt.Sprintf("%d per %s", r.N, r.Per))
					}
					if l.OncePer > 0 {
						dl.OncePer = l.OncePer.String()
					}
					i = len(out)
					at[l.Name] = i
					out = append(out, dl)
				}
				out[i].Steps = append(out[i].Steps, d.Name()+"/"+sl.Step)
			}
		}
	}
	return out
}

// limits serves GET /api/limits?name=&key=: the holders of concurrency
// limit name for key (run, step, lease end, whether it ended) and the
// admissions of rate limit name for key (counts in the last 1, 10 and 60 s,
// the latest), with the waiters the workers recorded, if they do. It reads
// the named keys only (one pipelined round trip), never a scan: a limit
// with no holder and no admission answers zeros, as an unknown one does.
func (h *Handler) limits(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "name" && k != "key" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("parameter %q is not one of name, key", k))
			return
		}
	}
	name, key := q.Get("name"), q.Get("key")
	switch {
	case name == "" && len(h.cfg.Definitions) > 0:
		// What the definitions declare, to choose from.
		writeJSON(w, http.StatusOK, map[string]any{"declared": h.declaredLimits()})
		return
	case name == "":
		writeError(w, http.StatusBadRequest, `name is empty: name the limit (reactor.Limit's Name, "partner-api"), and its key with key= ("" for a limit without a Key)`)
		return
	case keys.ValidateID(name) != nil:
		writeError(w, http.StatusBadRequest, "limit name: "+keys.ValidateID(name).Error())
		return
	case len(key) > maxLimitKey:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("key is longer than %d bytes", maxLimitKey))
		return
	}
	out, err := h.readLimit(r.Context(), name, key)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// readLimit reads limit name's keys for key.
func (h *Handler) readLimit(ctx context.Context, name, key string) (*limitsView, error) {
	slots, rate := h.keys.Slots(name, key), h.keys.Rate(name, key)
	now, err := h.rdb.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("server time: %w", err)
	}
	ms := now.UnixMilli()
	var (
		holders              *redis.ZSliceCmd
		c1, c10, c60, kept   *redis.IntCmd
		recent               *redis.ZSliceCmd
		slotWaiters, rateWts waitersRead
		fair                 fairRead
	)
	// The keys sit in slots of their own (a pipeline of a Redis Cluster
	// client splits by slot); each read is one command.
	_, err = h.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		holders = p.ZRangeWithScores(ctx, slots, 0, maxLimitHolders)
		since := func(d time.Duration) string { return fmt.Sprintf("(%d", ms-d.Milliseconds()) }
		c1 = p.ZCount(ctx, rate, since(time.Second), "+inf")
		c10 = p.ZCount(ctx, rate, since(10*time.Second), "+inf")
		c60 = p.ZCount(ctx, rate, since(time.Minute), "+inf")
		kept = p.ZCard(ctx, rate)
		recent = p.ZRevRangeWithScores(ctx, rate, 0, maxLimitRecent-1)
		slotWaiters = readWaiters(ctx, p, slots+waitersSuffix)
		rateWts = readWaiters(ctx, p, rate+waitersSuffix)
		fair = readFair(ctx, p, h.keys.Fair(name))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read limit %s: %w", name, err)
	}
	out := &limitsView{Name: name, Key: key, Now: stamp(now), Declared: h.declaredLimits()}

	c := &out.Concurrency
	c.RedisKey, c.Holders = slots, []limitHolderView{}
	zs := holders.Val()
	if len(zs) > maxLimitHolders {
		zs, c.Truncated = zs[:maxLimitHolders], true
	}
	holding := map[string]bool{}
	for _, z := range zs {
		m, _ := z.Member.(string)
		v := holderView(m, int64(z.Score), ms)
		if v.Expired {
			c.Expired++
		} else {
			c.Held++
			holding[v.RunID+"|"+v.Step] = true
		}
		c.Holders = append(c.Holders, v)
	}
	if c.Truncated {
		// The rest are counted, not listed (a limit of more than
		// maxLimitHolders): one more read, rare.
		if n, err := h.rdb.ZCount(ctx, slots, fmt.Sprintf("(%d", ms), "+inf").Result(); err == nil {
			c.Held = int(n)
		}
	}
	c.Waiters = slotWaiters.view(slots+waitersSuffix, ms, holding)

	rv := &out.Rate
	rv.RedisKey, rv.Recent = rate, []admissionView{}
	rv.Last1s, rv.Last10s, rv.Last60s, rv.Kept = c1.Val(), c10.Val(), c60.Val(), kept.Val()
	for i, z := range recent.Val() {
		m, _ := z.Member.(string)
		run, step, _ := splitHolder(m, true)
		at := time.UnixMilli(int64(z.Score))
		if i == 0 {
			rv.LastAdmitted = stamp(at)
		}
		rv.Recent = append(rv.Recent, admissionView{RunID: run, Step: step, At: stamp(at)})
	}
	rv.Waiters = rateWts.view(rate+waitersSuffix, ms, nil)
	out.Fair = fair.view(h.keys.Fair(name), ms)
	return out, nil
}

// fairRead is the pipelined read of a fair-shared limit's keys: each
// bounded by its slots (holders, counts) or by the waiters of the last
// few seconds.
type fairRead struct {
	holders           *redis.ZSliceCmd
	holderKeys        *redis.MapStringStringCmd
	counts, waitCount *redis.MapStringStringCmd
	waiters           waitersRead
	waiterKeys        *redis.MapStringStringCmd
}

func readFair(ctx context.Context, p redis.Pipeliner, key string) fairRead {
	return fairRead{holders: p.ZRangeWithScores(ctx, key, 0, maxLimitHolders-1), holderKeys: p.HGetAll(ctx, key+":hk"),
		counts: p.HGetAll(ctx, key+":n"), waitCount: p.HGetAll(ctx, key+":wn"),
		waiters: readWaiters(ctx, p, key+waitersSuffix), waiterKeys: p.HGetAll(ctx, key+":wk")}
}

// view renders the read as of server ms now, or nil when the limit has
// no fair-shared slot held or wanted.
func (fr fairRead) view(key string, now int64) *fairView {
	zs, counts, waiting := fr.holders.Val(), fr.counts.Val(), fr.waitCount.Val()
	if len(zs) == 0 && len(counts) == 0 && len(waiting) == 0 {
		return nil
	}
	out := &fairView{RedisKey: key, Tenants: []fairTenant{}, Holders: []fairHolderView{}}
	tenants := map[string]*fairTenant{}
	tenant := func(k string) *fairTenant {
		if t, ok := tenants[k]; ok {
			return t
		}
		t := &fairTenant{Key: k}
		tenants[k] = t
		return t
	}
	for k, v := range counts {
		tenant(k).Holds, _ = strconv.Atoi(v)
	}
	for k, v := range waiting {
		tenant(k).Waiting, _ = strconv.Atoi(v)
	}
	hk := fr.holderKeys.Val()
	holding := map[string]bool{}
	for _, z := range zs {
		m, _ := z.Member.(string)
		v := fairHolderView{limitHolderView: holderView(m, int64(z.Score), now), Key: hk[m]}
		if !v.Expired {
			out.Held++
			holding[v.RunID+"|"+v.Step] = true
		}
		out.Holders = append(out.Holders, v)
	}
	for _, t := range tenants {
		out.Tenants = append(out.Tenants, *t)
	}
	slices.SortFunc(out.Tenants, func(a, b fairTenant) int { return strings.Compare(a.Key, b.Key) })
	out.Waiters = fr.waiters.view(key+waitersSuffix, now, holding)
	wk := fr.waiterKeys.Val()
	for i := range out.Waiters.Waiters {
		w := &out.Waiters.Waiters[i]
		w.Key = wk[w.RunID+"|"+w.Step]
	}
	return out
}

// waitersRead is the pipelined read of a waiters' record.
type waitersRead struct {
	exists  *redis.IntCmd
	count   *redis.IntCmd
	members *redis.ZSliceCmd
}

func readWaiters(ctx context.Context, p redis.Pipeliner, key string) waitersRead {
	return waitersRead{exists: p.Exists(ctx, key), count: p.ZCard(ctx, key),
		members: p.ZRevRangeWithScores(ctx, key, 0, maxLimitWaiters-1)}
}

// view renders the record as of server ms now; holding names the run|step
// pairs that hold a slot now.
func (wr waitersRead) view(key string, now int64, holding map[string]bool) limitWaiters {
	out := limitWaiters{RedisKey: key, Waiters: []limitWaiterView{}}
	if wr.exists.Val() == 0 {
		return out
	}
	out.Recorded, out.Count = true, wr.count.Val()
	for _, z := range wr.members.Val() {
		m, _ := z.Member.(string)
		run, step, _ := splitHolder(m, false)
		at := int64(z.Score)
		out.Waiters = append(out.Waiters, limitWaiterView{RunID: run, Step: step, LastRefused: stamp(time.UnixMilli(at)),
			AgoMS: max(0, now-at), Holds: holding[run+"|"+step]})
	}
	return out
}

// splitHolder reads a limit's member: "<run id>|<step path>|<random>" (a
// holder, an admission; tagged) or "<run id>|<step path>" (a waiter). Run
// ids and step names may themselves hold '|': the random tag is the last
// part and the run id is read up to the first '|', so a run id with a '|'
// shows split (the member is shown whole as well). ok is false for a
// member of another form: it is then the run id, the step "".
func splitHolder(m string, tagged bool) (run, step string, ok bool) {
	rest := m
	if tagged {
		i := strings.LastIndexByte(rest, '|')
		if i < 0 {
			return m, "", false
		}
		rest = rest[:i]
	}
	run, step, ok = strings.Cut(rest, "|")
	if !ok {
		return m, "", false
	}
	return run, step, true
}
