//go:build !linux

package kubeenv

import (
	"fmt"
	"os"
)

// RunInNetworkNamespace needs Linux's network namespaces.
func RunInNetworkNamespace(func() int) int {
	fmt.Fprintln(os.Stderr, "kubeenv: a network namespace of the tests' own needs Linux")
	return 1
}

func inNetworkNamespace() bool { return false }
