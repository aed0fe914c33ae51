package mapcore

// Failpoints are test hooks at the protocol's narrow windows. They are
// process-global: a hook must filter on the map ids of its own test.
type Failpoints struct {
	BeforeStart   func(mapID string, index int) error
	AfterSettle   func(mapID string, index int) error
	BeforeEnqueue func(mapID string, index int) error
	OnSignal      func(mapID string, index int) error

	RbBeforeEnqueue func(mapID string, pos int) error
	RbAfterSettle   func(mapID string, pos int) error
	RbJobSignal     func(mapID string, pos int) error
	RbBeforeHandOff func(mapID string, pos int) error
	RbOwnerSignal   func(mapID string, pos int) error
}

// SetFailpoints installs hooks; set them before any map runs in the test
// binary (in TestMain or a non-parallel test) and never change them while
// maps run.
func SetFailpoints(f Failpoints) {
	failpoints.beforeStart = f.BeforeStart
	failpoints.afterSettle = f.AfterSettle
	failpoints.beforeEnqueue = f.BeforeEnqueue
	failpoints.onSignal = f.OnSignal
	failpoints.rbBeforeEnqueue = f.RbBeforeEnqueue
	failpoints.rbAfterSettle = f.RbAfterSettle
	failpoints.rbJobSignal = f.RbJobSignal
	failpoints.rbBeforeHandOff = f.RbBeforeHandOff
	failpoints.rbOwnerSignal = f.RbOwnerSignal
}
