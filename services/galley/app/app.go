// Package app is the flotilla-galley command: its configuration and the
// wiring of its components. Until issue #3 builds the service, the
// command takes only the configuration every service shares and exits
// saying it is not built yet.
package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
)

// NewCommand returns the flotilla-galley command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[command.Common]{
		Name:     "flotilla-galley",
		Short:    "Flotilla's config and registry ingestion service",
		Long:     "galley is the only Flotilla service that reads Kubernetes (or a directory of YAML). It validates Istio configuration, normalises Services, EndpointSlices and Pods into the registry, and streams both to discovery and injector over MCP-over-xDS.",
		Defaults: func() command.Common { return command.CommonDefaults(":15015") },
		Run: func(context.Context, command.Common, *command.Runtime) error {
			return &command.NotBuiltError{Service: "galley", Issue: 3}
		},
	})
}
