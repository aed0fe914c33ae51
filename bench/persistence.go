package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/redisnode"
)

// Redis persistence during a measurement. A background save (RDB) or an
// AOF rewrite forks Redis: while the child writes, the parent's latency
// rises and its memory grows by the pages written to (copy on write), so a
// time or memory figure taken across one is not like the others. The -heap
// run reads INFO persistence before and after each measured run and polls
// it in between, and reports what happened.

// persistInfo is the part of INFO persistence the benchmark reads.
type persistInfo struct {
	rdbChanges          int64  // rdb_changes_since_last_save
	rdbBgsave           bool   // rdb_bgsave_in_progress
	rdbLastSaveTime     int64  // rdb_last_save_time (unix seconds)
	rdbSaves            int64  // rdb_saves (Redis >= 7.0), -1 when absent
	rdbLastBgsaveStatus string // rdb_last_bgsave_status
	aofEnabled          bool   // aof_enabled
	aofRewrite          bool   // aof_rewrite_in_progress
	aofRewrites         int64  // aof_rewrites (Redis >= 7.0), -1 when absent
	aofSize             int64  // aof_current_size (only with AOF on), -1 when absent
	aofLastRewrite      string // aof_last_bgrewrite_status
	aofLastWrite        string // aof_last_write_status
}

// parsePersistence reads the fields above from the text of INFO
// persistence; it fails when a field every Redis reports is missing.
func parsePersistence(info string) (persistInfo, error) {
	kv := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			kv[k] = v
		}
	}
	var p persistInfo
	var errs []string
	num := func(k string, def int64, required bool) int64 {
		v, ok := kv[k]
		if !ok {
			if required {
				errs = append(errs, k+" missing")
			}
			return def
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s=%q", k, v))
		}
		return n
	}
	p.rdbChanges = num("rdb_changes_since_last_save", 0, true)
	p.rdbBgsave = num("rdb_bgsave_in_progress", 0, true) == 1
	p.rdbLastSaveTime = num("rdb_last_save_time", 0, true)
	p.rdbSaves = num("rdb_saves", -1, false)
	p.rdbLastBgsaveStatus = kv["rdb_last_bgsave_status"]
	p.aofEnabled = num("aof_enabled", 0, true) == 1
	p.aofRewrite = num("aof_rewrite_in_progress", 0, true) == 1
	p.aofRewrites = num("aof_rewrites", -1, false)
	p.aofSize = num("aof_current_size", -1, false)
	p.aofLastRewrite = kv["aof_last_bgrewrite_status"]
	p.aofLastWrite = kv["aof_last_write_status"]
	if len(errs) > 0 {
		return p, fmt.Errorf("INFO persistence: %s", strings.Join(errs, ", "))
	}
	return p, nil
}

