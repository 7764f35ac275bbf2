// Package app is the flotilla-ca command: its configuration and the
// wiring of its components. Until issue #5 builds the service, the
// command takes only the configuration every service shares and exits
// saying it is not built yet.
package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
)

// NewCommand returns the flotilla-ca command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[command.Common]{
		Name:     "flotilla-ca",
		Short:    "Flotilla's certificate authority (Citadel)",
		Long:     "ca issues SPIFFE X.509 workload certificates over Istio's IstioCertificateService API, authenticating callers by Kubernetes service account token or, without a cluster, by JWT, and issues the other services' serving certificates.",
		Defaults: func() command.Common { return command.CommonDefaults(":15018") },
		Run: func(context.Context, command.Common, *command.Runtime) error {
			return &command.NotBuiltError{Service: "ca", Issue: 5}
		},
	})
}
