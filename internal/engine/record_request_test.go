package engine_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// RecordRequest appends an operator_request entry that Audit returns, on a
// stream that expires with the run; it refuses an unknown run, and a
// request without an action or a reason.
func TestRecordRequestAuditsWhoAskedAndWhy(t *testing.T) {
	t.Parallel()
	env := newEnv(t, func(c *engine.Config) { c.Retention = time.Hour })
	ctx := ctxTimeout(t)
	def := engine.MustDefine("recorded", engine.Step("x", engine.StepConfig[engine.Args, int]{
		Run: func(context.Context, engine.Args) (int, error) { return 1, nil }}))
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	req := engine.OperatorRequest{Action: "undo", Operator: "alice", Reason: "customer asked", TaskID: "ctl:1", Steps: []string{"x"}}
	require.NoError(t, env.engine.RecordRequest(ctx, res.RunID, req))
	entries, err := env.engine.Audit(ctx, res.RunID)
	require.NoError(t, err)
	last := entries[len(entries)-1]
	require.Equal(t, engine.AuditOperatorRequest, last.Kind)
	require.Equal(t, []string{"undo", "alice", "customer asked", "ctl:1", "x"}, []string{last.Request, last.Operator, last.Note, last.TaskID, last.Step})
	require.False(t, last.At.IsZero())

	k := env.prefix + ":{run:" + res.RunID + "}:"
	stateTTL, auditTTL := env.rdb.PTTL(ctx, k+"ctx").Val(), env.rdb.PTTL(ctx, k+"audit").Val()
	require.Greater(t, stateTTL, 50*time.Minute)
	require.InDelta(t, stateTTL.Seconds(), auditTTL.Seconds(), 5, "the stream expires with the run")

	require.ErrorIs(t, env.engine.RecordRequest(ctx, "recorded-nobody", req), engine.ErrNotFound)
	require.Zero(t, env.rdb.Exists(ctx, env.prefix+":{run:recorded-nobody}:audit").Val(), "nothing written for an unknown run")
	require.ErrorContains(t, env.engine.RecordRequest(ctx, res.RunID, engine.OperatorRequest{Action: "undo"}), "needs a reason")
	require.ErrorContains(t, env.engine.RecordRequest(ctx, res.RunID, engine.OperatorRequest{Reason: "r"}), "names no action")
	require.ErrorContains(t, env.engine.RecordRequest(ctx, res.RunID, engine.OperatorRequest{Action: "undo", Reason: strings.Repeat("x", 1001)}), "over 1000")
}
