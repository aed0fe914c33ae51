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

// stepModel is the reference a step task's record is checked against: its
// outcome, stop, the attempt whose task may run, the lease (its holder and
// whether it is live) and the counts of attempts begun and of holders that
// died holding it.
type stepModel struct {
	out         string
	stop        bool
	next        int
	holder      string
	live        bool
	tries, dead int
}

func (m *stepModel) begin(n int, h string, alive bool) store.StepVerdict {
	switch {
	case m.out != "":
		return store.StepVerdict{State: store.StepTaskSettled}
	case m.stop:
		return store.StepVerdict{State: store.StepTaskStop}
	case n != m.next:
		return store.StepVerdict{State: store.StepTaskStale, Next: m.next}
	case m.holder != "" && m.holder != h && m.live:
		return store.StepVerdict{State: store.StepTaskBusy}
	}
	if m.holder != "" && m.holder != h {
		m.dead++
	}
	m.holder, m.live = h, alive
	m.tries++
	return store.StepVerdict{State: store.StepTaskOK, Tries: m.tries, Dead: m.dead}
}

// release is settle's and retry's check: the holder's own lease, or none
// live for "".
func (m *stepModel) release(h string) (string, bool) {
	switch {
	case m.out != "":
		return store.StepTaskSettled, false
	case h == "" && m.holder != "" && m.live:
		return store.StepTaskBusy, false
	case h != "" && m.holder != h:
		return store.StepTaskLost, false
	}
	m.holder, m.live = "", false
	return store.StepTaskOK, true
}

func (m *stepModel) stopStep() string {
	m.stop = true
	switch {
	case m.out != "":
		return store.StepTaskSettled
	case m.holder != "" && m.live:
		return store.StepTaskRunning
	case m.holder != "":
		return store.StepTaskDead
	}
	return store.StepTaskIdle
}

func (m *stepModel) lease() string {
	switch {
	case m.holder == "":
		return "none"
	case m.live:
		return "live"
	}
	return "dead"
}

// TestStepTaskRecordModel drives one step task's record through random
// histories of attempts begun by three holders (some dying: a lease that
// has already lapsed), renewals, settles, retries, stops and looks, and
// checks every verdict and the record after every operation against
// stepModel. The invariants it holds the script to: one live holder at a
// time, the first outcome wins, no attempt begins after a stop, a task of
// another attempt than the current is refused, a holder that lost its
// lease writes nothing.
func TestStepTaskRecordModel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GOREACTOR_MODEL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	histories := 80
	if testing.Short() {
		histories = 20
	}
	holders := []string{"h1", "h2", "h3"}
	lease := func(alive bool) time.Duration {
		if alive {
			return time.Hour
		}
		return -time.Millisecond // lapsed at once: its holder died
	}
	for h := range histories {
		rng := rand.New(rand.NewPCG(seed, uint64(h)))
		t.Run(fmt.Sprintf("history-%d", h), func(t *testing.T) {
			ref := store.StepTask{Owner: fmt.Sprintf("st%d", h), Token: "tok"}
			require.NoError(t, f.st.StartStepTask(f.ctx, ref, "label", []byte("args")))
			m := &stepModel{next: 1}
			fail := func(step int, op string, args ...any) string {
				return fmt.Sprintf("seed %d history %d step %d: %s %v (model %+v)", seed, h, step, op, args, *m)
			}
			outs := 0
			for i := range 40 {
				holder := holders[rng.IntN(len(holders))]
				switch op := rng.IntN(12); {
				case op < 4:
					n := m.next + rng.IntN(3) - 1
					alive := rng.IntN(4) != 0
					got, err := f.st.BeginStepAttempt(f.ctx, ref, n, holder, lease(alive))
					require.NoError(t, err)
					want := m.begin(n, holder, alive)
					got.Left = 0
					require.Equal(t, want, got, fail(i, "begin", n, holder, alive))
				case op < 6:
					alive := rng.IntN(4) != 0
					got, err := f.st.RenewStepLease(f.ctx, ref, holder, lease(alive))
					require.NoError(t, err)
					want := store.StepVerdict{State: store.StepTaskLost}
					if m.holder == holder {
						m.live = alive
						want = store.StepVerdict{State: store.StepTaskOK, Stop: m.stop}
					}
					require.Equal(t, want, got, fail(i, "renew", holder, alive))
				case op < 8:
					if rng.IntN(3) == 0 {
						holder = ""
					}
					outs++
					out := fmt.Sprintf("out-%d", outs)
					got, err := f.st.SettleStep(f.ctx, ref, holder, []byte(out))
					require.NoError(t, err)
					state, ok := m.release(holder)
					if ok {
						m.out = out
					}
					require.Equal(t, state, got.State, fail(i, "settle", holder))
				case op < 9:
					got, err := f.st.RetryStep(f.ctx, ref, holder, m.next+1)
					require.NoError(t, err)
					next := m.next + 1
					state, ok := m.release(holder)
					if ok {
						m.next = next
					}
					require.Equal(t, state, got.State, fail(i, "retry", holder))
				case op < 10:
					got, err := f.st.StopStep(f.ctx, ref)
					require.NoError(t, err)
					require.Equal(t, m.stopStep(), got.State, fail(i, "stop"))
				}
				look, err := f.st.LookStep(f.ctx, ref)
				require.NoError(t, err)
				require.Equal(t, m.out, string(look.Outcome), fail(i, "look: outcome"))
				require.Equal(t, m.next, look.Next, fail(i, "look: next"))
				require.Equal(t, m.tries, look.Tries, fail(i, "look: tries"))
				require.Equal(t, m.lease(), look.Lease, fail(i, "look: lease"))
				require.Equal(t, m.stop, look.Stopped, fail(i, "look: stop"))
			}
		})
	}
}
