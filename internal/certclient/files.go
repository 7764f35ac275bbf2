package certclient

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
)

// Config is how a control-plane service (galley, discovery, injector)
// reaches ca for its own certificate. Embed it inline in a service's
// configuration: its fields are the --ca-address, --ca-roots-file and
// --token-file flags.
type Config struct {
	// Address is ca's gRPC address; empty means the service's certificate
	// does not come from ca.
	Address string `yaml:"caAddress" usage:"ca's address, host:port: this process's own certificate (the service's, or the pod's for the agent) comes from ca and is renewed before it expires"`
	// RootsFile holds the roots ca's certificate chains to (the mesh trust
	// bundle: the istio-ca-root-cert ConfigMap, mounted).
	RootsFile string `yaml:"caRootsFile" usage:"PEM roots ca's certificate chains to (the mesh trust bundle)"`
	// TokenFile is the service account token (audience istio-ca), re-read
	// for each request.
	TokenFile string `yaml:"tokenFile" usage:"service account token (audience istio-ca) to authenticate to ca with"`
}

// Enabled reports whether the certificate comes from ca.
func (c Config) Enabled() bool { return c.Address != "" }

// Validate checks that an address comes with the roots and the token file.
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	var errs []error
	if c.RootsFile == "" || c.TokenFile == "" {
		errs = append(errs, errors.New("caAddress needs caRootsFile and tokenFile"))
	}
	if _, _, err := net.SplitHostPort(c.Address); err != nil {
		errs = append(errs, fmt.Errorf("caAddress %q: %w", c.Address, err))
	}
	return errors.Join(errs...)
}

// ForService returns a client for a control-plane service running in a
// pod: ca's roots from RootsFile, the token from TokenFile (a projected
// token with audience istio-ca, re-read for each request), and for each
// of the service's Service names (controlplane.ServiceNames: discovery's
// include Istio's istiod) <name>.<namespace>.svc and
// <name>.<namespace>.svc.<domainSuffix>.
// It returns nil, nil when the configuration is not Enabled.
func (c Config) ForService(service, namespace, domainSuffix string, log *slog.Logger) (*Client, error) {
	if !c.Enabled() {
		return nil, nil
	}
	pemRoots, err := os.ReadFile(c.RootsFile)
	if err != nil {
		return nil, fmt.Errorf("ca roots: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemRoots) {
		return nil, fmt.Errorf("ca roots %s: no PEM certificates", c.RootsFile)
	}
	host, _, err := net.SplitHostPort(c.Address)
	if err != nil {
		return nil, fmt.Errorf("ca address %q: %w", c.Address, err)
	}
	names, ok := controlplane.ServiceNames(service)
	if !ok {
		names = []string{service}
	}
	var dns []string
	for _, n := range names {
		base := n + "." + namespace + ".svc"
		dns = append(dns, base, base+"."+domainSuffix)
	}
	return New(Options{
		Address: c.Address, ServerName: host, Roots: StaticRoots(roots),
		Token: TokenFile(c.TokenFile), DNSNames: dns, Log: log,
	}), nil
}

// TokenFile is Options.Token for a token in a file (a projected service
// account token, which the kubelet replaces before it expires): the file
// is read at each request.
func TokenFile(path string) func() (string, error) {
	return func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("token: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
}
