package worker

// Task types handled by a Worker.
const (
	// TypeRun executes (starts or resumes) a run.
	TypeRun = "goreactor:run"
	// TypeElement executes one element of a fan-out map.
	TypeElement = "goreactor:element"
	// TypeRollback rolls back one element of a fan-out map.
	TypeRollback = "goreactor:rollback"
)
