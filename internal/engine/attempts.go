package engine

import (
	"time"
	"unicode/utf8"
)

// Attempt logs. Each plain step keeps a bounded log of its attempts (when
// each started and ended, the error each returned and whether it could be
// retried) and the arguments it ran with, for people reading a run (the
// dashboard's step timeline). The log is written by the checkpoints the
// engine makes anyway: a failed attempt goes on record with the checkpoint
// that counts it before the next attempt (intentRec), the last one with the
// step's record, or with the write that starts the rollback of a failed
// step. No attempt costs a Redis round trip of its own.
//
// While a step has no record (it is running, or it failed or halted) its
// log sits in runState.Tries; the step's record takes it over when it
// completes (stepRec.Log), as it takes over its start from Starts. A step
// that completes on its first attempt with no arguments worth keeping keeps
// no log: its one attempt is the step's own start and finish (the common
// case costs nothing). A crash inside an attempt leaves no entry for it
// (nothing ran to record it): its rerun, with the same number, does.

// maxAttemptLog is how many attempts a step's log keeps, the latest: the
// older ones are counted (attemptLog.Dropped), not kept.
const maxAttemptLog = 20

// maxAttemptError bounds an attempt's error message in the log, in bytes.
const maxAttemptError = 2 << 10

// maxKeptArgs bounds the encoded arguments a step's log keeps. Larger
// arguments are not kept (they are built again from the run's inputs and
// earlier results whenever the step runs, and keeping a copy of a large
// one would swell every later write of the run). An undoable step's
// arguments are on its ledger entry already, so its log keeps none.
const maxKeptArgs = 1 << 10

// attemptRec is one ended attempt of a step's Run.
type attemptRec struct {
	// N is the attempt's number, from 1.
	N int `msgpack:"n"`
	// Start is when it started (Unix ms); Dur how long it took (ms).
	Start int64 `msgpack:"s"`
	Dur   int64 `msgpack:"d,omitempty"`
	// Err is its error, truncated ("" when it succeeded, skipped or
	// halted); Same says it was the previous entry's, which is not stored
	// twice.
	Err  string `msgpack:"x,omitempty"`
	Same bool   `msgpack:"=,omitempty"`
	// Retry: the error was retryable (not Permanent), whether or not
	// attempts were left.
	Retry bool `msgpack:"r,omitempty"`
}

// attemptLog is a step's log of attempts, oldest first, and its arguments.
type attemptLog struct {
	List []attemptRec `msgpack:"l,omitempty"`
	// Dropped counts the older attempts no longer kept.
	Dropped int `msgpack:"dr,omitempty"`
	// Args are the step's encoded arguments, when kept (maxKeptArgs).
	Args Raw `msgpack:"a,omitempty"`
}

// add appends a to the log, dropping its oldest entry past maxAttemptLog.
func (l *attemptLog) add(a attemptRec) {
	if n := len(l.List); n > 0 && a.Err != "" && l.errOf(n-1) == a.Err {
		a.Err, a.Same = "", true
	}
	if len(l.List) >= maxAttemptLog {
		if len(l.List) > 1 && l.List[1].Same {
			// The entry that says "as before" now starts the log.
			l.List[1].Err, l.List[1].Same = l.errOf(0), false
		}
		l.List = append(l.List[:0], l.List[1:]...)
		l.Dropped++
	}
	l.List = append(l.List, a)
}

// errOf is entry i's error, following the entries that repeat the one
// before.
func (l *attemptLog) errOf(i int) string {
	for ; i > 0 && l.List[i].Same; i-- {
	}
	return l.List[i].Err
}

// attemptError is err's message as the log keeps it: at most
// maxAttemptError bytes, cut at a rune boundary, marked when cut.
func attemptError(err error) string {
	msg := err.Error()
	if len(msg) <= maxAttemptError {
		return msg
	}
	const mark = " …(truncated)"
	cut := maxAttemptError - len(mark)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + mark
}

// worthKeeping reports whether a step's encoded arguments go in its log:
// there are some (more than an empty map's one byte), and they are small.
func worthKeeping(args Raw) bool { return len(args) > 1 && len(args) <= maxKeptArgs }

// attempted records an attempt of step name that ended at now, in the log
// it has while it has no record, with its arguments when kept (keepArgs).
func (st *runState) attempted(name string, a attemptRec, args Raw, keepArgs bool) {
	if st.Tries == nil {
		st.Tries = map[string]*attemptLog{}
	}
	l := st.Tries[name]
	if l == nil {
		l = &attemptLog{}
		st.Tries[name] = l
	}
	if keepArgs && l.Args == nil && worthKeeping(args) {
		l.Args = args
	}
	l.add(a)
}

// completedLog is the log that the record of step name, which just
// completed (or skipped) with attempt a, takes over: nil when there is
// nothing to keep beyond the step's own times (a first attempt, and no
// arguments kept).
func (st *runState) completedLog(name string, a attemptRec, args Raw, keepArgs bool) *attemptLog {
	l := st.Tries[name]
	delete(st.Tries, name)
	if l == nil && a.N <= 1 && (!keepArgs || !worthKeeping(args)) {
		return nil
	}
	if l == nil {
		l = &attemptLog{}
	}
	switch {
	case !keepArgs:
		l.Args = nil // on the step's ledger entry
	case l.Args == nil && worthKeeping(args):
		l.Args = args
	}
	if len(l.List) > 0 || a.N > 1 {
		l.add(a)
	}
	return l
}

// AttemptRecord is one ended attempt of a step's Run.
type AttemptRecord struct {
	// Attempt is its number, from 1 (it counts across processes).
	Attempt int
	// StartedAt and EndedAt are when it was called and when it returned.
	StartedAt, EndedAt time.Time
	// Error is the error it returned, cut to 2 KB; "" when it succeeded
	// (or skipped or halted the step).
	Error string
	// Retryable is true when the error was not Permanent (another attempt
	// followed unless the step's attempts, or the run's time, ran out).
	Retryable bool
}

// AttemptLog is what a run kept of a step's attempts.
type AttemptLog struct {
	// Attempts are the step's ended attempts, oldest first: at most the
	// latest 20. A step that completed on its first attempt keeps no log
	// of its own: its one attempt is the step's start and finish, listed
	// here as such (a construct's or composed child's step, too). Empty
	// when none was recorded: a step cut short in its first attempt, or a
	// retried step of a run stored before runs kept logs.
	Attempts []AttemptRecord
	// Dropped counts the older attempts not kept.
	Dropped int
	// Args are the step's arguments as it ran with them (its ledger
	// snapshot for an undoable step); nil when not kept: arguments larger
	// than 1 KB, steps without arguments, constructs and composed
	// children, runs stored before runs kept them.
	Args Raw
}

// view is l as a reader sees it (l may be nil).
func (l *attemptLog) view() AttemptLog {
	var out AttemptLog
	if l == nil {
		return out
	}
	out.Dropped, out.Args = l.Dropped, l.Args
	for i, a := range l.List {
		r := AttemptRecord{Attempt: a.N, StartedAt: time.UnixMilli(a.Start), EndedAt: time.UnixMilli(a.Start + a.Dur),
			Error: a.Err, Retryable: a.Retry}
		if a.Same {
			r.Error = l.errOf(i)
		}
		out.Attempts = append(out.Attempts, r)
	}
	return out
}
