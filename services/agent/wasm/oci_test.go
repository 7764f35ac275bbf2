package wasm

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
)

func TestAnOCIArtifactIsPulledByTagAndByDigest(t *testing.T) {
	reg := startRegistry(t, "")
	module := wasmModule(t, 200)
	digest := push(t, reg+"/plugins/artifact:v1", artifactImage(t, module), nil)
	c := newCache(t, func(o *Options) { o.InsecureRegistries = []string{reg} })
	path, err := c.Get(ctxOf(t), "oci://"+reg+"/plugins/artifact:v1", GetOptions{Checksum: digest})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustRead(t, path), module) || !strings.HasSuffix(path, digest+".wasm") {
		t.Fatalf("%s is not the module", path)
	}
	byDigest, err := c.Get(ctxOf(t), "oci://"+reg+"/plugins/artifact@sha256:"+digest, GetOptions{})
	if err != nil || byDigest != path {
		t.Fatalf("by digest: %s, %v", byDigest, err)
	}
}

func TestADockerImageHoldingPluginWasmIsPulled(t *testing.T) {
	reg := startRegistry(t, "")
	module := wasmModule(t, 200)
	digest := push(t, reg+"/plugins/compat:v1", compatImage(t, module), nil)
	c := newCache(t, func(o *Options) { o.InsecureRegistries = []string{"*"} })
	for _, u := range []string{"oci://" + reg + "/plugins/compat:v1", "oci://" + reg + "/plugins/compat@sha256:" + digest} {
		path, err := c.Get(ctxOf(t), u, GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if !bytes.Equal(mustRead(t, path), module) {
			t.Fatalf("%s: not the module", u)
		}
	}
}

func TestAnImageWhoseDigestDiffersIsRefused(t *testing.T) {
	reg := startRegistry(t, "")
	push(t, reg+"/plugins/artifact:v1", artifactImage(t, wasmModule(t, 10)), nil)
	c := newCache(t, func(o *Options) { o.InsecureRegistries = []string{reg} })
	_, err := c.Get(ctxOf(t), "oci://"+reg+"/plugins/artifact:v1", GetOptions{Checksum: sha([]byte("other"))})
	if err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("got %v", err)
	}
}

func TestAPlainHTTPRegistryNotListedAsInsecureIsRefused(t *testing.T) {
	reg := startRegistry(t, "")
	push(t, reg+"/plugins/artifact:v1", artifactImage(t, wasmModule(t, 10)), nil)
	c := newCache(t, func(o *Options) { o.InsecureRegistries = []string{"registry.example.com"} })
	_, err := c.Get(ctxOf(t), "oci://"+reg+"/plugins/artifact:v1", GetOptions{})
	if err == nil || !strings.Contains(err.Error(), "insecure registries") {
		t.Fatalf("got %v", err)
	}
}

func TestTheLatestTagIsPulledAgainOnANewResourceVersion(t *testing.T) {
	reg := startRegistry(t, "")
	ref := reg + "/plugins/artifact:latest"
	first, second := wasmModule(t, 10), wasmModule(t, 10)
	push(t, ref, artifactImage(t, first), nil)
	c := newCache(t, func(o *Options) { o.InsecureRegistries = []string{reg} })
	get := func(version string) []byte {
		t.Helper()
		p, err := c.Get(ctxOf(t), "oci://"+ref, GetOptions{ResourceName: "ns.p", ResourceVersion: version})
		if err != nil {
			t.Fatal(err)
		}
		return mustRead(t, p)
	}
	if !bytes.Equal(get("1"), first) {
		t.Fatal("not the first module")
	}
	push(t, ref, artifactImage(t, second), nil)
	if !bytes.Equal(get("1"), first) {
		t.Fatal("pulled again for the same version")
	}
	if !bytes.Equal(get("2"), second) {
		t.Fatal("not pulled again for a new version")
	}
}

func TestAPullSecretAuthenticatesToTheRegistry(t *testing.T) {
	reg := startRegistry(t, "puller:s3cret")
	module := wasmModule(t, 10)
	push(t, reg+"/private/p:v1", artifactImage(t, module), &authn.Basic{Username: "puller", Password: "s3cret"})
	c := newCache(t, func(o *Options) { o.InsecureRegistries = []string{reg} })
	u := "oci://" + reg + "/private/p:v1"
	secret := func(key, user, pass string) []byte {
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
		return fmt.Appendf(nil, `{"auths":{%q:{"auth":%q}}}`, key, auth)
	}
	if _, err := c.Get(ctxOf(t), u, GetOptions{}); err == nil {
		t.Fatal("pulled without credentials")
	}
	if _, err := c.Get(ctxOf(t), u, GetOptions{PullSecret: secret(reg, "puller", "wrong")}); err == nil {
		t.Fatal("pulled with a wrong password")
	}
	if _, err := c.Get(ctxOf(t), u, GetOptions{PullSecret: []byte("not json")}); err == nil || !strings.Contains(err.Error(), "docker config") {
		t.Fatalf("a malformed secret: %v", err)
	}
	path, err := c.Get(ctxOf(t), u, GetOptions{PullSecret: secret("http://"+reg+"/v1/", "puller", "s3cret")})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustRead(t, path), module) {
		t.Fatal("not the module")
	}
}
