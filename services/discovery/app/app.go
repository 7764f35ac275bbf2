// Package app is the flotilla-discovery command: its configuration and the
// wiring of its components.
package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
)

// Config is the configuration of flotilla-discovery.
type Config struct {
	command.Common `yaml:",inline"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{Common: command.CommonDefaults(":15014")}
}

// Validate checks the configuration.
func (c Config) Validate() error { return c.Common.Validate() }

// NewCommand returns the flotilla-discovery command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[Config]{
		Name:     "flotilla-discovery",
		Short:    "Flotilla's xDS server (Pilot)",
		Long:     "discovery subscribes to galley, builds an immutable push context and serves Envoy xDS (LDS, RDS, CDS, EDS; state-of-the-world and delta) to sidecars and proxyless gRPC clients. It never talks to Kubernetes and runs as N independent replicas.",
		Defaults: Defaults,
		Run:      run,
	})
}

func run(context.Context, Config, *command.Runtime) error {
	return &command.NotBuiltError{Service: "discovery", Issue: 4}
}
