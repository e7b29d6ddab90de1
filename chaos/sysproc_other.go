//go:build unix && !linux

package chaos

import "syscall"

// sysProcAttr puts the child in its own process group (no Pdeathsig off
// Linux: a harness that crashes leaves its children running).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
