package wasm

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The test binary run with these is an OCI registry: it serves on
// 127.0.0.1, writes its address to the file, and exits when its stdin
// closes (its parent's end).
const (
	registryAddrFileEnv = "FLOTILLA_TEST_OCI_REGISTRY_ADDR_FILE"
	// registryAuthEnv, user:password, makes it require basic auth.
	registryAuthEnv = "FLOTILLA_TEST_OCI_REGISTRY_AUTH"
)

func TestMain(m *testing.M) {
	if file := os.Getenv(registryAddrFileEnv); file != "" {
		if err := serveRegistry(file, os.Getenv(registryAuthEnv)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func serveRegistry(file, auth string) error {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if auth != "" {
		user, pass, _ := strings.Cut(auth, ":")
		h = basicAuth(h, user, pass)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = srv.Close()
	}()
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(lis.Addr().String()), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		return err
	}
	if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func basicAuth(h http.Handler, user, pass string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(pass)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="flotilla-test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// startRegistry runs a registry in a subprocess (basic auth with
// user:password when auth is set) and returns its host:port.
func startRegistry(t *testing.T, auth string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "addr")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), registryAddrFileEnv+"="+file, registryAuthEnv+"="+auth)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for range 1000 {
		if addr, err := os.ReadFile(file); err == nil {
			return string(addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the registry did not start")
	return ""
}

// wasmModule is a distinct module: the header and n random bytes.
func wasmModule(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, 8+n)
	copy(b, "\x00asm\x01\x00\x00\x00")
	if _, err := rand.Read(b[8:]); err != nil {
		t.Fatal(err)
	}
	return b
}

// artifactImage is the Wasm image specification's "oci" variant.
func artifactImage(t *testing.T, module []byte) v1.Image {
	t.Helper()
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1),
		mutate.Addendum{Layer: static.NewLayer(module, wasmLayer)})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

type tarFile struct {
	name string
	data []byte
}

func tarGz(t *testing.T, files ...tarFile) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// compatImage is the "compat" variant: a Docker image whose one layer is
// a tar.gz holding plugin.wasm (not as its first file).
func compatImage(t *testing.T, module []byte) v1.Image {
	t.Helper()
	layer := tarGz(t, tarFile{"./README", []byte("hi")}, tarFile{"./" + pluginFile, module})
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.DockerManifestSchema2),
		mutate.Addendum{Layer: static.NewLayer(layer, types.DockerLayer)})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// push writes img as ref (host/repo:tag) and returns its digest's hex.
func push(t *testing.T, ref string, img v1.Image, auth authn.Authenticator) string {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	opts := []remote.Option{remote.WithContext(ctx)}
	if auth != nil {
		opts = append(opts, remote.WithAuth(auth))
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.Hex
}
