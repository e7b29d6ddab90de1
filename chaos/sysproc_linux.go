package chaos

import "syscall"

// sysProcAttr puts the child in its own process group, so a terminal's ^C
// reaches only the harness (which then stops the cluster in order), and
// has the kernel SIGKILL the child if the harness dies without Stop.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
