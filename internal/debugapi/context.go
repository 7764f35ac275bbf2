package debugapi

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
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
	DiscoveryAddresses []string `yaml:"discoveryAddresses"`
	// GalleyAddress is galley's MCP port, host:port (flotilla analyze
	// --live); empty when the stack does not say.
	GalleyAddress string `yaml:"galleyAddress,omitempty"`
	// Plaintext reaches them without TLS.
	Plaintext bool `yaml:"plaintext,omitempty"`
	// CertFile and KeyFile are a client certificate; CAFile the roots
	// the replicas' (and ca's) certificates chain to.
	CertFile string `yaml:"certFile,omitempty"`
	KeyFile  string `yaml:"keyFile,omitempty"`
	CAFile   string `yaml:"caFile,omitempty"`
	// CAAddress and TokenFile get a client certificate from ca instead.
	CAAddress string `yaml:"caAddress,omitempty"`
	TokenFile string `yaml:"tokenFile,omitempty"`
	// SystemNamespace is the control plane's (names its certificates).
	SystemNamespace string `yaml:"systemNamespace,omitempty"`
	// AgentAddresses are the agents' status ports (host:port), by the
	// name of the proxy each runs (pod.namespace): where proxy-config
	// bootstrap reads a proxy's bootstrap (AgentBootstrapPath).
	AgentAddresses map[string]string `yaml:"agentAddresses,omitempty"`
	// LogDir is where a local stack keeps each service's output,
	// <name>.log (flotilla bug-report collects them).
	LogDir string `yaml:"logDir,omitempty"`
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
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) { // EOF: an empty file
		return Context{}, fmt.Errorf("context: %w", err)
	}
	return c, nil
}
