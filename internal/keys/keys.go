// Package keys builds every Redis key goreactor uses.
//
// Each key carries a hash tag ({run:<id>}, {map:<id>}, {elem:<id>}) so that a
// Lua script touching the keys of one aggregate stays in one Redis Cluster slot.
// Global indexes (idx:*) are deliberately untagged: they are written with
// single-key commands outside the per-run scripts, and spreading them over the
// cluster keeps one slot from becoming hot.
package keys

import (
	"fmt"
	"strconv"
	"strings"
)

// DefaultPrefix is the key prefix used when none is configured.
const DefaultPrefix = "goreactor"

// Keys builds keys under one prefix. The zero value is not usable; call New.
type Keys struct {
	prefix string
}

// New returns a key builder for prefix (DefaultPrefix when empty).
func New(prefix string) Keys {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return Keys{prefix: prefix}
}

// Prefix returns the prefix every key starts with.
func (k Keys) Prefix() string { return k.prefix }

// ValidateID reports whether id can be embedded in a hash-tagged key.
// Braces would change which part of the key Redis Cluster hashes, and an empty
// or huge id is always a caller mistake.
func ValidateID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("id is empty")
	case len(id) > 256:
		return fmt.Errorf("id %.32q... is longer than 256 bytes", id)
	case strings.ContainsAny(id, "{}"):
		return fmt.Errorf("id %q contains a brace, which would break its Redis Cluster hash tag", id)
	}
	return nil
}

func (k Keys) run(id, suffix string) string { return k.prefix + ":{run:" + id + "}:" + suffix }

// RunState is the hash holding a run's serialized state (field d) and its
// version (field v).
func (k Keys) RunState(id string) string { return k.run(id, "ctx") }

// RunLock is the run's lock; its value is the holder's token.
func (k Keys) RunLock(id string) string { return k.run(id, "lock") }

// RunCancel is set when someone asks a run held by another process to cancel.
// The fenced write reads it, so the executing process learns of the request
// without an extra round trip.
func (k Keys) RunCancel(id string) string { return k.run(id, "cancel") }

// RunAudit is the append-only stream of the run's compensation events.
func (k Keys) RunAudit(id string) string { return k.run(id, "audit") }

// RunMaps is the set of the run's fan-out maps (forward or rolling back)
// that have not been adopted yet: the run sweeper leaves a run alone while
// one of them is still working.
func (k Keys) RunMaps(id string) string { return k.run(id, "maps") }

// RunTree is the set of map ids a run's steps started (its fan-out and
// inline maps, those of composed children included): what its retention
// walk expires with it.
func (k Keys) RunTree(id string) string { return k.run(id, "tree") }

// RunTasks is the hash of run id's steps that run as tasks of their own
// (StepConfig.Task): each dispatch's arguments, attempts, lease, outcome and
// undo outcomes, by token. Part of the run's tree (it expires with the run).
func (k Keys) RunTasks(id string) string { return k.run(id, "tasks") }

// RunDone is the shard pub/sub channel on which a run's terminal write
// announces that the run finished (SPUBLISH from the write script, in the
// run's slot). It is a channel, not a key: nothing is stored under it.
func (k Keys) RunDone(id string) string { return k.run(id, "done") }

// RunWaiting says that a process refused the run for want of its
// definition (a rolling deploy): a short-lived string key, refreshed by every
// refusal, that expires on its own once the refusals stop.
func (k Keys) RunWaiting(id string) string { return k.run(id, "waitdef") }

// Active is the index of non-terminal runs scored by last-touched time (ms).
func (k Keys) Active() string { return k.prefix + ":idx:active" }

// Runs is the index of every run scored by creation time (ms).
func (k Keys) Runs() string { return k.prefix + ":idx:runs" }

// Status is the index of runs currently in status s, scored by the time they
// entered it (ms).
func (k Keys) Status(s string) string { return k.prefix + ":idx:status:" + s }

// elem builds a key of element run id ("<mapID>.<i>"): under its map's hash
// tag, so that one script can write the element's state and settle its map
// (mapstep's element scripts), and the element's keys stay in one slot.
// An id without a numeric ".<i>" suffix keeps a tag of its own.
func (k Keys) elem(id, suffix string) string {
	if m, i, ok := SplitElementID(id); ok {
		return k.mapKey(m, "el:"+i+":"+suffix)
	}
	return k.prefix + ":{elem:" + id + "}:" + suffix
}

