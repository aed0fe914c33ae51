package engine

import "time"

// Backoff computes the delay before retry attempt n (n = 1 before the second
// attempt).
type Backoff interface {
	Delay(n int) time.Duration
}

// BackoffFunc adapts a function to Backoff.
type BackoffFunc func(n int) time.Duration

// Delay calls f.
func (f BackoffFunc) Delay(n int) time.Duration { return f(n) }

// Fixed waits d before every retry.
func Fixed(d time.Duration) Backoff {
	return BackoffFunc(func(int) time.Duration { return d })
}

// Linear waits step, 2*step, 3*step... capped at max (no cap when max <= 0).
func Linear(step, max time.Duration) Backoff {
	return BackoffFunc(func(n int) time.Duration {
		return capDelay(time.Duration(n)*step, max)
	})
}

// Exponential waits base, 2*base, 4*base... capped at max (no cap when
// max <= 0).
func Exponential(base, max time.Duration) Backoff {
	return BackoffFunc(func(n int) time.Duration {
		if n > 62 {
			n = 62
		}
		d := base << (n - 1)
		if d <= 0 { // overflow
			d = max
		}
		return capDelay(d, max)
	})
}

func capDelay(d, max time.Duration) time.Duration {
	if max > 0 && d > max {
		return max
	}
	return d
}

// Retry is a step's retry policy. The zero value runs a step once.
type Retry struct {
	// MaxAttempts is the total number of attempts, first included.
	// Default 1 (no retry).
	MaxAttempts int
	// Backoff spaces the attempts. Default: no wait.
	Backoff Backoff
}

func (r Retry) attempts() int {
	if r.MaxAttempts < 1 {
		return 1
	}
	return r.MaxAttempts
}

func (r Retry) delay(n int) time.Duration {
	if r.Backoff == nil {
		return 0
	}
	return r.Backoff.Delay(n)
}
