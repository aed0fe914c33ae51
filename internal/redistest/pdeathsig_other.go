//go:build !linux

package redistest

import "os/exec"

// dieWithParent does nothing where the kernel cannot signal a child when
// its parent dies: the caller's cleanup kills the servers.
func dieWithParent(*exec.Cmd) {}