// SplitElementID splits element run id "<mapID>.<i>" into its map id and
// index (as written); ok is false for an id without a numeric suffix.
func SplitElementID(id string) (mapID, index string, ok bool) {
	dot := strings.LastIndexByte(id, '.')
	if dot <= 0 || dot == len(id)-1 {
		return "", "", false
	}
	for _, c := range id[dot+1:] {
		if c < '0' || c > '9' {
			return "", "", false
		}
	}
	return id[:dot], id[dot+1:], true
}

// ElemState is the state hash of a construct element run (a map element
// "<mapID>.<i>"), in its map's slot (see elem): a map's element runs live
// on one cluster node, the price of writing an element's terminal state and
// settling its map in one script.
func (k Keys) ElemState(id string) string { return k.elem(id, "ctx") }

// ElemLock is an element run's lock, in the same slot as its state.
func (k Keys) ElemLock(id string) string { return k.elem(id, "lock") }

// ElemTree is the set of map ids an element run's steps started (maps
// nested in a map element run inline), expired with the element: one set per
// map, shared by its elements (MapNested), so that the retention walk reads
// one set per map, not one per element.
func (k Keys) ElemTree(id string) string {
	if m, _, ok := SplitElementID(id); ok {
		return k.MapNested(m)
	}
	return k.elem(id, "tree")
}

// MapNested is the set of maps nested in a map's element runs (ElemTree).
func (k Keys) MapNested(id string) string { return k.mapKey(id, "nested") }

// ElemCancel is an element run's cancel request.
func (k Keys) ElemCancel(id string) string { return k.elem(id, "cancel") }

// ElemAudit is where an element run's audit entries go: its map's audit
// stream (MapAudit), shared by the map's elements, each entry naming its
// element (field "el"), so that a map costs one stream, not one per element.
// An id that is no map element's has a stream of its own.
func (k Keys) ElemAudit(id string) string {
	if m, _, ok := SplitElementID(id); ok {
		return k.MapAudit(m)
	}
	return k.elem(id, "audit")
}

// MapAudit is the audit stream of a map's element runs (ElemAudit).
func (k Keys) MapAudit(id string) string { return k.mapKey(id, "audit") }

// Legacy element keys: the layout before element runs moved into their
// map's slot (each element in a slot of its own, "{elem:<id>}"). The
// retention walk still expires them, for maps started before the move.

// LegacyElemState is ElemState in the old layout.
func (k Keys) LegacyElemState(id string) string { return k.prefix + ":{elem:" + id + "}:ctx" }

// LegacyElemLock is ElemLock in the old layout.
func (k Keys) LegacyElemLock(id string) string { return k.prefix + ":{elem:" + id + "}:lock" }

// LegacyElemAudit is ElemAudit in the old layout.
func (k Keys) LegacyElemAudit(id string) string { return k.prefix + ":{elem:" + id + "}:audit" }

// LegacyElemTree is ElemTree in the old layout.
func (k Keys) LegacyElemTree(id string) string { return k.prefix + ":{elem:" + id + "}:tree" }

// LegacyElemCancel is ElemCancel in the old layout.
func (k Keys) LegacyElemCancel(id string) string { return k.prefix + ":{elem:" + id + "}:cancel" }

func (k Keys) mapKey(id, suffix string) string { return k.prefix + ":{map:" + id + "}:" + suffix }

// MapMeta is a map's metadata hash: total, batch_size, atomic, owner, counters.
func (k Keys) MapMeta(id string) string { return k.mapKey(id, "meta") }

// MapSource is the list of a map's element inputs when its source is a value.
func (k Keys) MapSource(id string) string { return k.mapKey(id, "source") }

// MapOffset is a map's forward claim counter, advanced by compare-and-set.
func (k Keys) MapOffset(id string) string { return k.mapKey(id, "offset") }

// MapResults is a map's index -> outcome hash (first writer wins).
func (k Keys) MapResults(id string) string { return k.mapKey(id, "results") }

// MapStates is a map's element states for the dashboard's summary: one
// byte per element index, its high nibble the forward outcome's class and
// its low nibble the newest rollback outcome's class (internal/inspect's
// codes), written (GETRANGE, SETRANGE) by the settle that stored the outcome.
func (k Keys) MapStates(id string) string { return k.mapKey(id, "states") }

// MapFailed holds the index of a map's first atomic failure (SET NX).
func (k Keys) MapFailed(id string) string { return k.mapKey(id, "failed") }

// MapSignalled is claimed (SET NX) by the one settle that resumes the owner.
func (k Keys) MapSignalled(id string) string { return k.mapKey(id, "owner_signalled") }

// MapHeld is what a map's elements still hold after their rollbacks: one
// field per element holding any ("<waiting>:<left applied>:<failed>"), and
// the totals (#w, #l, #f), over every rollback generation.
func (k Keys) MapHeld(id string) string { return k.mapKey(id, "held") }

