package cabundle

import (
	"fmt"
	"log/slog"
	"os"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/flotilla-mesh/flotilla/internal/platform/controller"
	"github.com/flotilla-mesh/flotilla/internal/platform/kubeconfig"
)

// Setup is what a service needs to keep its webhook configuration's
// caBundle.
type Setup struct {
	// Kubeconfig, or in-cluster configuration when empty and running in a
	// cluster; with neither there is no controller.
	Kubeconfig string
	Kind       Kind
	Webhook    string
	// Selector selects more configurations to keep (Options.Selector).
	Selector string
	// Bundle is the PEM to keep.
	Bundle func() []byte
	// LeaseNamespace and LeaseName of the election; the identity is the
	// host name (the pod's name in a cluster).
	LeaseNamespace, LeaseName string
	Log                       *slog.Logger
}

// FromSetup builds the controller, or returns nil when there is no
// cluster to write to.
func FromSetup(s Setup) (*Controller, error) {
	if s.Kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, nil
	}
	rest, err := kubeconfig.Load(s.Kubeconfig, "--kubeconfig")
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	klog.SetSlogLogger(s.Log.With("component", "client-go"))
	identity, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("leader identity: %w", err)
	}
	return New(Options{
		Client: client, Log: s.Log, Kind: s.Kind, Webhook: s.Webhook, Selector: s.Selector, Bundle: s.Bundle,
		Lease: controller.Lease{Identity: identity, Namespace: s.LeaseNamespace, Name: s.LeaseName},
	}), nil
}

// FileBundle reads the bundle from path at each check (a mounted
// ConfigMap or Secret changes in place); a read error logs and keeps the
// bundle as it is.
func FileBundle(path string, log *slog.Logger) func() []byte {
	return func() []byte {
		data, err := os.ReadFile(path)
		if err != nil {
			log.Warn("reading the caBundle file", "error", err)
			return nil
		}
		return data
	}
}
