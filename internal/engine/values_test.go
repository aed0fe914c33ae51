package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/fingerprint"
	"github.com/goreactor/goreactor/internal/engine"
)

// formatted is fingerprint.Format of v's encoding: what a report shows.
func formatted(t *testing.T, v any) string {
	t.Helper()
	enc, err := fingerprint.Encode(v)
	require.NoError(t, err)
	s, err := fingerprint.Format(enc)
	require.NoError(t, err)
	return s
}

// hashGuard guards a record kept as a Redis hash: Probe reads it whole,
// Restore writes before back whole.
func hashGuard(rdb redis.UniversalClient) *engine.Guard {
	return engine.Guarded(engine.GuardConfig[map[string]string]{
		Probe: func(ctx context.Context, key string) (map[string]string, error) {
			return rdb.HGetAll(ctx, key).Result()
		},
		Restore: func(ctx context.Context, key string, before, _ map[string]string) (engine.RestoreResult, error) {
			_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, key)
				if len(before) > 0 {
					p.HSet(ctx, key, before)
				}
				return nil
			})
			return engine.RestoreWritten, err
		},
	})
}

// valuesDef: update changes the record at key (guarded), tag sets tagKey
// (guarded, undone cleanly), and support changes the record behind the
// run's back, then fails. opts are the options of its one input.
func valuesDef(env *env, kv *kvStore, name, key, tagKey string, opts ...engine.InputOption) *engine.Definition {
	rdb := env.rdb
	return engine.MustDefine(name,
		engine.Input[string]("card", opts...),
		engine.Step("update", engine.StepConfig[engine.Args, string]{
			Guard: hashGuard(rdb),
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				before, err := rdb.HGetAll(ctx, key).Result()
				if err != nil {
					return "", err
				}
				after := map[string]string{"email": "ada@new.test", "plan": "gold"}
				if err := rdb.HSet(ctx, key, after).Err(); err != nil {
					return "", err
				}
				return "ok", engine.RecordEffect(ctx, engine.Effect{Resource: key, Before: before, After: after, Label: "upgrade"})
			},
		}),
		kv.setStep("tag", tagKey, "vip", kv.guard(engine.Retry{}), "update"),
		engine.Step("support", engine.StepConfig[engine.Args, string]{
			After: []string{"tag"},
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				if err := rdb.HSet(ctx, key, "email", "ada@corrected.test").Err(); err != nil {
					return "", err
				}
				return "", engine.Permanent(errors.New("downstream refused"))
			},
		}))
}

// A conflict's report carries the three states as a person reads them,
// beside their fingerprints: the entries, the action items and the text.
// A guarded entry undone cleanly carries its values too, and a resolved
// conflict keeps them.
func TestGuardedConflictReportShowsValues(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	kv := newKV(env)
	key, tagKey := env.prefix+":user:42", env.prefix+":user:42/tag"
	before := map[string]string{"email": "ada@old.test", "plan": "free"}
	require.NoError(t, env.rdb.HSet(ctx, key, before).Err())
	def := valuesDef(env, kv, "values", key, tagKey)
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)

	after := map[string]string{"email": "ada@new.test", "plan": "gold"}
	observed := map[string]string{"email": "ada@corrected.test", "plan": "gold"}
	rep, err := env.engine.RollbackReport(ctx, res.RunID)
	require.NoError(t, err)
	require.False(t, rep.Sensitive)
	require.Len(t, rep.ActionRequired, 1)
	item := rep.ActionRequired[0]
	require.Equal(t, formatted(t, after), item.ExpectedValue)
	require.Equal(t, formatted(t, observed), item.ObservedValue)
	require.Equal(t, formatted(t, before), item.RestoreToValue)
	require.Contains(t, item.ObservedValue, `"email": "ada@corrected.test"`)
	fp, _ := fingerprint.Of(observed)
	require.Equal(t, fp, item.Observed)

	byStep := map[string]engine.RollbackEntry{}
	for _, e := range rep.Entries {
		byStep[e.Step] = e
	}
	up := byStep["update"]
	require.Equal(t, engine.RollbackNeedsPerson, up.Status)
	require.Equal(t, [3]string{item.ExpectedValue, item.ObservedValue, item.RestoreToValue},
		[3]string{up.ExpectedValue, up.ObservedValue, up.RestoreToValue})
	tag := byStep["tag"]
	require.Equal(t, engine.RollbackCompensated, tag.Status)
	require.Equal(t, `"vip"`, tag.ExpectedValue)
	require.Equal(t, `"vip"`, tag.ObservedValue, "the undo read the state the step left")
	require.Equal(t, `""`, tag.RestoreToValue)

	text := engine.FormatActionRequired(rep)
	for _, v := range []string{item.ExpectedValue, item.ObservedValue, item.RestoreToValue} {
		for line := range strings.SplitSeq(v, "\n") {
			require.Contains(t, text, "\n              "+line+"\n", "each line of each value, under its fingerprint:\n%s", text)
		}
	}
	require.Contains(t, text, "  observed:   "+item.Observed+"\n              {\n")

	// Resolved, the entry's report still says what the states were.
	require.NoError(t, env.rdb.HSet(ctx, key, before).Err())
	require.NoError(t, env.engine.Resolve(ctx, res.RunID, item.ID, engine.ResolvedManuallyReverted, "put the old record back"))
	rep, err = env.engine.RollbackReport(ctx, res.RunID)
	require.NoError(t, err)
	require.Empty(t, rep.ActionRequired)
	for _, e := range rep.Entries {
		if e.Step == "update" {
			require.Equal(t, engine.RollbackManuallyReverted, e.Status)
			require.Equal(t, item.ObservedValue, e.ObservedValue)
			require.Equal(t, item.RestoreToValue, e.RestoreToValue)
		}
	}
}

