package kubeenv

import "syscall"

// sysProcAttr makes the kernel kill a server if the test process dies first,
// so a crashed or killed test run leaves no apiserver behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