// SweeperLeader is the lock a sweeper pass holds, so that replicas of
// cmd/sweeper do not sweep at the same time.
func (k Keys) SweeperLeader() string { return k.prefix + ":{sweeper}:leader" }

// Worker is the record a goreactor worker publishes about itself under
// asynq server id serverID (its goreactor version, prefix, host, pid and
// start), for the dashboard's workers view: asynq's own server record
// carries no version. Every worker's record shares the {workers} tag, so
// the dashboard reads them all from one node in one pipeline; each is a
// small hash with a TTL a few heartbeats long, refreshed while the worker
// runs and deleted when it stops.
func (k Keys) Worker(serverID string) string { return k.prefix + ":{workers}:" + serverID }

// Maps is the index of maps with outstanding work (sweeper input).
func (k Keys) Maps() string { return k.prefix + ":idx:maps" }

func (k Keys) rbKey(id string, gen int, suffix string) string {
	return k.mapKey(id, "rb:"+strconv.Itoa(gen)+":"+suffix)
}

// MapRbMeta is a map rollback's metadata: total, batch_size, started_at,
// settled and per-outcome counters (generation gen).
func (k Keys) MapRbMeta(id string, gen int) string { return k.rbKey(id, gen, "meta") }

// MapRbOffset is a map rollback's claim counter (compare-and-set).
func (k Keys) MapRbOffset(id string, gen int) string { return k.rbKey(id, gen, "offset") }

// MapRbResults is a map rollback's position -> outcome hash (HSETNX).
func (k Keys) MapRbResults(id string, gen int) string { return k.rbKey(id, gen, "results") }

// MapRbHandedOff is set by the owner after its hand-off save.
func (k Keys) MapRbHandedOff(id string, gen int) string { return k.rbKey(id, gen, "handed_off") }

// MapRbWork is a re-triggered map rollback's work list: the element index
// of each of its positions, newest first (a first rollback's position p is
// element total-1-p and needs none).
func (k Keys) MapRbWork(id string, gen int) string { return k.rbKey(id, gen, "work") }

// MapRbSignalled is claimed (SET NX) by whoever resumes the owner.
func (k Keys) MapRbSignalled(id string, gen int) string { return k.rbKey(id, gen, "signalled") }

// Reactors is the set of reactor names that have runs in the reactor
// indexes, so the index trimmer can find those indexes without a scan.
func (k Keys) Reactors() string { return k.prefix + ":idx:reactors" }

// Reactor is the index of reactor name's root runs scored by creation time
// (ms): the dashboard's reactor filter.
func (k Keys) Reactor(name string) string { return k.prefix + ":idx:reactor:" + name }

// ReactorStatus is the index of reactor name's root runs currently in status
// s, scored by the time they entered it (ms): the dashboard's reactor x
// status filter.
func (k Keys) ReactorStatus(name, s string) string { return k.prefix + ":idx:rs:" + name + ":" + s }

// IDs is the index of every root run id, all scored 0, so that ZRANGEBYLEX
// finds the ids that start with a prefix (the dashboard's id search).
func (k Keys) IDs() string { return k.prefix + ":idx:ids" }

// NeedsHuman indexes the runs (root or map element) with a conflicted undo
// no person has resolved, scored by when it was stored (ms).
func (k Keys) NeedsHuman() string { return k.prefix + ":idx:needs_human" }

// Corr is the claim of correlation id id by the interrupt waiting for it
// (its value names the run, the step and the interrupt's instance). A slot
// of its own: the claim and the run it names are kept consistent by a
// protocol (engine/interrupt.go), not by one script.
func (k Keys) Corr(id string) string { return k.prefix + ":{corr:" + id + "}" }

// Slots is the semaphore of concurrency limit name for key (a lock is a
// limit of one): its holders and their leases, in a slot of its own.
func (k Keys) Slots(name, key string) string { return k.prefix + ":{lim:" + name + ":" + key + "}" }

// Fair is the slots of fair-shared limit name, which all its keys share
// (store/lua/fair.lua): one hash slot per limit.
func (k Keys) Fair(name string) string { return k.prefix + ":{fair:" + name + "}" }

// Rate is the admissions of rate limit name for key within its longest
// window.
func (k Keys) Rate(name, key string) string { return k.prefix + ":{rate:" + name + ":" + key + "}" }

// Once is the once-per-period guard of limit name for key: which run holds
// the current period.
func (k Keys) Once(name, key string) string { return k.prefix + ":{once:" + name + ":" + key + "}" }