// Sensitive marks the run; the engine's report still carries the values
// (its caller is trusted), Redacted hides them and keeps the fingerprints.
func TestSensitiveRunReportRedacted(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	kv := newKV(env)
	key, tagKey := env.prefix+":user:7", env.prefix+":user:7/tag"
	require.NoError(t, env.rdb.HSet(ctx, key, "email", "ada@old.test").Err())
	def := valuesDef(env, kv, "values-sensitive", key, tagKey, engine.Sensitive())
	res, err := env.engine.Run(ctx, def, map[string]any{"card": "4111 1111 1111 1111"})
	require.NoError(t, err)
	run, err := env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.True(t, run.Sensitive)

	rep, err := env.engine.RollbackReport(ctx, res.RunID)
	require.NoError(t, err)
	require.True(t, rep.Sensitive)
	require.False(t, rep.ValuesRedacted)
	require.Len(t, rep.ActionRequired, 1)
	item := rep.ActionRequired[0]
	require.Contains(t, item.ObservedValue, "ada@corrected.test")

	red := rep.Redacted()
	require.True(t, red.ValuesRedacted)
	ri := red.ActionRequired[0]
	require.Equal(t, engine.RedactedValue, ri.ExpectedValue)
	require.Equal(t, engine.RedactedValue, ri.ObservedValue)
	require.Equal(t, engine.RedactedValue, ri.RestoreToValue)
	require.Equal(t, [3]string{item.Expected, item.Observed, item.RestoreTo}, [3]string{ri.Expected, ri.Observed, ri.RestoreTo},
		"the fingerprints stay")
	for _, e := range red.Entries {
		for _, v := range []string{e.ExpectedValue, e.ObservedValue, e.RestoreToValue} {
			require.Contains(t, []string{"", engine.RedactedValue}, v)
		}
	}
	require.Contains(t, rep.ActionRequired[0].ObservedValue, "ada@corrected.test", "the report itself is unchanged")
	text := engine.FormatActionRequired(red)
	require.NotContains(t, text, "ada@")
	require.Contains(t, text, engine.RedactedValue)
	require.Contains(t, text, item.Observed)
}

// A run is sensitive when its definition, or one it composes or maps over,
// declares a Sensitive input; an *InputError about a sensitive input names
// the kind of value, never the value.
func TestSensitiveInputMarksRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	noop := func(name string) engine.Part {
		return engine.Step(name, engine.StepConfig[engine.Args, string]{
			Run: func(context.Context, engine.Args) (string, error) { return "ok", nil },
		})
	}
	plain := engine.MustDefine("sens-plain", engine.Input[string]("name"), noop("a"))
	secret := engine.MustDefine("sens-secret", engine.Input[string]("name"), engine.Input[int]("pin", engine.Sensitive()), noop("a"))
	parent := engine.MustDefine("sens-parent", noop("a"),
		engine.Compose("child", secret, engine.ComposeConfig{Args: engine.Bindings{"pin": engine.Const(1234)}}))
	for _, c := range []struct {
		def    *engine.Definition
		inputs map[string]any
		want   bool
	}{
		{plain, map[string]any{"name": "x"}, false},
		{secret, map[string]any{"pin": 1234}, true},
		{parent, nil, true},
	} {
		res, err := env.engine.Run(ctx, c.def, c.inputs)
		require.NoError(t, err, c.def.Name())
		require.Equal(t, engine.StatusCompleted, res.Status, c.def.Name())
		run, err := env.engine.Get(ctx, res.RunID)
		require.NoError(t, err)
		require.Equal(t, c.want, run.Sensitive, c.def.Name())
	}

	_, err := env.engine.Run(ctx, secret, map[string]any{"pin": "pin 9876"})
	var ie *engine.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "pin", ie.Input)
	require.NotContains(t, err.Error(), "9876")
	require.Contains(t, err.Error(), "want int, got string (value not shown: sensitive input)")
	_, err = env.engine.Run(ctx, plain, map[string]any{"name": 42})
	require.ErrorAs(t, err, &ie)
	require.Contains(t, err.Error(), "42", "a plain input's error still quotes the value")
}
