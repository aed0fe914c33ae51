package reactor

import (
	"context"
	"time"
)

// SetSleep replaces the engine's backoff wait, so tests can record delays
// instead of waiting them out.
func SetSleep(e *Engine, f func(ctx context.Context, d time.Duration) error) { e.sleep = f }
