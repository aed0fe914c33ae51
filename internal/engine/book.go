package engine

import (
	"slices"
)

// The entry book. Every ledger entry a rollback reaches gets one record in
// the run's book (runState.Book), and every rollback generation reads and
// writes that record: its state, the generation that last touched it, the
// calls of its Undo or Compensate, and for a guarded entry what its conflict
// looked like and what a person decided. Whether an entry blocks an older
// one, whether a re-triggered rollback retries it, whether the run waits for
// a person, whether Retry may run it again and what the report says are all
// read from the book, so a later generation can never forget what an earlier
// one left applied. The per-generation records (runState.Undone) stay, as
// the history the report and the audit are told from.

// entryRec is one ledger entry's record in the book.
type entryRec struct {
	// ID is the entry's id (entryID: "<step path>#<ordinal>").
	ID      string `msgpack:"id"`
	Step    string `msgpack:"s"`
	Ordinal int    `msgpack:"o,omitempty"`
	// Key orders entries across the run tree: the ordinals from the root
	// frame down to the entry (a composed child's entry carries its
	// compose entry's ordinal first). A greater key is a newer entry.
	Key []int `msgpack:"k,omitempty"`
	// State is the entry's rollback status as the latest generation (or a
	// person) left it.
	State RollbackStatus `msgpack:"st"`
	// Gen is the rollback generation that last wrote the record.
	Gen int `msgpack:"g,omitempty"`
	// Attempts counts the calls of the entry's Undo or Compensate that
	// started, across generations; a call cut short by a crash counts
	// once its start was saved (guarded undo saves it before calling).
	Attempts int `msgpack:"a,omitempty"`
	// Resource is the entry's resource ("" when it names none).
	Resource string `msgpack:"rs,omitempty"`
	// BlockedBy is the newer entry that blocked (or, for left_applied,
	// keeps) this one.
	BlockedBy string `msgpack:"by,omitempty"`
	// Reason is the stable code of the state (a failure's code,
	// reactor.conflict, reactor.blocked).
	Reason string `msgpack:"why,omitempty"`
	// Conflict is set once the entry's guarded undo conflicted: what the
	// person must act on, and what they decided.
	Conflict *humanRec `msgpack:"cf,omitempty"`
}

// waiting reports whether the entry waits for a person: its conflict is
// unresolved.
func (r *entryRec) waiting() bool { return r.State == RollbackNeedsPerson }

// inPlace reports whether the entry's effect is still applied after a
// rollback reached it: it failed, waits for a person, was blocked, kept out
// of its undo window, or left applied by a person's decision.
func (r *entryRec) inPlace() bool { return statusInPlace(r.State) }

// statusInPlace: the effect of an entry in status s is still applied.
func statusInPlace(s RollbackStatus) bool {
	switch s {
	case RollbackFailed, RollbackNeedsPerson, RollbackConflict, RollbackBlocked, RollbackOutOfWindow, RollbackLeftApplied:
		return true
	}
	return false
}

// newer reports whether key a orders after key b (a is the newer entry).
func newer(a, b []int) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	return slices.Compare(a, b) > 0
}

// entry returns the record of entry id, nil when the book has none.
func (st *runState) entry(id string) *entryRec {
	for _, r := range st.Book {
		if r.ID == id {
			return r
		}
	}
	return nil
}

// book returns the record of entry id, created with key and resource when
// the book has none yet.
func (st *runState) book(id, step string, ordinal int, key []int, resource string) *entryRec {
	if r := st.entry(id); r != nil {
		if r.Resource == "" {
			r.Resource = resource
		}
		return r
	}
	r := &entryRec{ID: id, Step: step, Ordinal: ordinal, Key: slices.Clone(key), State: RollbackPending, Resource: resource}
	st.Book = append(st.Book, r)
	return r
}

// waitsForPerson reports whether a person must act for st: one of its
// entries waits for a person, or one of its maps has elements that do
// (runState.Held). Such a run never expires, and NeedsHuman lists it.
func (st *runState) waitsForPerson() bool {
	if slices.ContainsFunc(st.Book, (*entryRec).waiting) {
		return true
	}
	for _, h := range st.Held {
		if h.Waiting > 0 {
			return true
		}
	}
	return false
}

// effectsInPlace counts what the run's rollbacks left applied: its own
// entries whose effect is still in place, and what its maps' elements
// hold. Zero means everything that could be undone was.
func (st *runState) effectsInPlace() int {
	n := 0
	for _, r := range st.Book {
		if r.inPlace() {
			n++
		}
	}
	for _, h := range st.Held {
		n += h.total()
	}
	return n
}

// conflicts are the book's entries whose guarded undo conflicted, resolved
// or not, in the order they first conflicted.
func (st *runState) conflicts() []*entryRec {
	var out []*entryRec
	for _, r := range st.Book {
		if r.Conflict != nil {
			out = append(out, r)
		}
	}
	return out
}

// Held counts what the elements of one map still hold after their
// rollbacks, over every rollback generation: entries waiting for a person,
// entries left applied by a person's decision (or kept under them), and
// entries whose undo failed or was blocked.
type Held struct {
	Waiting     int `msgpack:"w,omitempty" json:"waiting,omitempty"`
	LeftApplied int `msgpack:"l,omitempty" json:"left_applied,omitempty"`
	Failed      int `msgpack:"f,omitempty" json:"failed,omitempty"`
}

func (h Held) total() int { return h.Waiting + h.LeftApplied + h.Failed }

// IsZero reports whether nothing is held.
func (h Held) IsZero() bool { return h.total() == 0 }

// held is what st's own book holds, as its owner's map counts it.
func (st *runState) held() Held {
	var h Held
	for _, r := range st.Book {
		if !st.Held[r.Step].IsZero() {
			continue // a map's entry: its elements' counts say it better
		}
		switch {
		case r.waiting():
			h.Waiting++
		case r.State == RollbackLeftApplied:
			h.LeftApplied++
		case r.State == RollbackFailed || r.State == RollbackBlocked:
			h.Failed++
		}
	}
	for _, c := range st.Held {
		h.Waiting += c.Waiting
		h.LeftApplied += c.LeftApplied
		h.Failed += c.Failed
	}
	return h
}
