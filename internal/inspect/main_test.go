package inspect

import (
	"testing"

	"github.com/goreactor/goreactor/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }
