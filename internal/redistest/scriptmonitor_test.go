package redistest_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
)

// The self-check of the key check: MONITOR shows what a script ran, and
// Undeclared finds a key the script built itself (even one in its call's
// slot: a cluster node would run it) and a shard channel of another slot,
// and nothing in a script that keeps to its KEYS. Arguments that need
// escaping survive MONITOR's quoting.
func TestScriptMonitorFindsKeysAScriptBuilds(t *testing.T) {
	ctx := context.Background()
	srv := redistest.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	mon := redistest.MonitorScripts(t, srv.Addr)

	keeps := redis.NewScript("-- keeps.lua: a self-check.\n" +
		"local t = redis.call('TIME')\n" +
		"redis.call('HSET', KEYS[1], 'f', ARGV[1])\n" +
		"redis.pcall('SPUBLISH', ARGV[2], t[1])\n" +
		"return redis.call('XADD', KEYS[2], 'MAXLEN', '~', 10, '*', 'k', 'v')\n")
	builds := redis.NewScript("-- builds.lua: a self-check.\n" +
		"redis.call('SET', KEYS[1] .. ':shadow', 1)\n" +
		"redis.pcall('SPUBLISH', 'elsewhere', 1)\n" +
		"return redis.call('DEL', KEYS[1] .. ':shadow')\n")
	odd := "t:{x}:\"quoted\"\n\\new line\x01"
	require.NoError(t, keeps.Run(ctx, c, []string{odd, "t:{x}:audit"}, "v", "t:{x}:done").Err())
	require.NoError(t, builds.Run(ctx, c, []string{"t:{x}:ctx"}).Err())

	runs, err := mon.Stop()
	require.NoError(t, err)
	byName := map[string]redistest.ScriptRun{}
	for _, r := range runs {
		if len(r.Commands) > 0 { // not the EVALSHA refused with NOSCRIPT
			byName[r.Script()] = r
		}
	}
	require.Len(t, byName, 2, "%v", runs)
	require.Equal(t, []string{odd, "t:{x}:audit"}, byName["keeps.lua"].Keys)
	require.Len(t, byName["keeps.lua"].Commands, 4)

	none, err := redistest.Undeclared(ctx, c, byName["keeps.lua"])
	require.NoError(t, err)
	require.Empty(t, none)
	found, err := redistest.Undeclared(ctx, c, byName["builds.lua"])
	require.NoError(t, err)
	require.Equal(t, []redistest.Access{
		{Key: "t:{x}:ctx:shadow", Command: []string{"SET", "t:{x}:ctx:shadow", "1"}},
		{Key: "elsewhere", Command: []string{"SPUBLISH", "elsewhere", "1"}, Channel: true},
		{Key: "t:{x}:ctx:shadow", Command: []string{"DEL", "t:{x}:ctx:shadow"}},
	}, found)
	require.Contains(t, found[1].String(), "shard channel elsewhere (slot ")
}
