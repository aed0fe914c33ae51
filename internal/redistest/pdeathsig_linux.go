package redistest

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel SIGKILL cmd's process when the process that
// started it dies, so a test binary or cmd/testcluster killed by a timeout
// leaves no redis-server behind. (The kernel ties the signal to the thread
// that forked, and the Go runtime ends a thread only when a goroutine locked
// to it with runtime.LockOSThread returns without unlocking, which no
// goreactor code does.)
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
