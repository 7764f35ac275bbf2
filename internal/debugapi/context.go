package debugapi

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// ContextFileName is where a local stack writes its context, under its
// state directory (make run: .flotilla/context.yaml in the checkout).
const ContextFileName = "context.yaml"

// DefaultDiscoveryAddress is make run's first replica, asked when nothing
// else says where discovery is.
const DefaultDiscoveryAddress = "127.0.0.1:15010"

// Context is what a context file holds: where the discovery replicas are
// and how to reach them (the CLI's flags override each field they set).
type Context struct {
	// DiscoveryAddresses are the replicas' xDS ports, host:port.
	DiscoveryAddresses []string `json:"discoveryAddresses"`
	// Plaintext reaches them without TLS.
	Plaintext bool `json:"plaintext,omitempty"`
	// CertFile and KeyFile are a client certificate; CAFile the roots
	// the replicas' (and ca's) certificates chain to.
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	CAFile   string `json:"caFile,omitempty"`
	// CAAddress and TokenFile get a client certificate from ca instead.
	CAAddress string `json:"caAddress,omitempty"`
	TokenFile string `json:"tokenFile,omitempty"`
	// SystemNamespace is the control plane's (names its certificates).
	SystemNamespace string `json:"systemNamespace,omitempty"`
}

// WriteContext writes a context file (a local stack does, for the CLI).
func WriteContext(path string, c Context) error {
	b, err := yaml.Marshal(c)
	if err != nil {
		return fmt.Errorf("context: %w", err)
	}
	b = append([]byte("# Written by a local Flotilla control plane for the flotilla CLI (FLOTILLA_CONTEXT, or found from the current directory).\n"), b...)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("context: %w", err)
	}
	return nil
}

// ParseContext reads a context file's content; unknown fields are
// refused.
func ParseContext(b []byte) (Context, error) {
	var c Context
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return Context{}, fmt.Errorf("context: %w", err)
	}
	return c, nil
}
