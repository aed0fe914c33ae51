package engine_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// Config.Prefix defaults to GOREACTOR_PREFIX, the prefix every goreactor
// binary reads, then to "goreactor"; a Prefix set in code wins.
func TestConfigPrefixFromTheEnvironment(t *testing.T) {
	t.Setenv("GOREACTOR_PREFIX", "shop")
	require.Equal(t, "shop", engine.Config{}.WithDefaults().Prefix)
	require.Equal(t, "mine", engine.Config{Prefix: "mine"}.WithDefaults().Prefix)
	t.Setenv("GOREACTOR_PREFIX", "  ")
	require.Equal(t, "goreactor", engine.Config{}.WithDefaults().Prefix, "blank is unset")
}
