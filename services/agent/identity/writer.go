package identity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// dataLink is the symlink that names the directory holding the current
// files; each file in Writer.Dir is a symlink through it. Replacing the
// one link swaps all three files at once, as the kubelet does for
// projected volumes.
const dataLink = "..data"

// Writer keeps the held certificate chain, key and roots in Dir as
// ChainFile, KeyFile and RootsFile, for an application that reads its mesh
// certificate from files (grpc-go's file_watcher certificate provider in
// the proxyless bootstrap). Every change of the identity is written whole
// into a new directory and swapped in with one rename, so a reader never
// sees a new certificate with an old key in one directory listing. The
// files' mode is Istio's (security/pkg/nodeagent/util's
// OutputKeyCertToDir): readable by their owner alone (0600), unless
// Shared.
type Writer struct {
	Dir   string
	State *State
	Log   *slog.Logger
	// Shared makes the files readable by every user (0644), as Istio
	// writes them in Kubernetes: the application's containers run as
	// users of their own, and the directory is a volume of the pod's own
	// that only they and the agent mount.
	Shared bool

	written atomic.Bool
}

// Written reports whether the files hold a certificate and roots.
func (w *Writer) Written() bool { return w.written.Load() }

// Run writes the identity whenever it changes, until ctx ends. A write
// that fails is logged (once per distinct error) and tried again.
func (w *Writer) Run(ctx context.Context) error {
	if err := os.MkdirAll(w.Dir, 0o755); err != nil { //nolint:gosec // the application container reads it
		return fmt.Errorf("certificate directory: %w", err)
	}
	var done uint64
	var lastErr string
	for {
		changed := w.State.Changed()
		snap := w.State.Snapshot()
		retry := (<-chan time.Time)(nil)
		if snap.Ready() && snap.Version != done {
			if err := w.write(snap); err != nil {
				if err.Error() != lastErr {
					w.Log.Error("writing the certificate files; trying again", "dir", w.Dir, "error", err)
					lastErr = err.Error()
				}
				retry = time.After(time.Second)
			} else {
				done, lastErr = snap.Version, ""
				w.written.Store(true)
				w.Log.Info("certificate files written", "dir", w.Dir, "expires", snap.Leaf.NotAfter)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-retry:
		}
	}
}

// mode is the files' mode.
func (w *Writer) mode() os.FileMode {
	if w.Shared {
		return 0o644
	}
	return 0o600
}

func (w *Writer) write(snap Snapshot) error {
	version := ".." + strconv.FormatUint(snap.Version, 10) + "_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	dir := filepath.Join(w.Dir, version)
	if err := os.Mkdir(dir, 0o755); err != nil { //nolint:gosec // as above
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{ChainFile, snap.ChainPEM, w.mode()}, {KeyFile, snap.KeyPEM, w.mode()}, {RootsFile, snap.RootsPEM, w.mode()}} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return errors.Join(err, os.RemoveAll(dir))
		}
		if err := os.Chmod(filepath.Join(dir, f.name), f.mode); err != nil { // umask may have narrowed it
			return errors.Join(err, os.RemoveAll(dir))
		}
	}
	tmp := filepath.Join(w.Dir, dataLink+"_tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(version, tmp); err != nil {
		return errors.Join(err, os.RemoveAll(dir))
	}
	if err := os.Rename(tmp, filepath.Join(w.Dir, dataLink)); err != nil {
		return errors.Join(err, os.RemoveAll(dir))
	}
	for _, name := range []string{ChainFile, KeyFile, RootsFile} {
		link := filepath.Join(w.Dir, name)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join(dataLink, name) {
			continue
		}
		_ = os.Remove(link)
		if err := os.Symlink(filepath.Join(dataLink, name), link); err != nil {
			return err
		}
	}
	// Older versions go once the new one is in place.
	entries, err := os.ReadDir(w.Dir)
	if err != nil {
		return nil //nolint:nilerr // the new files are in place; cleaning up waits for the next write
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "..") && e.Name() != version {
			_ = os.RemoveAll(filepath.Join(w.Dir, e.Name()))
		}
	}
	return nil
}
