package worker_test

import (
	"os"
	"testing"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/worker"
)

func TestMain(m *testing.M) {
	if os.Getenv(runWorkerMain) == "1" {
		// A worker process of TestKilledWorkersRunIsRecoveredByDefault and
		// TestNewUserOnACustomPrefixAndQueue: this test binary is then a
		// user's worker program.
		worker.Main(recoveryDefinition(), orderDefinition())
		return
	}
	redistest.Main(m)
}
