package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/fingerprint"
	"github.com/goreactor/goreactor/internal/engine"
)

// kvStore is the outside system guarded steps change: plain Redis strings,
// with counters of the guard's calls.
type kvStore struct {
	rdb              redis.UniversalClient
	probes, restores atomic.Int32
	// probeFail makes the next probes fail transiently.
	probeFail atomic.Int32
	// silent makes Restore return without writing.
	silent atomic.Bool
}

var casScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end return 0`)

// casRestore is a Restore of a store that compares and writes atomically:
// key goes back to before only if it still holds after.
func casRestore(ctx context.Context, rdb redis.UniversalClient, key, before, after string) (engine.RestoreResult, error) {
	ok, err := casScript.Run(ctx, rdb, []string{key}, after, before).Int()
	if err != nil {
		return "", err
	}
	if ok == 0 {
		return engine.RestorePreconditionFailed, nil
	}
	return engine.RestoreApplied, nil
}

func (s *kvStore) get(ctx context.Context, key string) string {
	v, err := s.rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		panic(err)
	}
	return v
}

// guard restores a key to its before value; with cas, only from after.
func (s *kvStore) guard(retry engine.Retry) *engine.Guard {
	return engine.Guarded(engine.GuardConfig[string]{
		Probe: func(ctx context.Context, key string) (string, error) {
			s.probes.Add(1)
			if s.probeFail.Add(-1) >= 0 {
				return "", engine.Transient(errors.New("connection reset"))
			}
			return s.get(ctx, key), nil
		},
		Restore: func(ctx context.Context, key, before, _ string) (engine.RestoreResult, error) {
			s.restores.Add(1)
			if s.silent.Load() {
				return engine.RestoreWritten, nil
			}
			return engine.RestoreWritten, s.rdb.Set(ctx, key, before, 0).Err()
		},
		Retry: retry,
	})
}

// setStep sets key to value and records the effect.
func (s *kvStore) setStep(name, key, value string, g *engine.Guard, after ...string) engine.Part {
	return engine.Step(name, engine.StepConfig[engine.Args, string]{
		After: after,
		Guard: g,
		Run: func(ctx context.Context, _ engine.Args) (string, error) {
			before := s.get(ctx, key)
			if err := s.rdb.Set(ctx, key, value, 0).Err(); err != nil {
				return "", err
			}
			return value, engine.RecordEffect(ctx, engine.Effect{Resource: key, Before: before, After: value, Label: name})
		},
	})
}

func newKV(env *env) *kvStore { return &kvStore{rdb: env.rdb} }

// The clobber scenario: forward changes a record twice, somebody else
// changes it again, and the run fails. The rollback writes nothing: the
// newest entry needs a person, the older one is blocked without an attempt,
// and stays blocked in a later rollback; manually_reverted unblocks it.
func TestGuardedUndoNeverClobbersAConcurrentWrite(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	kv := newKV(env)
	for _, resolution := range []engine.Resolution{engine.ResolvedManuallyReverted, engine.ResolvedLeftApplied} {
		t.Run(string(resolution), func(t *testing.T) {
			key := env.prefix + ":user:42/email:" + string(resolution)
			require.NoError(t, env.rdb.Set(ctx, key, "ada@old.test", 0).Err())
			g := kv.guard(engine.Retry{})
			support := engine.Step("support", engine.StepConfig[engine.Args, string]{
				After: []string{"fix2"},
				Run: func(ctx context.Context, _ engine.Args) (string, error) {
					// The support desk corrects the address meanwhile,
					// then the run fails.
					require.NoError(t, env.rdb.Set(ctx, key, "ada@corrected.test", 0).Err())
					return "", engine.Permanent(errors.New("downstream refused"))
				},
			})
			def := engine.MustDefine("clobber-"+string(resolution), kv.setStep("fix1", key, "ada@new.test", g),
				kv.setStep("fix2", key, "ada@newer.test", g, "fix1"), support)
			require.NoError(t, env.engine.Register(def))
			restores := kv.restores.Load()
			res, err := env.engine.Run(ctx, def, nil)
			require.NoError(t, err)
			require.Equal(t, engine.StatusFailed, res.Status)
			require.Equal(t, "ada@corrected.test", kv.get(ctx, key), "the rollback left the concurrent write alone")
			require.Equal(t, restores, kv.restores.Load(), "Restore was never called")

			rep, err := env.engine.RollbackReport(ctx, res.RunID)
			require.NoError(t, err)
			require.Equal(t, engine.RollbackNeedsHuman, rep.Summary.Outcome)
			byStep := map[string]engine.RollbackEntry{}
			for _, e := range rep.Entries {
				byStep[e.Step] = e
			}
			require.Equal(t, engine.RollbackNeedsPerson, byStep["fix2"].Status)
			require.Equal(t, engine.RollbackBlocked, byStep["fix1"].Status)
			require.Zero(t, byStep["fix1"].Attempts, "blocked: never attempted")
			require.Equal(t, byStep["fix2"].ID, byStep["fix1"].BlockedBy)
			require.Len(t, rep.ActionRequired, 1)
			item := rep.ActionRequired[0]
			newer, _ := fingerprint.Of("ada@newer.test")
			corrected, _ := fingerprint.Of("ada@corrected.test")
			restoreTo, _ := fingerprint.Of("ada@new.test")
			require.Equal(t, newer, item.Expected)
			require.Equal(t, corrected, item.Observed)
			require.Equal(t, restoreTo, item.RestoreTo)
			require.Equal(t, []string{byStep["fix1"].ID}, item.Blocked)
			text := engine.FormatActionRequired(rep)
			require.Contains(t, text, item.ID)
			require.Contains(t, text, corrected)
			require.Contains(t, text, key)
			ttl, err := env.rdb.PTTL(ctx, env.prefix+":{run:"+res.RunID+"}:ctx").Result()
			require.NoError(t, err)
			require.Equal(t, time.Duration(-1), ttl, "a run a person must resolve never expires")
			waiting, err := env.engine.NeedsHuman(ctx, 100)
			require.NoError(t, err)
			require.Contains(t, waiting, res.RunID)
			kinds := auditKinds(t, env, res.RunID)
			require.Contains(t, kinds, "conflict:fix2")
			require.Contains(t, kinds, "blocked:fix1")

			// A later rollback still refuses them: the conflicted entry
			// is not attempted again, the blocked one stays blocked.
			probes := kv.probes.Load()
			again, err := env.engine.RetryRollback(ctx, res.RunID)
			require.NoError(t, err)
			require.Equal(t, probes, kv.probes.Load(), "nothing was probed")
			require.Equal(t, restores, kv.restores.Load())
			// The conflict still waits (the new generation does not forget
			// it) and the older entry is blocked again.
			require.Equal(t, []string{engine.ReasonConflict, engine.ReasonBlocked}, failureReasons(again.Failure))
			require.Equal(t, "ada@corrected.test", kv.get(ctx, key))

			require.ErrorIs(t, env.engine.Resolve(ctx, res.RunID, item.ID, resolution, "  "), engine.ErrEmptyNote)
			require.ErrorIs(t, env.engine.Resolve(ctx, res.RunID, "nope#9", resolution, "x"), engine.ErrNoSuchConflict)
			if resolution == engine.ResolvedManuallyReverted {
				// The person puts the address back to fix2's before state.
				require.NoError(t, env.rdb.Set(ctx, key, "ada@new.test", 0).Err())
			}
			require.NoError(t, env.engine.Resolve(ctx, res.RunID, item.ID, resolution, "checked with the support desk"))
			require.ErrorIs(t, env.engine.Resolve(ctx, res.RunID, item.ID, resolution, "again"), engine.ErrAlreadyResolved)
			ttl, err = env.rdb.PTTL(ctx, env.prefix+":{run:"+res.RunID+"}:ctx").Result()
			require.NoError(t, err)
			require.Greater(t, ttl, time.Duration(0), "resolved: the retention applies again")
			waiting, err = env.engine.NeedsHuman(ctx, 100)
			require.NoError(t, err)
			require.NotContains(t, waiting, res.RunID)

			final, err := env.engine.RetryRollback(ctx, res.RunID)
			rep, rerr := env.engine.RollbackReport(ctx, res.RunID)
			require.NoError(t, rerr)
			byStep = map[string]engine.RollbackEntry{}
			for _, e := range rep.Entries {
				byStep[e.Step] = e
			}
			require.Empty(t, rep.ActionRequired)
			if resolution == engine.ResolvedManuallyReverted {
				require.NoError(t, err)
				require.Empty(t, final.Failure.RollbackFailures)
				require.Equal(t, "ada@old.test", kv.get(ctx, key), "unblocked: fix1 restored")
				require.Equal(t, restores+1, kv.restores.Load())
				require.Equal(t, engine.RollbackCompensated, byStep["fix1"].Status)
				require.Equal(t, engine.RollbackManuallyReverted, byStep["fix2"].Status)
				require.Equal(t, engine.RollbackReverted, rep.Summary.Outcome)
			} else {
				require.ErrorIs(t, err, engine.ErrNothingToRetry, "left applied: fix1 stays for good")
				require.Equal(t, "ada@corrected.test", kv.get(ctx, key))
				require.Equal(t, restores, kv.restores.Load())
				require.Equal(t, engine.RollbackLeftApplied, byStep["fix1"].Status)
				require.Equal(t, engine.RollbackLeftApplied, byStep["fix2"].Status)
				require.NotEqual(t, engine.RollbackNeedsHuman, rep.Summary.Outcome)
			}
			require.Contains(t, auditKinds(t, env, res.RunID), "resolved:fix2")
		})
	}
}

// A conflict is attempted once however many retries are configured;
// a transient probe failure is retried; a restore that silently does
// nothing is compensation_failed; a resource already at before needs
// nothing; an atomic compare that fails is a conflict.
func TestGuardedUndoVerdicts(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	statusOf := func(t *testing.T, id string) engine.RollbackEntry {
		rep, err := env.engine.RollbackReport(ctx, id)
		require.NoError(t, err)
		require.Len(t, rep.Entries, 1)
		return rep.Entries[0]
	}
	cases := []struct {
		name    string
		setup   func(kv *kvStore, key string)
		status  engine.RollbackStatus
		reason  string
		probes  int32
		restore int32
		final   string
	}{
		{"conflict once with 10 retries", func(kv *kvStore, key string) {
			require.NoError(t, env.rdb.Set(ctx, key, "someone else", 0).Err())
		}, engine.RollbackNeedsPerson, engine.ReasonConflict, 1, 0, "someone else"},
		{"transient retried", func(kv *kvStore, key string) { kv.probeFail.Store(2) },
			engine.RollbackCompensated, "", 4, 1, "v0"},
		{"silent restore", func(kv *kvStore, key string) { kv.silent.Store(true) },
			engine.RollbackFailed, engine.ReasonRestoreIneffective, 2, 1, "v1"},
		{"already at before", func(kv *kvStore, key string) {
			require.NoError(t, env.rdb.Set(ctx, key, "v0", 0).Err())
		}, engine.RollbackCompensated, engine.ReasonAlreadyReverted, 1, 0, "v0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kv := newKV(env)
			key := env.prefix + ":verdict:" + tc.name
			require.NoError(t, env.rdb.Set(ctx, key, "v0", 0).Err())
			g := kv.guard(engine.Retry{MaxAttempts: 10})
			def := engine.MustDefine("verdict-"+tc.name, kv.setStep("set", key, "v1", g))
			require.NoError(t, env.engine.Register(def))
			res, err := env.engine.Run(ctx, def, nil)
			require.NoError(t, err)
			tc.setup(kv, key)
			_, err = env.engine.Undo(ctx, res.RunID)
			require.NoError(t, err)
			e := statusOf(t, res.RunID)
			require.Equal(t, tc.status, e.Status)
			require.Equal(t, tc.reason, e.Reason)
			require.Equal(t, tc.probes, kv.probes.Load(), "probes")
			require.Equal(t, tc.restore, kv.restores.Load(), "restores")
			require.Equal(t, tc.final, kv.get(ctx, key))
		})
	}

	t.Run("atomic compare fails", func(t *testing.T) {
		key := env.prefix + ":verdict:cas"
		require.NoError(t, env.rdb.Set(ctx, key, "v0", 0).Err())
		var restores atomic.Int32
		kv := newKV(env)
		g := engine.Guarded(engine.GuardConfig[string]{
			Probe: func(ctx context.Context, k string) (string, error) {
				v := kv.get(ctx, k)
				// Somebody writes between the read and the atomic write.
				require.NoError(t, env.rdb.Set(ctx, k, "racer", 0).Err())
				return v, nil
			},
			Restore: func(ctx context.Context, k, before, after string) (engine.RestoreResult, error) {
				restores.Add(1)
				return casRestore(ctx, env.rdb, k, before, after)
			},
		})
		def := engine.MustDefine("verdict-cas", kv.setStep("set", key, "v1", g))
		res, err := env.engine.Run(ctx, def, nil)
		require.NoError(t, err)
		_, err = env.engine.Undo(ctx, res.RunID)
		require.NoError(t, err)
		e := statusOf(t, res.RunID)
		require.Equal(t, engine.RollbackNeedsPerson, e.Status)
		require.Equal(t, int32(1), restores.Load())
		require.Equal(t, "racer", kv.get(ctx, key))
	})
}

// A verified record reads the resource back at once and refuses an effect
// whose probe does not match After; a no-op effect and an effect outside a
// guarded step are refused; a guarded step is defined with both functions.
func TestRecordEffectRefusals(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	type record struct {
		Email string `msgpack:"email"`
		Name  string `msgpack:"name"`
	}
	key := env.prefix + ":verified"
	g := engine.Guarded(engine.GuardConfig[string]{
		// Reads one field, while the effect describes the whole record.
		Probe: func(ctx context.Context, k string) (string, error) { return env.rdb.HGet(ctx, k, "email").Result() },
		Restore: func(context.Context, string, string, string) (engine.RestoreResult, error) {
			return engine.RestoreWritten, nil
		},
	})
	var recErr error
	step := func(name string, rec func(ctx context.Context) error) *engine.Definition {
		return engine.MustDefine("refusal-"+name, engine.Step(name, engine.StepConfig[engine.Args, string]{
			Guard: g,
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				recErr = rec(ctx)
				return "", recErr
			},
		}))
	}
	after := record{Email: "ada@new.test", Name: "Ada"}
	def := step("verified", func(ctx context.Context) error {
		require.NoError(t, env.rdb.HSet(ctx, key, "email", after.Email, "name", after.Name).Err())
		return engine.RecordVerifiedEffect(ctx, engine.Effect{Resource: key, Before: record{Email: "a@old", Name: "Ada"}, After: after})
	})
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	var mm *engine.EffectMismatchError
	require.ErrorAs(t, recErr, &mm)
	require.Equal(t, key, mm.Resource)

	res, err = env.engine.Run(ctx, step("noop", func(ctx context.Context) error {
		return engine.RecordEffect(ctx, engine.Effect{Resource: key, Before: map[string]any{"a": int8(1)}, After: map[string]any{"a": int64(1)}})
	}), nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.ErrorIs(t, recErr, engine.ErrNoOpEffect)

	_, err = env.engine.Run(ctx, step("nan", func(ctx context.Context) error {
		return engine.RecordEffect(ctx, engine.Effect{Resource: key, Before: 1.0, After: func() {}})
	}), nil)
	require.NoError(t, err)
	var fe *fingerprint.Error
	require.ErrorAs(t, recErr, &fe)

	require.ErrorIs(t, engine.RecordEffect(ctx, engine.Effect{Resource: key, Before: 1, After: 2}), engine.ErrNotGuarded)

	_, err = engine.Define("guard-undo", engine.Step("x", engine.StepConfig[engine.Args, string]{
		Run:   func(context.Context, engine.Args) (string, error) { return "", nil },
		Undo:  func(context.Context, engine.Args, string) error { return nil },
		Guard: g,
	}))
	require.ErrorContains(t, err, "a guarded step has no Undo")
	_, err = engine.Define("guard-incomplete", engine.Step("x", engine.StepConfig[engine.Args, string]{
		Run:   func(context.Context, engine.Args) (string, error) { return "", nil },
		Guard: engine.Guarded(engine.GuardConfig[string]{Probe: func(context.Context, string) (string, error) { return "", nil }}),
	}))
	require.ErrorContains(t, err, "Guard needs a Restore")
}

// failureReasons lists the reasons of f's rollback failures, in order.
func failureReasons(f *engine.Failure) []string {
	var out []string
	if f != nil {
		for _, rf := range f.RollbackFailures {
			out = append(out, rf.Reason)
		}
	}
	return out
}
