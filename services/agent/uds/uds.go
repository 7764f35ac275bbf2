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

// Private is the mode of a socket only its owner may use: Envoy runs as
// the agent's user in the same container, and SDS hands out the private
// key.
const Private os.FileMode = 0o600

// Shared is the mode of a socket every container of the pod may use: the
// proxyless application's xDS connection (its containers run as users of
// their own). The socket's directory is the pod's own volume.
const Shared os.FileMode = 0o666

// Listen listens on a Unix socket at path with mode (Private or Shared): a
// stale socket file is removed first, and the directory made if missing
// (searchable by others when the socket is shared).
func Listen(path string, mode os.FileMode) (net.Listener, error) {
	dirMode := os.FileMode(0o750)
	if mode&0o007 != 0 {
		dirMode = 0o755
	}
	if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("stale socket: %w", err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("socket: %w", err)
	}
	return lis, nil
}
