package engine

import "context"

// SaveWithLedgerStatus stores run id again through the engine's fenced save
// path, its newest ledger entry's status set to s, so a test can check that
// a status outside the closed set is refused before anything is written.
func SaveWithLedgerStatus(ctx context.Context, e *Engine, id string, s RollbackStatus) error {
	target := e.store.RunTarget(id)
	lease, err := e.locks.TryAcquire(ctx, target.Lock)
	if err != nil {
		return err
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
	st, version, err := e.load(ctx, id)
	if err != nil {
		return err
	}
	st.Ledger[len(st.Ledger)-1].Status = s
	x := &execution{e: e, st: st, target: target, lease: lease, version: version, indexed: st.Status}
	return x.save(ctx, false)
}
