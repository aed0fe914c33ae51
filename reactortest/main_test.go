package reactortest_test

import (
	"testing"

	"github.com/goreactor/goreactor/reactortest"
)

func TestMain(m *testing.M) { reactortest.Main(m) }
