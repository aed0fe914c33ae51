package engine

import "context"

// PollWait is Wait without pub/sub (what Wait did before it listened): the
// baseline of TestWaitLoad.
func PollWait(e *Engine, ctx context.Context, id string) (*Result, error) { return e.pollWait(ctx, id) }

// WaitConnections reports how many shared subscriber connections the
// engine's Waits hold open.
func WaitConnections(e *Engine) int { return e.store.Watcher().Connections() }
