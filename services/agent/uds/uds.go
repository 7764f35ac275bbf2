// Package uds is how the agent listens on the pod's Unix sockets (SDS
// and xDS, which Envoy dials), where the private key and the proxy's
// configuration are handed over.
package uds

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// Listen listens on a Unix socket at path: a stale socket file is removed
// first, the directory made if missing, and the socket is readable and
// writable by its owner only (Envoy runs as the agent's user in the same
// container; the socket hands out the private key).
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("stale socket: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("socket: %w", err)
	}
	return lis, nil
}
