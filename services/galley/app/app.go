// Package app is the flotilla-galley command: its configuration and the
// wiring of its components.
package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
)

// Config is the configuration of flotilla-galley.
type Config struct {
	command.Common `yaml:",inline"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{Common: command.CommonDefaults(":15015")}
}

// Validate checks the configuration.
func (c Config) Validate() error { return c.Common.Validate() }

// NewCommand returns the flotilla-galley command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[Config]{
		Name:     "flotilla-galley",
		Short:    "Flotilla's config and registry ingestion service",
		Long:     "galley is the only Flotilla service that reads Kubernetes (or a directory of YAML). It validates Istio configuration, normalises Services, EndpointSlices and Pods into the registry, and streams both to discovery and injector over MCP-over-xDS.",
		Defaults: Defaults,
		Run:      run,
	})
}

func run(context.Context, Config, *command.Runtime) error {
	return &command.NotBuiltError{Service: "galley", Issue: 3}
}
