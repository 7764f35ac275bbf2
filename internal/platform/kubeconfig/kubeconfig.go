// Package kubeconfig loads how a service reaches its cluster: a kubeconfig
// file when one is given, else the in-cluster service account.
package kubeconfig

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Load reads path, or the in-cluster configuration when path is empty;
// noCluster says what the service would need instead (for the error).
func Load(path, noCluster string) (*rest.Config, error) {
	if path != "" {
		c, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return c, nil
	}
	c, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no %s, no --kubeconfig and not running in a cluster: %w", noCluster, err)
	}
	return c, nil
}
