package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/store"
	"github.com/goreactor/goreactor/reactor"
)

// trimClockMargin is the default TrimConfig.ClockMargin. It is added to every age the trim compares: the listing
// indexes are scored with the writing engines' clocks (ms), and the pass
// compares them with the Redis server's. The age only bounds the page; what
// decides is that the run's state no longer exists.
const trimClockMargin = time.Minute

// TrimConfig configures the trim of the listing indexes.
type TrimConfig struct {
	// Engine names the keys. Required.
	Engine *reactor.Engine
	// Retention is how long a finished run's state lives (the engines'
	// Config.Retention): entries of idx:runs and of the terminal status
	// indexes older than this (by their score) are examined. Default: the
	// Engine's Retention.
	Retention time.Duration
	// StaleAfter bounds the page of the non-terminal status indexes and of
	// idx:needs_human: their entries younger than this are not examined.
	// Default 10 s.
	StaleAfter time.Duration
	// Page bounds the entries examined per index per pass. Default 100.
	Page int
	// ClockMargin is added to every age the trim compares, for the skew
	// between the engines' clocks (which score these indexes) and the Redis
	// server's. Default 1 minute.
	ClockMargin time.Duration
	// Logger receives a line per pass that trimmed. Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with every unset field at its default.
func (c TrimConfig) WithDefaults() TrimConfig {
	if c.Retention <= 0 && c.Engine != nil {
		c.Retention = engine.Retention(c.Engine)
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = 10 * time.Second
	}
	if c.Page <= 0 {
		c.Page = 100
	}
	if c.ClockMargin <= 0 {
		c.ClockMargin = trimClockMargin
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// TrimReport counts what one trim pass did.
type TrimReport struct {
	// Examined is the number of index entries looked at, over every index.
	Examined int
	// Trimmed is the number of entries removed: their run's state is gone
	// (or, in idx:needs_human, the run no longer waits for a person).
	Trimmed int
}

// IndexTrimmer removes the listing-index entries of runs that no longer
// exist (DESIGN 3: "the listing indexes are trimmed by age in bounded
// passes"). A finished run's state expires after the retention, but its
// entries in idx:runs and idx:status:<s> have no expiry (a sorted set's
// members cannot expire), so without the trim they would grow for ever.
//
// An entry is removed only when its run's state does not exist and its lock
// is free (a run being created, or created again after its retention, holds
// its lock before its entries and its state exist), and only if its score is
// still the one the pass read (store.RemoveIfScore), so a run indexed again
// meanwhile keeps it.
//
// The dashboard's indexes are trimmed the same way: idx:reactor:<name> like
// idx:runs (an entry whose run is another reactor's goes too), and
// idx:rs:<name>:<s> like the status indexes, for every name in
// idx:reactors; an idx:ids entry goes with its run's idx:runs entry, and a
// name leaves idx:reactors once its indexes are empty.
//
// Each pass reads at most Page entries of each index, old enough to matter:
// idx:runs, the reactor indexes and the terminal status indexes older than
// Retention, the non-terminal ones older than StaleAfter. The score of these indexes is the
// listing order, so the trim never touches it; it pages with a cursor per
// index instead, held in memory (a restarted sweeper starts from the oldest
// again, which costs reads, never correctness), and starts over from the
// oldest once it reaches the end of the old entries.
//
// The index of runs waiting for a person, idx:needs_human, is trimmed in the
// same pass with the same paging (its entries older than StaleAfter): an
// entry goes when its run (a root run, or a map element run) no longer
// waits for a person, because its state expired or because the run was
// settled or finished otherwise after the entry was added, and its lock is
// free; see trimNeedsHuman.
type IndexTrimmer struct {
	cfg  TrimConfig
	keys keys.Keys
	rdb  redis.UniversalClient

	mu      sync.Mutex
	cursors map[string]trimCursor

	// beforeRemove, if set (tests only), runs between a page's check of
	// an entry's run and the entry's removal.
	beforeRemove func(key, id string)
}

// trimCursor is the last entry a pass examined in one index.
type trimCursor struct {
	score  float64
	member string
}

// NewIndexTrimmer returns an index trimmer.
func NewIndexTrimmer(cfg TrimConfig) (*IndexTrimmer, error) {
	if cfg.Engine == nil {
		return nil, errors.New("sweeper: TrimConfig needs an Engine")
	}
	cfg = cfg.WithDefaults()
	return &IndexTrimmer{cfg: cfg, keys: keys.New(engine.Prefix(cfg.Engine)), rdb: engine.Client(cfg.Engine),
		cursors: map[string]trimCursor{}}, nil
}

// Trim runs one pass: a page of each listing index, then a page of
// idx:needs_human. An error on one index
// is logged and the pass goes on with the next; the errors are returned
// joined with the report.
func (t *IndexTrimmer) Trim(ctx context.Context) (TrimReport, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var rep TrimReport
	now, err := t.rdb.Time(ctx).Result()
	if err != nil {
		return rep, fmt.Errorf("sweeper: read the server time: %w", err)
	}
	retained := now.Add(-t.cfg.Retention - t.cfg.ClockMargin).UnixMilli()
	recent := now.Add(-t.cfg.StaleAfter - t.cfg.ClockMargin).UnixMilli()
	indexes := []trimIndex{{key: t.keys.Runs(), before: retained, created: true}}
	for _, s := range reactor.Statuses() {
		before := recent
		if s.Terminal() {
			before = retained
		}
		indexes = append(indexes, trimIndex{key: t.keys.Status(string(s)), before: before, status: s})
	}
	names, err := t.rdb.SMembers(ctx, t.keys.Reactors()).Result()
	if err != nil {
		return rep, fmt.Errorf("sweeper: read the reactor names: %w", err)
	}
	sort.Strings(names)
	for _, name := range names {
		indexes = append(indexes, trimIndex{key: t.keys.Reactor(name), before: retained, created: true, reactor: name})
		for _, s := range reactor.Statuses() {
			before := recent
			if s.Terminal() {
				before = retained
			}
			indexes = append(indexes, trimIndex{key: t.keys.ReactorStatus(name, string(s)), before: before, status: s, reactor: name})
		}
	}
	var errs []error
	for _, ix := range indexes {
		if err := ctx.Err(); err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		if err := t.trimIndex(ctx, ix, &rep); err != nil {
			t.cfg.Logger.Error("cannot trim index", "event", "reactor.sweep.error", "index", ix.key, "error", err)
			errs = append(errs, fmt.Errorf("sweeper: trim %s: %w", ix.key, err))
		}
	}
	if err := ctx.Err(); err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	if err := t.trimNeedsHuman(ctx, recent, &rep); err != nil {
		key := t.keys.NeedsHuman()
		t.cfg.Logger.Error("cannot trim index", "event", "reactor.sweep.error", "index", key, "error", err)
		errs = append(errs, fmt.Errorf("sweeper: trim %s: %w", key, err))
	}
	for _, name := range names {
		if err := t.dropName(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("sweeper: trim reactor name %q: %w", name, err))
		}
	}
	return rep, errors.Join(errs...)
}

// trimIndex is one listing index a pass trims.
type trimIndex struct {
	key string
	// before: only entries scored before it (ms) are examined.
	before int64
	// created marks an index scored by creation time and written NX
	// (idx:runs, idx:reactor:<name>): an entry whose run exists stays
	// (unless it belongs to another reactor), and an entry removed while
	// its id was started again goes back.
	created bool
	// status is the status of a status index (idx:status:<s>,
	// idx:rs:<name>:<s>): an entry whose run is no longer in it goes.
	status reactor.Status
	// reactor is the reactor of a reactor index: an entry whose run is
	// another reactor's (an id taken by another reactor) goes.
	reactor string
}

// dropName removes reactor name from idx:reactors once every index of it is
// empty. A start writes the reactor's entries before the name (at the end
// of one pipeline on one Redis; on a cluster, whose pipelines are not
// ordered across nodes, once the entries' reply is in: store.QueueIndexStart),
// so the re-read after the removal sees an entry written before the
// removal, and a name written after it is there anyway: the name goes back
// when the re-read finds an entry.
func (t *IndexTrimmer) dropName(ctx context.Context, name string) error {
	empty := func() (bool, error) {
		keys := []string{t.keys.Reactor(name)}
		for _, s := range reactor.Statuses() {
			keys = append(keys, t.keys.ReactorStatus(name, string(s)))
		}
		cards := make([]*redis.IntCmd, len(keys))
		if _, err := t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				cards[i] = p.ZCard(ctx, k)
			}
			return nil
		}); err != nil {
			return false, err
		}
		for _, c := range cards {
			if c.Val() > 0 {
				return false, nil
			}
		}
		return true, nil
	}
	ok, err := empty()
	if err != nil || !ok {
		return err
	}
	if err := t.rdb.SRem(ctx, t.keys.Reactors(), name).Err(); err != nil {
		return err
	}
	ok, err = empty()
	if err == nil && ok {
		return nil
	}
	// An entry came (or the re-read failed): the name goes back rather
	// than leave an index the trimmer cannot find.
	if aerr := t.rdb.SAdd(ctx, t.keys.Reactors(), name).Err(); aerr != nil {
		return errors.Join(err, aerr)
	}
	return err
}

