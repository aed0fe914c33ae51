package inspect

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// The map's element states (P:{map:<id>}:states, keys.MapStates): one byte
// per element index, set by the settle that stored an outcome
// (internal/mapcore/lua/batch.lua, noteState, a GETRANGE and a SETRANGE in the script
// that already runs), so a summary reads total bytes instead of every
// outcome of every results hash. The high nibble is the forward outcome's
// class, the low nibble the newest rollback outcome's.
const (
	fwdNone      = 0 // no forward outcome: running below the offset, else pending
	fwdCompleted = 1 // ok, halted, skipped
	fwdFailed    = 2
	fwdOther     = 3 // stopped (or a status this version does not know): pending

	rbNone        = 0
	rbUndone      = 1
	rbFailed      = 2
	rbUnavailable = 3
	rbOther       = 4 // not_needed, element_in_flight: the forward state shows
)

// Indexes into States.
const (
	iPending uint8 = iota
	iRunning
	iCompleted
	iFailed
	iUndone
	iUndoFailed
	iUnavailable
)

var fwdStates = [16]uint8{fwdNone: iPending, fwdCompleted: iCompleted, fwdFailed: iFailed, fwdOther: iPending}

// fromStates returns each element's state (an index into States) from m's
// element states, and false when they are not complete: when the forward
// nibbles set are not the map's settled positions, or the rollback nibbles
// set not its first rollback generation's (every later generation re-settles
// elements of the first, so the count stays). That is a map started before
// the settle scripts kept the states, or settled in part by a process that
// did not (a rolling deploy): its summary falls back to the results hashes
// (fromResults). One round trip, for total bytes: a transaction (the keys
// share the map's slot), so that the counters it checks are the states'
// own, however fast the map settles.
func (r *Reader) fromStates(ctx context.Context, m Map) ([]uint8, bool, error) {
	var settled, rbSettled, offset, states *redis.StringCmd
	if _, err := r.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		settled = p.HGet(ctx, r.keys.MapMeta(m.ID), "settled")
		rbSettled = p.HGet(ctx, r.keys.MapRbMeta(m.ID, 1), "settled")
		offset = p.Get(ctx, r.keys.MapOffset(m.ID))
		states = p.Get(ctx, r.keys.MapStates(m.ID))
		return nil
	}); pipeErr(err) != nil {
		return nil, false, fmt.Errorf("inspect: read the element states of map %s: %w", m.ID, err)
	}
	raw := states.Val()
	if len(raw) > m.Total {
		return nil, false, nil // a nibble beyond the map: not one to trust
	}
	off, _ := strconv.Atoi(offset.Val())
	state := make([]uint8, m.Total)
	fwdSet, rbSet := 0, 0
	for i := range state {
		var b byte
		if i < len(raw) {
			b = raw[i]
		}
		f, rb := b>>4, b&0x0f
		st := fwdStates[f]
		if f == fwdNone {
			if i < off {
				st = iRunning
			}
		} else {
			fwdSet++
		}
		if m.Rollback != nil && rb != rbNone {
			rbSet++
			switch rb {
			case rbUndone:
				st = iUndone
			case rbFailed:
				st = iUndoFailed
			case rbUnavailable:
				st = iUnavailable
			}
		}
		state[i] = st
	}
	wantFwd, _ := strconv.Atoi(settled.Val())
	wantRb, _ := strconv.Atoi(rbSettled.Val())
	if fwdSet != wantFwd || (m.Rollback != nil && rbSet != wantRb) {
		return nil, false, nil
	}
	return state, true, nil
}
