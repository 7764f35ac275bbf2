package wasm

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// wasmLayer is the layer of an OCI artifact holding the module as it is
// (the "oci" variant of the Wasm image specification).
const wasmLayer types.MediaType = "application/vnd.module.wasm.content.layer.v1+wasm"

// pluginFile is the module's name in the layer of a container image (the
// "compat" variant).
const pluginFile = "plugin.wasm"

func (c *Cache) newRegistryTransport(dial func(context.Context, string, string) (net.Conn, error), insecure bool) http.RoundTripper {
	return registryGuard{c: c, inner: newTransport(dial, insecure)}
}

// resolveImage fetches the image's manifest, and returns the image and its
// digest, the sha256 Istio checks (Istio's ImageFetcher.PrepareFetch).
func (c *Cache) resolveImage(ctx context.Context, u *url.URL, secret []byte, insecure bool) (v1.Image, string, error) {
	var opts []name.Option
	t := c.registryTransport
	if insecure {
		opts = append(opts, name.Insecure)
		t = c.insecureTranspt
	}
	ref, err := name.ParseReference(u.Host+u.Path, opts...)
	if err != nil {
		return nil, "", fmt.Errorf("image reference: %w", err)
	}
	keys, err := parsePullSecret(secret)
	if err != nil {
		return nil, "", err
	}
	desc, err := remote.Get(ref, remote.WithContext(ctx), remote.WithTransport(t), remote.WithAuthFromKeychain(keys))
	if err != nil {
		return nil, "", fmt.Errorf("manifest: %w", err)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, "", fmt.Errorf("image: %w", err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, "", fmt.Errorf("image digest: %w", err)
	}
	if d.Algorithm != "sha256" {
		return nil, "", fmt.Errorf("image digest %s is not sha256", d)
	}
	return img, d.Hex, nil
}

// extractImage reads the module from either format Istio's imagefetcher
// reads: an artifact with a layer of the Wasm media type, or an image
// whose last layer is a tar (gzipped or not) holding plugin.wasm.
func (c *Cache) extractImage(img v1.Image) ([]byte, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if len(m.Layers) == 0 {
		return nil, errors.New("the image has no layers")
	}
	for _, l := range m.Layers {
		if l.MediaType == wasmLayer {
			return c.readLayer(img, l, false)
		}
	}
	last := m.Layers[len(m.Layers)-1]
	switch last.MediaType {
	case types.DockerLayer, types.OCILayer, types.DockerUncompressedLayer, types.OCIUncompressedLayer:
		return c.readLayer(img, last, true)
	}
	return nil, fmt.Errorf("no layer of type %s, and the last layer's type %s is not a tar", wasmLayer, last.MediaType)
}

// readLayer reads a layer's blob, as stored (the registry's digest is
// checked as it is read), and the module in it.
func (c *Cache) readLayer(img v1.Image, d v1.Descriptor, archive bool) ([]byte, error) {
	if d.Size > c.o.MaxModuleBytes {
		return nil, fmt.Errorf("layer %s: its %d bytes exceed the limit of %d", d.Digest, d.Size, c.o.MaxModuleBytes)
	}
	l, err := img.LayerByDigest(d.Digest)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", d.Digest, err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", d.Digest, err)
	}
	defer rc.Close()
	if !archive {
		data, err := readAtMost(rc, c.o.MaxModuleBytes)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", d.Digest, err)
		}
		return data, nil
	}
	data, err := c.fromTar(rc)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", d.Digest, err)
	}
	return data, nil
}

// fromTar finds plugin.wasm in a tar, gzipped or not.
func (c *Cache) fromTar(r io.Reader) ([]byte, error) {
	br := bufio.NewReader(r)
	var in io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, err
		}
		in = zr
	}
	tr := tar.NewReader(in)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("no %s in the layer", pluginFile)
		}
		if err != nil {
			return nil, err
		}
		if path.Base(h.Name) == pluginFile && h.Typeflag == tar.TypeReg {
			return readAtMost(tr, c.o.MaxModuleBytes)
		}
	}
}

// pullSecret is a keychain of a kubernetes.io/dockerconfigjson Secret's
// data; registries it does not name are reached anonymously (Istio's
// wasmKeyChain, without the docker CLI's files and helpers).
type pullSecret map[string]authn.AuthConfig

func parsePullSecret(data []byte) (authn.Keychain, error) {
	if data == nil {
		return pullSecret(nil), nil
	}
	var cfg struct {
		Auths map[string]authn.AuthConfig `json:"auths"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("the image pull secret is not a docker config: %w", err)
	}
	keys := pullSecret{}
	for k, a := range cfg.Auths {
		keys[registryHost(k)] = a
	}
	return keys, nil
}

// registryHost is a docker config key's host, as docker reads them
// ("https://index.docker.io/v1/" is index.docker.io).
func registryHost(key string) string {
	key = strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	host, _, _ := strings.Cut(key, "/")
	return host
}

func (k pullSecret) Resolve(r authn.Resource) (authn.Authenticator, error) {
	host := r.RegistryStr()
	a, ok := k[host]
	if !ok && host == name.DefaultRegistry {
		a, ok = k["docker.io"]
	}
	if !ok {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(a), nil
}
