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

// MarkStarted adds run id to the active index and the listing indexes.
func (s *Store) MarkStarted(ctx context.Context, id, status string, now time.Time) error {
	ms := float64(now.UnixMilli())
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, s.keys.Active(), redis.Z{Score: ms, Member: id})
		p.ZAddNX(ctx, s.keys.Runs(), redis.Z{Score: ms, Member: id})
		p.ZAdd(ctx, s.keys.Status(status), redis.Z{Score: ms, Member: id})
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: index run: %w", err)
	}
	return nil
}

// MarkStatus moves run id from status from to status to in the listing
// indexes. A terminal status also removes it from the active index and gives
// the index entries nothing to expire: they are trimmed by score.
func (s *Store) MarkStatus(ctx context.Context, id, from, to string, terminal bool, now time.Time) error {
	ms := float64(now.UnixMilli())
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if from != "" && from != to {
			p.ZRem(ctx, s.keys.Status(from), id)
		}
		p.ZAdd(ctx, s.keys.Status(to), redis.Z{Score: ms, Member: id})
		if terminal {
			p.ZRem(ctx, s.keys.Active(), id)
		} else {
			p.ZAdd(ctx, s.keys.Active(), redis.Z{Score: ms, Member: id})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: index status: %w", err)
	}
	return nil
}

// Unindex removes id from the active index only. It is used when a start
// found an existing finished run that it had speculatively indexed.
func (s *Store) Unindex(ctx context.Context, id, status string) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.keys.Active(), id)
		if status != "" {
			p.ZRem(ctx, s.keys.Status(status), id)
		}
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
