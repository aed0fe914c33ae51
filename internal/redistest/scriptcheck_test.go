package redistest_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
)

// rawClient is a client of the shared Redis without the ScriptCheck that
// Client installs, for the tests that send bad calls on purpose.
func rawClient(t *testing.T) redis.UniversalClient {
	t.Helper()
	var c redis.UniversalClient
	if seeds := redistest.ClusterAddrs(); seeds != nil {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds})
	} else {
		c = redis.NewClient(redistest.Options())
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The self-check of the slot check: a script called with keys of two slots
// is reported with its name and keys, alone and in a pipeline, whether the
// server runs it (one node) or refuses it (a cluster: CROSSSLOT); one whose
// keys share a hash tag is not.
func TestScriptCheckReportsKeysInTwoSlots(t *testing.T) {
	ctx := context.Background()
	c := rawClient(t)
	check := redistest.NewScriptCheck()
	c.AddHook(check)
	prefix := redistest.Prefix(t)

	script := redis.NewScript("-- two_keys.lua: a self-check, not a script of goreactor's.\n" +
		"-- KEYS[1], KEYS[2] any keys\n" +
		"return redis.call('EXISTS', KEYS[1]) + redis.call('EXISTS', KEYS[2])\n")
	good := []string{prefix + ":{run:a}:ctx", prefix + ":{run:a}:lock"}
	bad := []string{prefix + ":{run:a}:ctx", prefix + ":{run:b}:lock"}
	require.NotEqual(t, redistest.Slot(bad[0]), redistest.Slot(bad[1]))

	// Loaded first: the check names a script once this process sent its
	// source (the shared server may have it cached from an earlier run).
	require.NoError(t, script.Load(ctx, c).Err())
	require.NoError(t, script.Run(ctx, c, good).Err())
	require.NoError(t, check.Err(), "keys sharing a hash tag")

	err := script.Run(ctx, c, bad).Err()
	if redistest.ClusterAddrs() != nil {
		require.ErrorContains(t, err, "CROSSSLOT", "what a cluster answers")
	} else {
		require.NoError(t, err, "what one node answers")
	}
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		script.EvalSha(ctx, p, bad)
		return nil
	})
	require.Len(t, check.CrossSlot(), 2, "the call, and the pipelined one")
	err = check.Err()
	require.Error(t, err)
	for _, want := range []string{"two_keys.lua", bad[0], bad[1], "(slot "} {
		require.Contains(t, err.Error(), want)
	}
	// 3 calls, and the EVAL of Script.Run's fallback where the server did
	// not have the script yet.
	require.GreaterOrEqual(t, check.Calls()["two_keys.lua"], 3)
}

// A script's SHA1 is named after its .lua files, also for one whose source
// this process never sent (the server had it cached) and for mapcore's
// batch.lua-prefixed ones.
func TestScriptNameFromTheModulesLuaFiles(t *testing.T) {
	files, err := redistest.ModuleLua()
	require.NoError(t, err)
	src := map[string]string{}
	for _, f := range files {
		src[f.Path] = f.Source
	}
	batch, settle := src["internal/mapcore/lua/batch.lua"], src["internal/mapcore/lua/settle.lua"]
	require.NotEmpty(t, batch)
	require.NotEmpty(t, settle)
	sha := func(s string) string { sum := sha1.Sum([]byte(s)); return hex.EncodeToString(sum[:]) }
	require.Equal(t, "batch.lua+settle.lua", redistest.ScriptName(sha(batch+settle)))
	require.Equal(t, "write.lua", redistest.ScriptName(sha(src["internal/store/lua/write.lua"])))
	require.Equal(t, "held.lua", redistest.ScriptName(sha(src["internal/store/lua/held.lua"])), "a file without a header line")
	require.Equal(t, "script 0000", redistest.ScriptName("0000"))
}
