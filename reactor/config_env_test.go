package reactor_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// Config.Prefix defaults to GOREACTOR_PREFIX, the prefix every goreactor
// binary reads, then to "goreactor"; a Prefix set in code wins.
func TestConfigPrefixFromTheEnvironment(t *testing.T) {
	t.Setenv("GOREACTOR_PREFIX", "shop")
	require.Equal(t, "shop", reactor.Config{}.WithDefaults().Prefix)
	require.Equal(t, "mine", reactor.Config{Prefix: "mine"}.WithDefaults().Prefix)
	t.Setenv("GOREACTOR_PREFIX", "  ")
	require.Equal(t, "goreactor", reactor.Config{}.WithDefaults().Prefix, "blank is unset")
}
