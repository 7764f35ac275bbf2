// Package app is the flotilla-agent command: its configuration and the
// wiring of its components. Until issue #6 builds the service, the
// command takes only the configuration every service shares and exits
// saying it is not built yet.
package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
)

// NewCommand returns the flotilla-agent command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[command.Common]{
		Name:     "flotilla-agent",
		Short:    "Flotilla's in-pod agent",
		Long:     "agent runs next to Envoy in each pod: it sets up traffic capture (iptables), gets the workload certificate from ca and serves it to Envoy over SDS on a Unix socket, rotating it before it expires.",
		Defaults: func() command.Common { return command.CommonDefaults(":15020") },
		Run: func(context.Context, command.Common, *command.Runtime) error {
			return &command.NotBuiltError{Service: "agent", Issue: 6}
		},
	})
}