// trimIndex examines the next page of index ix among the entries scored
// before ix.before (ms).
func (t *IndexTrimmer) trimIndex(ctx context.Context, ix trimIndex, rep *TrimReport) error {
	key := ix.key
	page, err := t.page(ctx, key, ix.before)
	if err != nil || len(page) == 0 {
		return err
	}
	states := make([]*redis.IntCmd, len(page))
	locks := make([]*redis.IntCmd, len(page))
	if _, err := t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, z := range page {
			id, _ := z.Member.(string)
			states[i] = p.Exists(ctx, t.keys.RunState(id))
			locks[i] = p.Exists(ctx, t.keys.RunLock(id))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("read the runs of a page: %w", err)
	}
	for i, z := range page {
		rep.Examined++
		id, _ := z.Member.(string)
		if locks[i].Val() == 1 {
			continue // live, or being created
		}
		if states[i].Val() == 1 {
			// Retained or live: its entry stays, unless this is a status
			// index the run is no longer in (an id reused after its
			// retention leaves the old run's status entry; a crash between
			// a terminal write and its index update leaves the old one), or
			// a reactor index of another reactor's run (an id another
			// reactor's run holds).
			if ix.status == "" && ix.reactor == "" {
				continue
			}
			run, err := t.cfg.Engine.Get(ctx, id)
			if err != nil {
				continue
			}
			if (ix.status == "" || run.Status == ix.status) && (ix.reactor == "" || run.Reactor == ix.reactor) {
				continue
			}
		}
		if t.beforeRemove != nil {
			t.beforeRemove(key, id)
		}
		removed, err := store.RemoveIfScore(ctx, t.rdb, key, id, z.Score)
		if err != nil {
			return err
		}
		if !removed {
			continue
		}
		if !ix.created || states[i].Val() == 1 {
			rep.Trimmed++
			continue
		}
		runs := key == t.keys.Runs()
		if runs {
			// The id index has no score to page by: its entry goes with
			// idx:runs' entry, and comes back with it below.
			if err := t.rdb.ZRem(ctx, t.keys.IDs(), id).Err(); err != nil {
				return fmt.Errorf("remove run %s from the id index: %w", id, err)
			}
		}
		// A run started under the id between the check and the removal
		// (an id reused after its retention) holds its lock from before its
		// index write, and idx:runs' write keeps an existing entry (NX), so
		// the score check cannot see it: if the run is there now, its entry
		// goes back. (The status indexes are written without NX: a new
		// entry has a new score, and the removal above refused it.)
		back, err := t.rdb.Exists(ctx, t.keys.RunState(id), t.keys.RunLock(id)).Result()
		if err != nil {
			return fmt.Errorf("re-check run %s: %w", id, err)
		}
		if back > 0 {
			if err := t.rdb.ZAddNX(ctx, key, redis.Z{Score: z.Score, Member: id}).Err(); err != nil {
				return fmt.Errorf("restore the entry of run %s: %w", id, err)
			}
			if runs {
				if err := t.rdb.ZAddNX(ctx, t.keys.IDs(), redis.Z{Member: id}).Err(); err != nil {
					return fmt.Errorf("restore the id entry of run %s: %w", id, err)
				}
			}
			continue
		}
		rep.Trimmed++
	}
	return nil
}

