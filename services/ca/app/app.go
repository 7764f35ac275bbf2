// Package app is the flotilla-ca command: its configuration and the
// wiring of its components.
package app

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
)

// Config is the configuration of flotilla-ca.
type Config struct {
	command.Common `yaml:",inline"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{Common: command.CommonDefaults(":15018")}
}

// Validate checks the configuration.
func (c Config) Validate() error { return c.Common.Validate() }

// NewCommand returns the flotilla-ca command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[Config]{
		Name:     "flotilla-ca",
		Short:    "Flotilla's certificate authority (Citadel)",
		Long:     "ca issues SPIFFE X.509 workload certificates over Istio's IstioCertificateService API, authenticating callers by Kubernetes service account token or, without a cluster, by JWT, and issues the other services' serving certificates.",
		Defaults: Defaults,
		Run:      run,
	})
}

func run(context.Context, Config, *command.Runtime) error {
	return &command.NotBuiltError{Service: "ca", Issue: 5}
}
