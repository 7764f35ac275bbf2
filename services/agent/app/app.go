// Package app is the flotilla-agent command: its configuration and the
// wiring of its components.
package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
)

// Config is the configuration of flotilla-agent.
type Config struct {
	command.Common `yaml:",inline"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{Common: command.CommonDefaults(":15020")}
}

// Validate checks the configuration.
func (c Config) Validate() error { return c.Common.Validate() }

// NewCommand returns the flotilla-agent command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[Config]{
		Name:     "flotilla-agent",
		Short:    "Flotilla's in-pod agent",
		Long:     "agent runs next to Envoy in each pod: it sets up traffic capture (iptables), gets the workload certificate from ca and serves it to Envoy over SDS on a Unix socket, rotating it before it expires.",
		Defaults: Defaults,
		Run:      run,
	})
}

func run(context.Context, Config, *command.Runtime) error {
	return &command.NotBuiltError{Service: "agent", Issue: 6}
}
