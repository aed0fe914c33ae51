package engine

// failpoints are test-only hooks at the narrow windows of the executor. Only
// tests set them (export_test.go), before any run executes.
var failpoints struct {
	// beforeStepRun runs after a step's intent is on record, just before its
	// Run is called.
	beforeStepRun func(runID, step string, attempt int)
}
