//go:build integration

package vllmclient_test

import "syscall"

// sysProcAttr has the kernel SIGKILL a child if the test process dies
// without running its cleanups (a -timeout panic, a SIGKILL).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
