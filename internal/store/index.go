package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Index entries are written with single-key commands, outside the per-run
// scripts, because the index keys live in other cluster slots. The order of
// the calls is what keeps a live run visible to the sweeper: MarkStarted runs
// before the run's first state write and MarkFinished only after its terminal
// write. A crash between the two leaves a finished run in the active index,
// which the sweeper tolerates; the reverse could hide a live run.

// MarkStarted adds run id of reactor reactorName to the active index and the
// listing indexes.
func (s *Store) MarkStarted(ctx context.Context, id, reactorName, status string, now time.Time) error {
	_, err := s.IndexStart(ctx, id, reactorName, status, now)
	return err
}

// IndexStart is MarkStarted that also reports whether the active entry is
// new: a start that then finds a finished run takes back only an entry it
// added (RemoveIfScore with now), and leaves one that was there before (a
// finished run whose process died before its tree's retention was set, for
// the sweeper to complete).
//
// Besides idx:active, idx:runs and idx:status:<s> it writes the dashboard's
// indexes: idx:ids (lexicographic, for id search), idx:reactor:<name> and
// idx:rs:<name>:<s> (the reactor filters), and the reactor's name in
// idx:reactors so that the index trimmer finds them. They ride in the same
// pipeline: a start costs no extra round trip. An empty reactorName writes
// none of the reactor indexes.
func (s *Store) IndexStart(ctx context.Context, id, reactorName, status string, now time.Time) (added bool, err error) {
	var active *redis.IntCmd
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		active = s.QueueIndexStart(ctx, p, id, reactorName, status, now)
		return nil
	})
	if err == nil && !s.ordered && reactorName != "" {
		// After the entries' reply (QueueIndexStart): one more round trip,
		// on a cluster only.
		err = s.rdb.SAdd(ctx, s.keys.Reactors(), reactorName).Err()
	}
	if err != nil {
		return false, fmt.Errorf("store: index run: %w", err)
	}
	return active.Val() == 1, nil
}

// QueueIndexStart queues IndexStart's commands on pipeline p, for a caller
// that indexes many runs in one round trip (a seeding tool, a benchmark). It
// returns the active index's ZADD, whose value is 1 when the entry is new.
//
// The reactor's name goes in idx:reactors after its entries, and the index
// trimmer relies on that order (sweeper/trim.go). A pipeline runs in order
// on one Redis only (Ordered): on a cluster its commands to different nodes
// race, so QueueIndexStart leaves the name out there, and the caller adds it
// (QueueReactorName) on a pipeline sent once p's reply is in.
func (s *Store) QueueIndexStart(ctx context.Context, p redis.Pipeliner, id, reactorName, status string, now time.Time) *redis.IntCmd {
	ms := float64(now.UnixMilli())
	active := p.ZAdd(ctx, s.keys.Active(), redis.Z{Score: ms, Member: id})
	p.ZAddNX(ctx, s.keys.Runs(), redis.Z{Score: ms, Member: id})
	p.ZAdd(ctx, s.keys.Status(status), redis.Z{Score: ms, Member: id})
	p.ZAddNX(ctx, s.keys.IDs(), redis.Z{Score: 0, Member: id})
	if reactorName != "" {
		p.ZAddNX(ctx, s.keys.Reactor(reactorName), redis.Z{Score: ms, Member: id})
		p.ZAdd(ctx, s.keys.ReactorStatus(reactorName, status), redis.Z{Score: ms, Member: id})
		// After the reactor's entries: the trimmer drops a name only when
		// its indexes are empty, and re-reads them after the removal
		// (sweeper/trim.go).
		if s.ordered {
			p.SAdd(ctx, s.keys.Reactors(), reactorName)
		}
	}
	return active
}

// QueueReactorName queues the addition of reactorName to idx:reactors, for
// a caller of QueueIndexStart on a client that is not Ordered, once that
// pipeline's reply is in. An empty name queues nothing.
func (s *Store) QueueReactorName(ctx context.Context, p redis.Pipeliner, reactorName string) {
	if reactorName != "" {
		p.SAdd(ctx, s.keys.Reactors(), reactorName)
	}
}

// TakeBackStart undoes IndexStart's speculative entries for a start that
// found a finished run: its status entry, and its active entry if it added
// it and nobody re-indexed it since.
func (s *Store) TakeBackStart(ctx context.Context, id, reactorName, status string, added bool, now time.Time) error {
	if err := s.Unindex(ctx, id, reactorName, status); err != nil {
		return err
	}
	if !added {
		return nil
	}
	_, err := s.RemoveIfScore(ctx, s.keys.Active(), id, float64(now.UnixMilli()))
	return err
}

// MarkStatus moves run id of reactor reactorName from status from to status
// to in the listing indexes (the reactor x status ones too, unless
// reactorName is empty). A terminal status also removes it from the active
// index and gives the index entries nothing to expire: they are trimmed by
// score.
func (s *Store) MarkStatus(ctx context.Context, id, reactorName, from, to string, terminal bool, now time.Time) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		s.QueueMarkStatus(ctx, p, id, reactorName, from, to, terminal, now)
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: index status: %w", err)
	}
	return nil
}

