package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

type vote struct {
	Yes bool `json:"yes"`
}

func TestInterruptDefinitionErrors(t *testing.T) {
	cases := map[string]engine.InterruptConfig[engine.Args, vote]{
		"Accepts is -1":            {Accepts: -1},
		"Timeout is negative":      {Timeout: -time.Second},
		"interrupt has no Timeout": {Default: func(engine.Args) (vote, error) { return vote{}, nil }},
		"over 1000":                {Accepts: 1001},
	}
	for want, cfg := range cases {
		_, err := engine.Define("bad", engine.Interrupt("ask", cfg))
		var de *engine.DefinitionError
		require.ErrorAs(t, err, &de, want)
		assert.Contains(t, err.Error(), want)
		assert.Equal(t, "ask", de.Step)
	}
	// A binding to a field In does not have is refused as for any step.
	type in struct{ Order string }
	_, err := engine.Define("bad",
		engine.Input[string]("order"),
		engine.Interrupt("ask", engine.InterruptConfig[in, vote]{Args: engine.Bindings{"nope": engine.FromInput("order")}}))
	require.Error(t, err)
	// The payload type is the step's result type: a FromStep path into it
	// is checked at Define.
	_, err = engine.Define("bad",
		engine.Interrupt("ask", engine.InterruptConfig[engine.Args, vote]{}),
		engine.Returns(engine.FromStep("ask", "no_such_field")))
	require.Error(t, err)
	_, err = engine.Define("good",
		engine.Interrupt("ask", engine.InterruptConfig[engine.Args, vote]{}),
		engine.Returns(engine.FromStep("ask", "yes")))
	require.NoError(t, err)
}

// In-process, without an Enqueuer: Run returns the paused run with NoWait;
// Continue records the payload and wakes nothing; Resume goes on here.
func TestInterruptInProcessWithoutAnEnqueuer(t *testing.T) {
	ev := newEnv(t)
	ctx := ctxTimeout(t)
	def := engine.MustDefine("ask",
		simple(ev.trail, "before", nil),
		engine.Interrupt("ask", engine.InterruptConfig[engine.Args, vote]{After: []string{"before"},
			Validate: func(v vote) error {
				if !v.Yes {
					return errors.New("only yes counts")
				}
				return nil
			}}),
		engine.Returns(engine.FromStep("ask", "yes")),
	)
	require.NoError(t, ev.engine.Register(def))
	res, err := ev.engine.Run(ctx, def, nil, engine.NoWait())
	require.NoError(t, err)
	require.Equal(t, engine.OutcomePaused, res.Outcome())
	require.Equal(t, engine.StatusPaused, res.Status)

	_, err = ev.engine.Continue(ctx, res.RunID, "ask", vote{Yes: false})
	var pe *engine.PayloadError
	require.ErrorAs(t, err, &pe)
	c, err := ev.engine.Continue(ctx, res.RunID, "ask", vote{Yes: true})
	require.NoError(t, err)
	assert.False(t, c.Woken, "no Enqueuer: nothing to wake")
	assert.True(t, c.Checked)

	final, err := ev.engine.Resume(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, final.Status, "%v", final.Err())
	yes, err := engine.ValueOf[bool](final)
	require.NoError(t, err)
	assert.True(t, yes)
	assert.Equal(t, []string{"run:before"}, ev.trail.all())

	// Resuming a paused run that has no payload yet pauses it again and
	// writes nothing.
	res, err = ev.engine.Run(ctx, def, nil, engine.NoWait())
	require.NoError(t, err)
	before, err := ev.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	again, err := ev.engine.Resume(ctx, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, engine.StatusPaused, again.Status)
	after, err := ev.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, before.Version, after.Version)
	require.NoError(t, ev.engine.Cancel(ctx, res.RunID))
	final, err = ev.engine.Wait(ctx, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, engine.StatusCancelled, final.Status)
	assert.Equal(t, []string{"run:before", "run:before", "undo:before"}, ev.trail.all())
}

func TestStepLimitsListsDeclaredLimits(t *testing.T) {
	post := engine.Step("post", engine.StepConfig[engine.Args, int]{
		Limits: []engine.Limit{engine.Lock("ledger", nil), {Name: "api", Rates: []engine.Rate{{N: 10, Per: time.Second}}}},
		Run:    func(context.Context, engine.Args) (int, error) { return 0, nil },
	})
	child := engine.MustDefine("child", post)
	parent := engine.MustDefine("parent", engine.Compose("book", child, engine.ComposeConfig{}),
		engine.Step("free", engine.StepConfig[engine.Args, int]{Run: func(context.Context, engine.Args) (int, error) { return 0, nil }}))
	got := parent.StepLimits()
	require.Len(t, got, 1)
	assert.Equal(t, "book/post", got[0].Step)
	require.Len(t, got[0].Limits, 2)
	assert.Equal(t, "ledger", got[0].Limits[0].Name)
	assert.Equal(t, 1, got[0].Limits[0].Concurrency)
}
