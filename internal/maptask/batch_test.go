package maptask_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goreactor/goreactor/internal/maptask"
)

// All has MaxInFlight enqueues in flight at once, never more, calls every
// one, and joins their errors.
func TestAllBoundsTheEnqueuesInFlight(t *testing.T) {
	const n = 50
	var (
		inFlight, peak atomic.Int32
		calls          atomic.Int32
		full           = make(chan struct{})
		fullOnce       sync.Once
	)
	errOdd := errors.New("odd")
	err := maptask.All(context.Background(), make([]int, n), func(ctx context.Context, _ int) error {
		k := calls.Add(1)
		cur := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			old := peak.Load()
			if cur <= old || peak.CompareAndSwap(old, cur) {
				break
			}
		}
		if cur == maptask.MaxInFlight {
			fullOnce.Do(func() { close(full) })
		}
		if k <= maptask.MaxInFlight {
			// The first MaxInFlight calls wait until all of them are in
			// flight together: sequential sends would never get there.
			select {
			case <-full:
			case <-time.After(10 * time.Second):
				return errors.New("the first enqueues were never in flight together")
			}
		}
		if k%2 == 1 {
			return errOdd
		}
		return nil
	})
	if got := calls.Load(); got != n {
		t.Fatalf("%d calls, want %d", got, n)
	}
	if p := peak.Load(); p != maptask.MaxInFlight {
		t.Fatalf("peak %d in flight, want %d", p, maptask.MaxInFlight)
	}
	if !errors.Is(err, errOdd) {
		t.Fatalf("err = %v, want the calls' errors joined", err)
	}
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		if !errors.Is(e, errOdd) {
			t.Fatalf("unexpected error %v", e)
		}
	}
	if got := len(err.(interface{ Unwrap() []error }).Unwrap()); got != n/2 {
		t.Fatalf("%d errors joined, want %d", got, n/2)
	}
}