// QueueMarkStatus queues MarkStatus's commands on pipeline p.
func (s *Store) QueueMarkStatus(ctx context.Context, p redis.Pipeliner, id, reactorName, from, to string, terminal bool, now time.Time) {
	ms := float64(now.UnixMilli())
	if from != "" && from != to {
		p.ZRem(ctx, s.keys.Status(from), id)
		if reactorName != "" {
			p.ZRem(ctx, s.keys.ReactorStatus(reactorName, from), id)
		}
	}
	p.ZAdd(ctx, s.keys.Status(to), redis.Z{Score: ms, Member: id})
	if reactorName != "" {
		p.ZAdd(ctx, s.keys.ReactorStatus(reactorName, to), redis.Z{Score: ms, Member: id})
	}
	if terminal {
		p.ZRem(ctx, s.keys.Active(), id)
	} else {
		p.ZAdd(ctx, s.keys.Active(), redis.Z{Score: ms, Member: id})
	}
}

// Unindex takes back the speculative status entry of a start that found an
// existing finished run. The active entry the start added is left for the
// run sweeper, which drops it after making sure the finished run's tree
// carries its retention: the run may be a finished run whose process died
// before that, and removing its entry here would hide it for good.
// UnindexReactor takes back the reactor entries a start of reactorName
// added for id (its reactor index and its reactor x status entry) when the
// id turned out to be a run of another reactor.
func (s *Store) UnindexReactor(ctx context.Context, id, reactorName, status string) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.keys.Reactor(reactorName), id)
		p.ZRem(ctx, s.keys.ReactorStatus(reactorName, status), id)
		return nil
	})
	return err
}

func (s *Store) Unindex(ctx context.Context, id, reactorName, status string) error {
	if status == "" {
		return nil
	}
	if reactorName == "" {
		return s.rdb.ZRem(ctx, s.keys.Status(status), id).Err()
	}
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.keys.Status(status), id)
		p.ZRem(ctx, s.keys.ReactorStatus(reactorName, status), id)
		return nil
	})
	return err
}

// RemoveIfScore removes member from index key only if its score is still
// score, the value the caller read: a writer that re-indexed the member since
// (a finished run made live again by an undo or a resume) keeps its entry.
// It reports whether the entry was removed.
func (s *Store) RemoveIfScore(ctx context.Context, key, member string, score float64) (bool, error) {
	return RemoveIfScore(ctx, s.rdb, key, member, score)
}

// RemoveIfScore is Store.RemoveIfScore for callers without a Store (the
// sweepers).
func RemoveIfScore(ctx context.Context, rdb redis.UniversalClient, key, member string, score float64) (bool, error) {
	n, err := zremIfScript.Run(ctx, rdb, []string{key}, member, strconv.FormatFloat(score, 'f', -1, 64)).Int()
	if err != nil {
		return false, fmt.Errorf("store: conditional index removal from %s: %w", key, err)
	}
	return n == 1, nil
}

// MarkNeedsHuman adds run id (a root or element run) to the index of runs
// waiting for a person, or takes it out.
func (s *Store) MarkNeedsHuman(ctx context.Context, id string, waiting bool, now time.Time) error {
	var err error
	if waiting {
		err = s.rdb.ZAdd(ctx, s.keys.NeedsHuman(), redis.Z{Score: float64(now.UnixMilli()), Member: id}).Err()
	} else {
		err = s.rdb.ZRem(ctx, s.keys.NeedsHuman(), id).Err()
	}
	if err != nil {
		return fmt.Errorf("store: index needs-human: %w", err)
	}
	return nil
}

// NeedsHuman lists up to limit runs waiting for a person, newest first. An
// entry whose run's state is gone (neither a root run's nor a map element
// run's state exists: the run expired, or the entry was added before a
// terminal write that failed) is skipped, so that a reader never sees a run
// it cannot open; the sweeper's trim removes such entries for good. The
// index is read a page at a time until limit runs are found or it ends.
func (s *Store) NeedsHuman(ctx context.Context, limit int) ([]string, error) {
	if limit <= 0 {
		return nil, nil
	}
	page := max(limit, 100)
	var out []string
	seen := map[string]bool{}
	for start := int64(0); len(out) < limit; start += int64(page) {
		ids, err := s.rdb.ZRevRange(ctx, s.keys.NeedsHuman(), start, start+int64(page)-1).Result()
		if err != nil {
			return nil, fmt.Errorf("store: read needs-human index: %w", err)
		}
		if len(ids) == 0 {
			break
		}
		roots := make([]*redis.IntCmd, len(ids))
		elems := make([]*redis.IntCmd, len(ids))
		legacy := make([]*redis.IntCmd, len(ids))
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, id := range ids {
				// Three commands: the states are in different slots (an
				// element of a map started before element runs moved into
				// their map's slot has the legacy key).
				roots[i] = p.Exists(ctx, s.keys.RunState(id))
				elems[i] = p.Exists(ctx, s.keys.ElemState(id))
				legacy[i] = p.Exists(ctx, s.keys.LegacyElemState(id))
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("store: read the runs of the needs-human index: %w", err)
		}
		for i, id := range ids {
			// An entry removed meanwhile shifts the next page: one read
			// twice is listed once.
			if (roots[i].Val() == 1 || elems[i].Val() == 1 || legacy[i].Val() == 1) && !seen[id] && len(out) < limit {
				seen[id] = true
				out = append(out, id)
			}
		}
		if len(ids) < page {
			break
		}
	}
	return out, nil
}
