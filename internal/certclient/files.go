package certclient

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
)

// ForService returns a client for a control-plane service running in a
// pod: ca's roots from a PEM file (the istio-ca-root-cert ConfigMap
// mounted), the token from a file (a projected token with audience
// istio-ca, re-read for each request), and the Service names
// <service>.<namespace>.svc and <service>.<namespace>.svc.<domainSuffix>.
func ForService(address, rootsFile, tokenFile, service, namespace, domainSuffix string, log *slog.Logger) (*Client, error) {
	pemRoots, err := os.ReadFile(rootsFile)
	if err != nil {
		return nil, fmt.Errorf("ca roots: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemRoots) {
		return nil, fmt.Errorf("ca roots %s: no PEM certificates", rootsFile)
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("ca address %q: %w", address, err)
	}
	base := service + "." + namespace + ".svc"
	return New(Options{
		Address: address, ServerName: host, Roots: roots,
		Token: func() (string, error) {
			b, err := os.ReadFile(tokenFile)
			if err != nil {
				return "", fmt.Errorf("token: %w", err)
			}
			return strings.TrimSpace(string(b)), nil
		},
		DNSNames: []string{base, base + "." + domainSuffix}, Log: log,
	}), nil
}
