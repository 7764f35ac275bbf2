// Package app is the flotilla-injector command: its configuration and the
// wiring of its components. Until issue #6 builds the service, the
// command takes only the configuration every service shares and exits
// saying it is not built yet.
package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
)

// NewCommand returns the flotilla-injector command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[command.Common]{
		Name:     "flotilla-injector",
		Short:    "Flotilla's sidecar injection webhook",
		Long:     "injector is the mutating admission webhook that adds the traffic-capture init container and the proxy container with the agent to pods.",
		Defaults: func() command.Common { return command.CommonDefaults(":15022") },
		Run: func(context.Context, command.Common, *command.Runtime) error {
			return &command.NotBuiltError{Service: "injector", Issue: 6}
		},
	})
}
