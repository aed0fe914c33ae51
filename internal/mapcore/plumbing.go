package mapcore

import (
	"context"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/maptask"
)

// The entry points of fan-out maps for goreactor's own packages: worker
// delivers element and rollback tasks here, the sweepers recover maps and
// ask about owners through them. Package mapstep re-exports everything
// exported in this package except the files named plumbing*.go.

// ProcessElement runs one element task of a fan-out map.
func ProcessElement(ctx context.Context, e *engine.Engine, t maptask.ElementTask) error {
	return processElement(ctx, e, t)
}

// ProcessRollback runs one element rollback job of a map's rollback.
func ProcessRollback(ctx context.Context, e *engine.Engine, t maptask.RollbackTask) error {
	return processRollback(ctx, e, t)
}

// RecoverMap re-dispatches what map mapID lost: tasks, claims, the owner's resume.
func RecoverMap(ctx context.Context, e *engine.Engine, mapID string, opt maptask.SweepOptions) (maptask.Recovery, error) {
	return recoverMap(ctx, e, mapID, opt)
}

// Awaiting reports whether run runID waits for a map, and the resumes owed to it.
func Awaiting(ctx context.Context, e *engine.Engine, runID string) (waiting bool, resumes []string, err error) {
	return awaiting(ctx, e, runID)
}