// trimNeedsHuman examines the next page of idx:needs_human among the
// entries scored before before (ms), and removes those whose run no longer
// waits for a person: its state is gone (a root run, or a map element run
// "<mapID>.<i>", expired), or it exists but waits no more (the terminal
// write that followed the entry's add failed and the run was settled
// later, or the run was made live again and finished otherwise). The
// engine decides (engine.WaitsForPerson, the same test its terminal
// write uses).
//
// An entry whose run's lock is held (root or element) stays: the run is
// live, or between the entry's add and its terminal write. The locks are
// read before the states. A run comes to wait only through a terminal
// write made under its lock and preceded by a fresh add; so if the pass
// saw the lock free and then read a state that does not wait, either that
// write's add came after the page was read, with a new score that the
// removal (store.RemoveIfScore with the score the page read) refuses, or
// that lists the run again after the removal, or the write failed. Only entries older than StaleAfter (plus
// ClockMargin) are examined, so a re-add never has the score of the entry
// it replaces.
func (t *IndexTrimmer) trimNeedsHuman(ctx context.Context, before int64, rep *TrimReport) error {
	key := t.keys.NeedsHuman()
	page, err := t.page(ctx, key, before)
	if err != nil || len(page) == 0 {
		return err
	}
	ids := make([]string, len(page))
	roots := make([]*redis.IntCmd, len(page))
	elems := make([]*redis.IntCmd, len(page))
	if _, err := t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, z := range page {
			ids[i], _ = z.Member.(string)
			// Two commands: the two locks are in different slots.
			roots[i] = p.Exists(ctx, t.keys.RunLock(ids[i]))
			elems[i] = p.Exists(ctx, t.keys.ElemLock(ids[i]))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("read the locks of a page: %w", err)
	}
	waiting, err := engine.WaitsForPerson(t.cfg.Engine, ctx, ids)
	if err != nil {
		return fmt.Errorf("read the runs of a page: %w", err)
	}
	for i, z := range page {
		rep.Examined++
		if roots[i].Val() == 1 || elems[i].Val() == 1 || waiting[i] {
			continue
		}
		if t.beforeRemove != nil {
			t.beforeRemove(key, ids[i])
		}
		removed, err := store.RemoveIfScore(ctx, t.rdb, key, ids[i], z.Score)
		if err != nil {
			return err
		}
		if removed {
			rep.Trimmed++
		}
	}
	return nil
}

