package store_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/store"
)

// interruptModel is the reference an interrupt record is checked against:
// which interrupt is on record, its state, its payloads, and the first
// payload time of every step whose interrupt the run adopted.
type interruptModel struct {
	path     string
	inst     int
	accepts  int
	state    string // w d t c, "" before the first open
	deadline bool   // has one
	expired  bool   // its deadline passed
	payloads []string
	firstAt  map[string]bool // steps with an adopted interrupt (ih:<path>)
	finished bool
}

// continueWant is what the model says a continue of (path, inst) gets.
func (m *interruptModel) continueWant(path string, inst int) string {
	if m.finished {
		if m.firstAt[path] {
			return store.ContinueAlready
		}
		return store.ContinueFinished
	}
	if m.state == "" || m.path != path || (inst != 0 && m.inst != inst) {
		if m.firstAt[path] {
			return store.ContinueAlready
		}
		return store.ContinueNotPaused
	}
	switch {
	case m.state == store.InterruptTimedOut:
		return store.ContinueTimedOut
	case m.state == store.InterruptClosed:
		return store.ContinueClosed
	case m.state == store.InterruptAdopted, len(m.payloads) >= m.accepts:
		return store.ContinueAlready
	case m.expired:
		m.state = store.InterruptTimedOut // the late continue times it out
		return store.ContinueTimedOut
	}
	return store.ContinueOK
}

// TestInterruptRecordModel drives one run's interrupt record through random
// histories of opens, continues (some by a stale instance), reads, refusals,
// adoptions, closes, passing deadlines, lost locks and a finish, and checks
// every reply and every read against interruptModel. A failure prints its
// seed; GOREACTOR_MODEL_SEED replays one.
func TestInterruptRecordModel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GOREACTOR_MODEL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	histories := 60
	if testing.Short() {
		histories = 15
	}
	for h := range histories {
		rng := rand.New(rand.NewPCG(seed, uint64(h)))
		t.Run(fmt.Sprintf("history-%d", h), func(t *testing.T) {
			target := f.st.RunTarget(fmt.Sprintf("m%d", h))
			f.create(t, target, "tok", data1)
			m := &interruptModel{firstAt: map[string]bool{}}
			fail := func(step int, op string, args ...any) string {
				return fmt.Sprintf("seed %d history %d step %d: %s %v (model %+v)", seed, h, step, op, args, *m)
			}
			paths := []string{"approve", "book/approve"}
			pauses := 0
			for i := range 40 {
				switch op := rng.IntN(10); {
				case op == 0 && !m.finished: // open a new interrupt (or re-open the current one)
					path, inst := paths[rng.IntN(2)], pauses+1
					if m.state != "" && rng.IntN(3) == 0 {
						path, inst = m.path, m.inst // a resumed pause opens its own again
					} else {
						pauses++
					}
					accepts := 1 + rng.IntN(3)
					timeout := time.Duration(0)
					if rng.IntN(2) == 0 {
						timeout = time.Hour
					}
					_, _, err := f.st.OpenInterrupt(f.ctx, target, "tok", store.Interrupt{Path: path, Instance: inst}, accepts, timeout)
					require.NoError(t, err, fail(i, "open", path, inst))
					if m.state == "" || path != m.path || inst != m.inst {
						*m = interruptModel{path: path, inst: inst, accepts: accepts, state: store.InterruptWaiting,
							deadline: timeout > 0, firstAt: m.firstAt}
					}
				case op <= 4: // a continue, by the current instance, any, or a stale one
					path := paths[rng.IntN(2)]
					if m.state != "" && rng.IntN(4) > 0 {
						path = m.path
					}
					inst := 0
					switch rng.IntN(3) {
					case 1:
						inst = m.inst
					case 2:
						inst = max(1, m.inst-1)
					}
					body := fmt.Sprintf(`{"n":%d}`, i)
					rep, err := f.st.ContinueInterrupt(f.ctx, target, path, inst, []byte(body), "s", "", "")
					require.NoError(t, err, fail(i, "continue", path, inst))
					want := m.continueWant(path, inst)
					require.Equal(t, want, rep.Outcome, fail(i, "continue", path, inst))
					if want == store.ContinueOK {
						m.payloads = append(m.payloads, body)
						require.Equal(t, len(m.payloads), rep.Received, fail(i, "continue count"))
						require.Equal(t, m.accepts, rep.Accepts)
					}
				case op == 5 && m.state != "" && !m.finished: // the run reads (timing out if due)
					rec, err := f.st.ReadInterrupt(f.ctx, target, "tok", store.Interrupt{Path: m.path, Instance: m.inst})
					require.NoError(t, err, fail(i, "read"))
					if m.state == store.InterruptWaiting && len(m.payloads) < m.accepts && m.expired {
						m.state = store.InterruptTimedOut
					}
					require.Equal(t, m.state, rec.State, fail(i, "read state"))
					got := []string{}
					for _, p := range rec.Payloads {
						got = append(got, string(p.Data))
					}
					require.Equal(t, append([]string{}, m.payloads...), got, fail(i, "read payloads"))
					// Another interrupt than the one on record is refused.
					_, err = f.st.ReadInterrupt(f.ctx, target, "tok", store.Interrupt{Path: m.path, Instance: m.inst + 7})
					require.ErrorIs(t, err, store.ErrInterruptMoved, fail(i, "read moved"))
				case op == 6 && m.state == store.InterruptWaiting && len(m.payloads) > 0 && !m.finished: // refuse one
					k := 1 + rng.IntN(len(m.payloads))
					n, err := f.st.RefusePayload(f.ctx, target, "tok", store.Interrupt{Path: m.path, Instance: m.inst}, k, "bad")
					require.NoError(t, err, fail(i, "refuse", k))
					m.payloads = append(m.payloads[:k-1], m.payloads[k:]...)
					require.Equal(t, len(m.payloads), n, fail(i, "refuse count"))
				case op == 7 && m.state == store.InterruptWaiting && len(m.payloads) >= m.accepts && !m.finished: // adopt
					require.NoError(t, f.st.AdoptInterrupt(f.ctx, target, "tok", store.Interrupt{Path: m.path, Instance: m.inst}))
					m.state = store.InterruptAdopted
					m.firstAt[m.path] = true
				case op == 8 && m.state != "" && !m.finished: // close (a cancel), or time passing past the deadline
					if rng.IntN(2) == 0 {
						require.NoError(t, f.st.CloseInterrupt(f.ctx, target, "tok", store.Interrupt{Path: m.path, Instance: m.inst}))
						if m.state == store.InterruptWaiting {
							m.state = store.InterruptClosed
						}
					} else if m.deadline {
						require.NoError(t, f.rdb.HSet(f.ctx, target.State, "idl", 1).Err())
						m.expired = true
					}
				case op == 9: // a process that lost the lock is refused; rarely, the run finishes
					_, err := f.st.ReadInterrupt(f.ctx, target, "stale", store.Interrupt{Path: m.path, Instance: m.inst})
					require.ErrorIs(t, err, store.ErrLockNotHeld, fail(i, "stale read"))
					_, _, err = f.st.OpenInterrupt(f.ctx, target, "stale", store.Interrupt{Path: "x", Instance: 99}, 1, 0)
					require.ErrorIs(t, err, store.ErrLockNotHeld, fail(i, "stale open"))
					if rng.IntN(8) == 0 && !m.finished {
						require.NoError(t, f.rdb.HSet(f.ctx, target.State, "fin", "1").Err())
						m.finished = true
					}
				}
			}
		})
	}
}
