package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// setWaitingScript stores a definition-wait note stamped with the server's
// time: KEYS[1] the note (P:{run:<id>}:waitdef), ARGV[1] the note, ARGV[2]
// its ttl in ms. The stamp comes from the node that holds the run's state,
// the clock its writes stamp "at" with, so a reader can tell a note older
// than the run's last write.
var setWaitingScript = redis.NewScript(`
local t = redis.call('TIME')
local ms = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('SET', KEYS[1], ms .. ' ' .. ARGV[1], 'PX', ARGV[2])
return ms`)

// SetWaiting stores run id's definition-wait note (encoded by the caller)
// for ttl, so the note lapses once nobody refuses the run any more.
func (s *Store) SetWaiting(ctx context.Context, id string, note []byte, ttl time.Duration) error {
	return setWaitingScript.Run(ctx, s.rdb, []string{s.keys.RunWaiting(id)}, note, ttl.Milliseconds()).Err()
}

// Waiting returns run id's definition-wait note, nil when there is none or
// when the run's state was written after it: a process that has the
// definition took the run since the refusal.
func (s *Store) Waiting(ctx context.Context, id string) ([]byte, error) {
	var note *redis.StringCmd
	var at *redis.StringCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		note = p.Get(ctx, s.keys.RunWaiting(id))
		at = p.HGet(ctx, s.keys.RunState(id), "at")
		return nil
	})
	if errors.Is(note.Err(), redis.Nil) {
		return nil, nil
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	b, _ := note.Bytes()
	stamp, rest, ok := cutStamp(b)
	if !ok {
		return nil, fmt.Errorf("store: definition-wait note of run %s: no stamp", id)
	}
	if last, err := strconv.ParseInt(at.Val(), 10, 64); err == nil && last > stamp {
		return nil, nil
	}
	return rest, nil
}

func cutStamp(b []byte) (int64, []byte, bool) {
	for i, c := range b {
		if c == ' ' {
			ms, err := strconv.ParseInt(string(b[:i]), 10, 64)
			return ms, b[i+1:], err == nil
		}
	}
	return 0, nil, false
}