// page returns the next at most Page entries of index key scored before
// before, after the index's cursor, and moves the cursor past them (back to
// the start once the page reaches the end).
func (t *IndexTrimmer) page(ctx context.Context, key string, before int64) ([]redis.Z, error) {
	hi := strconv.FormatInt(before, 10)
	read := func(lo string) ([]redis.Z, error) {
		zs, err := t.rdb.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: lo, Max: hi, Count: int64(t.cfg.Page)}).Result()
		if err != nil {
			return nil, fmt.Errorf("read a page: %w", err)
		}
		return zs, nil
	}
	c, ok := t.cursors[key]
	if !ok {
		zs, err := read("-inf")
		if err != nil {
			return nil, err
		}
		t.advance(key, zs)
		return zs, nil
	}
	// From the cursor's score, inclusive, past the entries of that score up
	// to the cursor's member (equal scores are ordered by member).
	cur := strconv.FormatFloat(c.score, 'f', -1, 64)
	zs, err := read(cur)
	if err != nil {
		return nil, err
	}
	full := len(zs) == t.cfg.Page
	j := 0
	for j < len(zs) && zs[j].Score == c.score && zs[j].Member.(string) <= c.member {
		j++
	}
	zs = zs[j:]
	if len(zs) == 0 && full {
		// A page of one score, all behind the cursor: go past the score
		// (its entries after this page wait for the next round).
		if zs, err = read("(" + cur); err != nil {
			return nil, err
		}
		full = len(zs) == t.cfg.Page
	}
	if !full || len(zs) == 0 {
		delete(t.cursors, key) // the end: the next pass starts over
		return zs, nil
	}
	last := zs[len(zs)-1]
	t.cursors[key] = trimCursor{score: last.Score, member: last.Member.(string)}
	return zs, nil
}

// advance moves key's cursor to the last entry of a page read from the
// start; a page shorter than Page reached the end.
func (t *IndexTrimmer) advance(key string, zs []redis.Z) {
	if len(zs) < t.cfg.Page {
		delete(t.cursors, key)
		return
	}
	last := zs[len(zs)-1]
	t.cursors[key] = trimCursor{score: last.Score, member: last.Member.(string)}
}
