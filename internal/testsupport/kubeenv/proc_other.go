//go:build !linux

package kubeenv

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
