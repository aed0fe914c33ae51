// Package cli is what the goreactor command (cmd/goreactor) does with an
// engine, kept apart from its flag parsing so that cmd/demo continues a run
// through the same code an operator's `goreactor continue` runs.
//
// It needs no reactor definitions: an engine without them records a payload
// unchecked, and the worker that holds the definition validates it (see
// engine.Continuation.Checked). Wait tells the two outcomes apart.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
)

// Target names the interrupt a payload is for: a run and its interrupt
// step's path, or a correlation id.
type Target struct {
	RunID, Step string
	Correlation string
}

// Continue records payload (JSON) for the interrupt t names, sent by by.
func Continue(ctx context.Context, e *engine.Engine, t Target, payload json.RawMessage, by string) (*engine.Continuation, error) {
	var opts []engine.ContinueOption
	if by != "" {
		opts = append(opts, engine.ContinueBy(by))
	}
	if t.Correlation != "" {
		return e.ContinueByCorrelation(ctx, t.Correlation, payload, opts...)
	}
	return e.Continue(ctx, t.RunID, t.Step, payload, opts...)
}

// Command is the goreactor command line that continues t with payload
// (compact JSON) as by: what an operator types.
func Command(t Target, payload json.RawMessage, by string) string {
	var b strings.Builder
	b.WriteString("goreactor continue ")
	if t.Correlation != "" {
		b.WriteString("--correlation " + shellQuote(t.Correlation))
	} else {
		b.WriteString(shellQuote(t.RunID) + " " + shellQuote(t.Step))
	}
	b.WriteString(" --payload " + shellQuote(string(payload)))
	if by != "" {
		b.WriteString(" --by " + shellQuote(by))
	}
	return b.String()
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@,+=", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Recorded is one line saying what Continue recorded.
func Recorded(c *engine.Continuation) string {
	woken := "the run was handed to a worker"
	switch {
	case c.Received < c.Accepts:
		woken = fmt.Sprintf("the run waits for %d more", c.Accepts-c.Received)
	case !c.Woken:
		woken = "the run was not woken (the sweeper will wake it)"
	}
	checked := "unchecked here: the worker validates it"
	if c.Checked {
		checked = "validated"
	}
	return fmt.Sprintf("recorded: run %s, step %s, payload %d of %d at %s (%s); %s",
		c.RunID, c.Step, c.Received, c.Accepts, stamp(c.At), checked, woken)
}

// Explain says in an operator's words why a Continue was refused.
func Explain(err error) string {
	var (
		already *engine.AlreadyContinuedError
		payload *engine.PayloadError
		ce      *engine.ContinueError
	)
	switch {
	case errors.As(err, &already):
		return fmt.Sprintf("already continued: run %s, step %s took its payloads; the first came at %s",
			already.RunID, already.Step, stamp(already.At))
	case errors.As(err, &payload):
		return fmt.Sprintf("payload refused by run %s, step %s: %v", payload.RunID, payload.Step, payload.Err)
	case errors.As(err, &ce) && errors.Is(err, engine.ErrInterruptTimedOut):
		return fmt.Sprintf("timed out: run %s, step %s: %s", ce.RunID, ce.Step, ce.Reason)
	case errors.As(err, &ce) && errors.Is(err, engine.ErrAlreadyFinished):
		return fmt.Sprintf("not paused: run %s is %s (finished)", ce.RunID, ce.Status)
	case errors.As(err, &ce):
		return fmt.Sprintf("not paused: run %s is %s, and %s", ce.RunID, ce.Status, ce.Reason)
	case errors.Is(err, engine.ErrNoCorrelation):
		return "no such correlation: " + strings.TrimPrefix(err.Error(), "reactor: ")
	case errors.Is(err, engine.ErrNotFound):
		return "no such run: " + strings.TrimPrefix(err.Error(), "reactor: ")
	}
	return err.Error()
}

// Outcome is what became of a recorded payload, as Wait saw it.
type Outcome struct {
	// Taken: the run no longer waits at that interrupt; Status is the
	// run's status then.
	Taken  bool
	Status engine.Status
	// Refused is the worker's reason for refusing the payload ("" when it
	// did not); the run still waits.
	Refused string
}

// ErrUndecided is Wait's error when neither outcome came in time: the
// payload stays recorded, the run goes on when a worker gets to it.
var ErrUndecided = errors.New("the worker has not taken the payload yet")

// pollEvery is how often Wait reads the run.
const pollEvery = 50 * time.Millisecond

// Wait waits up to timeout for the worker to take the payload c recorded
// (the run leaves that pause) or to refuse it (the interrupt records a
// refusal at or after c.At). It returns ErrUndecided when neither happens in
// time, and at once for a Continuation that wakes nothing (the interrupt
// waits for more payloads), whose outcome is undecided by design.
func Wait(ctx context.Context, e *engine.Engine, c *engine.Continuation, timeout time.Duration) (Outcome, error) {
	if c.Received < c.Accepts {
		return Outcome{}, ErrUndecided
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var since time.Time // the pause the payload went to
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		run, err := e.Get(ctx, c.RunID)
		if err != nil {
			if ctx.Err() != nil {
				return Outcome{}, ErrUndecided
			}
			return Outcome{}, err
		}
		p := run.Paused
		switch {
		case p == nil || p.Step != c.Step || (!since.IsZero() && !p.Since.Equal(since)):
			return Outcome{Taken: true, Status: run.Status}, nil
		case since.IsZero():
			since = p.Since
		}
		info, err := e.Interrupt(ctx, c.RunID)
		switch {
		case errors.Is(err, engine.ErrNotPaused):
			continue // gone on: the next Get says where
		case err != nil && ctx.Err() != nil:
			return Outcome{}, ErrUndecided
		case err != nil:
			return Outcome{}, err
		case info.Refused != "" && !info.RefusedAt.Before(c.At.Truncate(time.Millisecond)):
			return Outcome{Refused: info.Refused}, nil
		}
		select {
		case <-ctx.Done():
			return Outcome{}, ErrUndecided
		case <-t.C:
		}
	}
}

// Paused is one run waiting at an interrupt, as List shows it.
type Paused struct {
	RunID       string    `json:"run_id"`
	Reactor     string    `json:"reactor"`
	Step        string    `json:"step"`
	Correlation string    `json:"correlation,omitempty"`
	Since       time.Time `json:"since"`
	Deadline    time.Time `json:"deadline,omitzero"`
	Received    int       `json:"received"`
	Accepts     int       `json:"accepts"`
	Refused     string    `json:"refused,omitempty"`
	RefusedAt   time.Time `json:"refused_at,omitzero"`
}

// Interrupt is a run's interrupt as `goreactor show --json` prints it: a
// Paused with the payloads it holds and, when the engine has the
// definition, the payload's type and an example.
type Interrupt struct {
	Paused
	Payloads    []Payload       `json:"payloads"`
	PayloadType string          `json:"payload_type,omitempty"`
	Example     json.RawMessage `json:"example,omitempty"`
}

// Payload is one payload an interrupt holds.
type Payload struct {
	Payload json.RawMessage `json:"payload"`
	At      time.Time       `json:"at"`
	By      string          `json:"by,omitempty"`
}

// pausedOf is info's listing line.
func pausedOf(info *engine.InterruptInfo) Paused {
	return Paused{RunID: info.RunID, Reactor: info.Reactor, Step: info.Step, Correlation: info.Correlation,
		Since: info.Since.UTC(), Deadline: info.Deadline.UTC(), Received: info.Received, Accepts: info.Accepts,
		Refused: info.Refused, RefusedAt: info.RefusedAt.UTC()}
}

// InterruptOf is info for printing as JSON.
func InterruptOf(info *engine.InterruptInfo) Interrupt {
	out := Interrupt{Paused: pausedOf(info), Payloads: []Payload{}, PayloadType: info.PayloadType, Example: info.Example}
	for _, p := range info.Payloads {
		out.Payloads = append(out.Payloads, Payload{Payload: p.Payload, At: p.At.UTC(), By: p.By})
	}
	return out
}

// maxExamined bounds the index entries one List reads: entries of runs
// that left the status a moment ago are skipped, not counted.
const maxExamined = 5000

// List returns up to limit paused runs, of reactor reactorName ("" for
// every reactor), oldest first: in the order they entered the paused
// status (a run woken by a payload it refused may enter it again). It reads the listing index
// of paused runs (P:idx:status:paused, or P:idx:rs:<reactor>:paused), the
// one the dashboard filters by status with, a chunk at a time.
func List(ctx context.Context, e *engine.Engine, reactorName string, limit int) ([]Paused, error) {
	k := keys.New(engine.Prefix(e))
	index := k.Status(string(engine.StatusPaused))
	if reactorName != "" {
		index = k.ReactorStatus(reactorName, string(engine.StatusPaused))
	}
	rdb := engine.Client(e)
	chunk := int64(max(limit, 100))
	out := []Paused{}
	for start := int64(0); len(out) < limit && start < maxExamined; start += chunk {
		ids, err := rdb.ZRange(ctx, index, start, start+chunk-1).Result()
		if err != nil {
			return nil, fmt.Errorf("read the paused runs' index: %w", err)
		}
		for _, id := range ids {
			info, err := e.Interrupt(ctx, id)
			if errors.Is(err, engine.ErrNotPaused) || errors.Is(err, engine.ErrNotFound) {
				continue // it went on since the index was read, or is gone
			}
			if err != nil {
				return nil, err
			}
			out = append(out, pausedOf(info))
			if len(out) == limit {
				break
			}
		}
		if int64(len(ids)) < chunk {
			break
		}
	}
	return out, nil
}

// PrintList writes runs as a table, one line each, or as a JSON array.
func PrintList(w io.Writer, runs []Paused, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(runs)
	}
	if len(runs) == 0 {
		_, err := fmt.Fprintln(w, "no paused runs")
		return err
	}
	fmt.Fprintf(w, "%-28s %-16s %-20s %-16s %-24s %-24s %s\n", "RUN", "REACTOR", "STEP", "CORRELATION", "SINCE", "DEADLINE", "RECEIVED")
	for _, r := range runs {
		corr, deadline := orDash(r.Correlation), "-"
		if !r.Deadline.IsZero() {
			deadline = stamp(r.Deadline)
		}
		_, err := fmt.Fprintf(w, "%-28s %-16s %-20s %-16s %-24s %-24s %d/%d\n", r.RunID, r.Reactor, r.Step, corr, stamp(r.Since), deadline, r.Received, r.Accepts)
		if err != nil {
			return err
		}
	}
	return nil
}

