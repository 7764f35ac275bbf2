// Package app is the flotilla-discovery command: its configuration and the
// wiring of its components. Until issue #4 builds the service, the
// command takes only the configuration every service shares and exits
// saying it is not built yet.
package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
)

// NewCommand returns the flotilla-discovery command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[command.Common]{
		Name:     "flotilla-discovery",
		Short:    "Flotilla's xDS server (Pilot)",
		Long:     "discovery subscribes to galley, builds an immutable push context and serves Envoy xDS (LDS, RDS, CDS, EDS; state-of-the-world and delta) to sidecars and proxyless gRPC clients. It never talks to Kubernetes and runs as N independent replicas.",
		Defaults: func() command.Common { return command.CommonDefaults(":15014") },
		Run: func(context.Context, command.Common, *command.Runtime) error {
			return &command.NotBuiltError{Service: "discovery", Issue: 4}
		},
	})
}
