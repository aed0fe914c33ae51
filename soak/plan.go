package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/goreactor/goreactor/reactor"
)

// shape is an owner reactor's map: its batch size, atomic or partial.
type shape struct {
	Batch   int
	Partial bool
}

// shapes are the owner reactors every process registers.
var shapes = []shape{{20, false}, {35, false}, {50, false}, {20, true}, {35, true}, {50, true}}

func (s shape) name() string {
	mode := "atomic"
	if s.Partial {
		mode = "partial"
	}
	return fmt.Sprintf("soak.owner.b%d.%s", s.Batch, mode)
}

// runPlan is one owner run of the soak, fixed by the seed: the map's size
// and shape, which elements fail, whether the step after the map fails, and
// whether (and when) the run is cancelled.
type runPlan struct {
	ID    string
	Shape shape
	Size  int
	// Failing lists, sorted, the elements whose second step fails.
	Failing   []int
	FailAfter bool
	// CancelAfter is how long after its enqueue the run is cancelled; zero
	// for a run that is not.
	CancelAfter time.Duration
	// LaunchAt is when the run is enqueued, from the start of the soak.
	LaunchAt time.Duration
}

// Plan sizes.
const (
	minElements = 50
	maxElements = 400
)

// makePlans draws n runs from seed, launched evenly over window (jittered).
func makePlans(seed uint64, n int, window time.Duration) []runPlan {
	plans := make([]runPlan, n)
	gap := window / time.Duration(n)
	for k := range plans {
		rng := rand.New(rand.NewPCG(seed, uint64(k)))
		p := runPlan{
			ID:       fmt.Sprintf("soak-%03d", k),
			Shape:    shapes[rng.IntN(len(shapes))],
			Size:     minElements + rng.IntN(maxElements-minElements+1),
			LaunchAt: time.Duration(k)*gap + time.Duration(rng.Int64N(int64(gap))),
		}
		// Four runs in ten have no failing element; the others fail each
		// element with a small probability of their own.
		if rng.Float64() < 0.6 {
			rate := 0.002 + 0.018*rng.Float64()
			for i := range p.Size {
				if rng.Float64() < rate {
					p.Failing = append(p.Failing, i)
				}
			}
		}
		p.FailAfter = rng.Float64() < 0.3
		if rng.Float64() < 0.2 {
			p.CancelAfter = 200*time.Millisecond + time.Duration(rng.Int64N(int64(4*time.Second)))
		}
		plans[k] = p
	}
	return plans
}

// fails reports whether element i fails by plan.
func (p runPlan) fails(i int) bool {
	_, ok := slices.BinarySearch(p.Failing, i)
	return ok
}

// uncancelled is the status the run ends with if it is not cancelled: an
// atomic map with a failing element fails the run, so does the step after
// the map; anything else completes.
func (p runPlan) uncancelled() reactor.Status {
	if (len(p.Failing) > 0 && !p.Shape.Partial) || p.FailAfter {
		return reactor.StatusFailed
	}
	return reactor.StatusCompleted
}

// items are the map's items, as the owner's input.
func (p runPlan) items() []item {
	out := make([]item, p.Size)
	for i := range out {
		out[i] = item{Owner: p.ID, Index: i, Fail: p.fails(i)}
	}
	return out
}

func (p runPlan) inputs() map[string]any {
	return map[string]any{"owner": p.ID, "items": p.items(), "fail_after": p.FailAfter}
}