// Show writes the interrupt run id waits at: its step, correlation, times,
// the payloads it holds and its last refusal.
func Show(w io.Writer, info *engine.InterruptInfo) {
	fmt.Fprintf(w, "run         %s (%s)\n", info.RunID, info.Reactor)
	fmt.Fprintf(w, "step        %s\n", info.Step)
	fmt.Fprintf(w, "correlation %s\n", orDash(info.Correlation))
	fmt.Fprintf(w, "since       %s\n", stamp(info.Since))
	deadline := "none"
	if !info.Deadline.IsZero() {
		deadline = stamp(info.Deadline)
	}
	fmt.Fprintf(w, "deadline    %s\n", deadline)
	fmt.Fprintf(w, "received    %d of %d\n", info.Received, info.Accepts)
	for i, p := range info.Payloads {
		fmt.Fprintf(w, "  %d. %s by %s: %s\n", i+1, stamp(p.At), orDash(p.By), p.Payload)
	}
	if info.PayloadType != "" {
		fmt.Fprintf(w, "payload     %s, like %s\n", info.PayloadType, info.Example)
	}
	if info.Refused != "" {
		fmt.Fprintf(w, "refused     %s: %s\n", stamp(info.RefusedAt), info.Refused)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stamp formats t as RFC 3339 with milliseconds, in UTC.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
