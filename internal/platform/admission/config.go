package admission

import (
	"errors"
	"fmt"
	"net"

	"github.com/flotilla-mesh/flotilla/internal/platform/tlsreload"
)

// Config is how a service serves its admission webhook (galley's
// validating one, the injector's mutating one). Embed it inline in the
// service's configuration: its fields are the --webhook-address,
// --webhook-tls-*, --webhook-config and --ca-bundle-file flags.
type Config struct {
	// Address is where the webhook listens (HTTPS).
	Address string `yaml:"webhookAddress" usage:"listen address of the admission webhook (HTTPS)"`
	// TLS is the serving certificate from files; a service that gets its
	// certificate from ca (caAddress) serves that one instead.
	TLS tlsreload.Files `yaml:"webhookTLS"`
	// Configuration names the webhook configuration whose caBundle a
	// leader-elected replica keeps equal to CABundleFile, in a cluster.
	Configuration string `yaml:"webhookConfig" usage:"webhook configuration (Validating for galley, Mutating for the injector) whose caBundle a leader keeps, in a cluster"`
	// CABundleFile is the CA of the serving certificate (default: the
	// roots of ca when the certificate comes from it).
	CABundleFile string `yaml:"caBundleFile" usage:"PEM CA of the webhook's serving certificate, for the caBundle (default caRootsFile)"`
}

// Validate checks the address and the certificate files; fromCA says the
// service gets its certificate from ca, which excludes certificate files.
func (c Config) Validate(fromCA bool) error {
	errs := []error{c.TLS.Validate()}
	if _, _, err := net.SplitHostPort(c.Address); err != nil {
		errs = append(errs, fmt.Errorf("webhookAddress %q: %w", c.Address, err))
	}
	if c.TLS.CAFile != "" {
		errs = append(errs, errors.New("webhookTLS.caFile must be empty: the apiserver does not present a client certificate to webhooks"))
	}
	if fromCA && c.TLS.Enabled() {
		errs = append(errs, errors.New("caAddress and webhookTLS are exclusive: the webhook's certificate comes from ca or from files"))
	}
	return errors.Join(errs...)
}
