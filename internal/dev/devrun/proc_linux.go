package devrun

import "syscall"

// sysProcAttr puts each child in its own process group, so that a terminal's
// Ctrl-C reaches only the supervisor, which then stops the children in order;
// and kills the child if the supervisor dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
