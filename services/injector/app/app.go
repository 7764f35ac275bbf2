// Package app is the flotilla-injector command: its configuration and the
// wiring of its components.
package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
)

// Config is the configuration of flotilla-injector.
type Config struct {
	command.Common `yaml:",inline"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{Common: command.CommonDefaults(":15022")}
}

// Validate checks the configuration.
func (c Config) Validate() error { return c.Common.Validate() }

// NewCommand returns the flotilla-injector command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[Config]{
		Name:     "flotilla-injector",
		Short:    "Flotilla's sidecar injection webhook",
		Long:     "injector is the mutating admission webhook that adds the traffic-capture init container and the proxy container with the agent to pods.",
		Defaults: Defaults,
		Run:      run,
	})
}

func run(context.Context, Config, *command.Runtime) error {
	return &command.NotBuiltError{Service: "injector", Issue: 6}
}
