package sweeper_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

// RecoverRun wakes a live run whose task was lost at once, whatever its
// age (StaleAfter is an hour here); asked again it enqueues nothing, since
// the wake-up is queued; a finished or unknown run is ErrNotLive, and so is
// a map element's id.
func TestRecoverRunWakesOneRunNow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	sw, err := sweeper.New(sweeper.Config{Engine: e.engine, StaleAfter: time.Hour, Logger: discard})
	require.NoError(t, err)
	tr := &trail{}
	def := reactor.MustDefine("recover_one", step(tr, "a", nil))
	_, err = e.engine.Enqueue(ctx, def, nil, reactor.WithRunID("r1"))
	require.NoError(t, err)
	require.NoError(t, e.insp.DeleteTask(e.queue, "resume:r1:start"))

	rec, err := sw.RecoverRun(ctx, "r1")
	require.NoError(t, err)
	require.True(t, rec.Woken)
	require.Equal(t, 1, rec.Recovered())
	rec, err = sw.RecoverRun(ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, 0, rec.Recovered(), "its wake-up is queued: nothing more")

	require.NoError(t, e.engine.Register(def))
	e.startWorker()
	run, err := e.engine.Wait(ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, run.Status)
	_, err = sw.RecoverRun(ctx, "r1")
	require.ErrorIs(t, err, sweeper.ErrNotLive)
	_, err = sw.RecoverRun(ctx, "nobody")
	require.ErrorIs(t, err, sweeper.ErrNotLive)
	_, err = sw.RecoverRun(ctx, "r1~items.3")
	require.ErrorIs(t, err, sweeper.ErrNotLive)
}