// readPersistence reads INFO persistence, of every master of a cluster
// taken as one (mergePersistence).
func readPersistence(ctx context.Context, rdb redis.UniversalClient) (persistInfo, error) {
	var (
		mu  sync.Mutex
		all []persistInfo
	)
	err := redisnode.EachMaster(ctx, rdb, func(ctx context.Context, node *redis.Client) error {
		info, err := node.Info(ctx, "persistence").Result()
		if err != nil {
			return err
		}
		p, err := parsePersistence(info)
		if err != nil {
			return fmt.Errorf("%s: %w", node.Options().Addr, err)
		}
		mu.Lock()
		all = append(all, p)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return persistInfo{}, err
	}
	return mergePersistence(all), nil
}

// mergePersistence is the persistence of several nodes as one: counts and
// sizes summed (unknown when a node does not report them), in progress
// when one node is, the latest save, the first status that is not "ok".
func mergePersistence(all []persistInfo) persistInfo {
	sum := func(a, b int64) int64 {
		if a < 0 || b < 0 {
			return -1
		}
		return a + b
	}
	worse := func(a, b string) string {
		if a != "ok" && a != "" {
			return a
		}
		return cmp.Or(b, a)
	}
	m := all[0]
	for _, p := range all[1:] {
		m.rdbChanges += p.rdbChanges
		m.rdbBgsave = m.rdbBgsave || p.rdbBgsave
		m.rdbLastSaveTime = max(m.rdbLastSaveTime, p.rdbLastSaveTime)
		m.rdbSaves = sum(m.rdbSaves, p.rdbSaves)
		m.rdbLastBgsaveStatus = worse(m.rdbLastBgsaveStatus, p.rdbLastBgsaveStatus)
		m.aofEnabled = m.aofEnabled || p.aofEnabled
		m.aofRewrite = m.aofRewrite || p.aofRewrite
		m.aofRewrites = sum(m.aofRewrites, p.aofRewrites)
		m.aofSize = sum(m.aofSize, p.aofSize)
		m.aofLastRewrite = worse(m.aofLastRewrite, p.aofLastRewrite)
		m.aofLastWrite = worse(m.aofLastWrite, p.aofLastWrite)
	}
	return m
}

// persistActivity is what Redis persistence did during one measured run.
type persistActivity struct {
	// RDBChanges is how many writes Redis counted towards its next save
	// (rdb_changes_since_last_save, after minus before): the run's own
	// writes and those of any other client. It is null when a save
	// completed during the run, which resets the counter.
	RDBChanges       *int64 `json:"rdb_changes_delta"`
	RDBChangesBefore int64  `json:"rdb_changes_since_last_save_before"`
	RDBChangesAfter  int64  `json:"rdb_changes_since_last_save_after"`
	// RDBSaves is how many saves completed during the run (the rdb_saves
	// delta; without that field, 1 when rdb_last_save_time moved).
	RDBSaves int64 `json:"rdb_saves"`
	// BgsaveSeen is true when a background save was in progress at any
	// sample (before, every 100 ms during, after).
	BgsaveSeen       bool   `json:"rdb_bgsave_in_progress_seen"`
	LastBgsaveStatus string `json:"rdb_last_bgsave_status"`
	AOFEnabled       bool   `json:"aof_enabled"`
	// The AOF fields are reported only with AOF on.
	AOFRewriteSeen       bool   `json:"aof_rewrite_in_progress_seen,omitempty"`
	AOFRewrites          int64  `json:"aof_rewrites,omitempty"`
	AOFBytes             *int64 `json:"aof_current_size_delta,omitempty"`
	AOFLastRewriteStatus string `json:"aof_last_bgrewrite_status,omitempty"`
	AOFLastWriteStatus   string `json:"aof_last_write_status,omitempty"`
	Samples              int    `json:"samples"`
}

// disturbed says whether a save or a rewrite ran during the run.
func (a *persistActivity) disturbed() bool {
	return a != nil && (a.RDBSaves > 0 || a.BgsaveSeen || a.AOFRewriteSeen || a.AOFRewrites > 0)
}

// activity is what happened between before and after, given whether any
// sample saw a save or rewrite in progress.
func activity(before, after persistInfo, bgsaveSeen, rewriteSeen bool, samples int) *persistActivity {
	a := &persistActivity{RDBChangesBefore: before.rdbChanges, RDBChangesAfter: after.rdbChanges,
		BgsaveSeen: bgsaveSeen || before.rdbBgsave || after.rdbBgsave, LastBgsaveStatus: after.rdbLastBgsaveStatus,
		AOFEnabled: after.aofEnabled, Samples: samples}
	switch {
	case before.rdbSaves >= 0 && after.rdbSaves >= 0:
		a.RDBSaves = after.rdbSaves - before.rdbSaves
	case after.rdbLastSaveTime != before.rdbLastSaveTime:
		a.RDBSaves = 1
	}
	if a.RDBSaves == 0 && after.rdbChanges >= before.rdbChanges {
		d := after.rdbChanges - before.rdbChanges
		a.RDBChanges = &d
	}
	if after.aofEnabled {
		a.AOFRewriteSeen = rewriteSeen || before.aofRewrite || after.aofRewrite
		if before.aofRewrites >= 0 && after.aofRewrites >= 0 {
			a.AOFRewrites = after.aofRewrites - before.aofRewrites
		}
		if before.aofSize >= 0 && after.aofSize >= 0 {
			d := after.aofSize - before.aofSize
			a.AOFBytes = &d
		}
		a.AOFLastRewriteStatus, a.AOFLastWriteStatus = after.aofLastRewrite, after.aofLastWrite
	}
	return a
}

// persistEvery is how often a persistence watch polls.
const persistEvery = 100 * time.Millisecond

// watchPersistence reads INFO persistence now and every persistEvery until
// the returned function is called, which reads it once more and returns
// what happened in between, or nil when this Redis does not report its
// persistence (the embedded miniredis).
func watchPersistence(rdb redis.UniversalClient) (stop func() *persistActivity) {
	read := func() (persistInfo, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return readPersistence(ctx, rdb)
	}
	before, err := read()
	if err != nil {
		return func() *persistActivity { return nil }
	}
	var (
		mu                      sync.Mutex
		bgsaveSeen, rewriteSeen bool
		samples                 = 1
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(persistEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			p, err := read()
			if err != nil {
				continue
			}
			mu.Lock()
			bgsaveSeen, rewriteSeen, samples = bgsaveSeen || p.rdbBgsave, rewriteSeen || p.aofRewrite, samples+1
			mu.Unlock()
		}
	})
	var once sync.Once
	var out *persistActivity
	return func() *persistActivity {
		once.Do(func() {
			close(done)
			wg.Wait()
			after, err := read()
			if err != nil {
				return
			}
			out = activity(before, after, bgsaveSeen, rewriteSeen, samples+1)
		})
		return out
	}
}

// usedMemory is the Redis server's used_memory (INFO memory), summed over
// every master of a cluster, or nil when one does not report it.
func usedMemory(ctx context.Context, rdb redis.UniversalClient) *int64 {
	var total, nodes, reported atomic.Int64
	err := redisnode.EachMaster(ctx, rdb, func(ctx context.Context, node *redis.Client) error {
		nodes.Add(1)
		info, err := node.Info(ctx, "memory").Result()
		if err != nil {
			return err
		}
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					total.Add(n)
					reported.Add(1)
				}
				break
			}
		}
		return nil
	})
	if err != nil || reported.Load() != nodes.Load() {
		return nil
	}
	n := total.Load()
	return &n
}
