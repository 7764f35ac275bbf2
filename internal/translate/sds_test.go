package translate

import (
	"net/netip"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

func TestSecretsGoOnlyToProxiesVerifiedInTheirNamespace(t *testing.T) {
	s := model.NewStore()
	for _, c := range []*registryv1.Credential{
		{Namespace: "edge", Name: "shop-cert", CertificateChain: []byte("chain"), PrivateKey: []byte("key"), CaCertificates: []byte("ca")},
		{Namespace: "edge", Name: "partner", CertificateChain: []byte("pchain"), PrivateKey: []byte("pkey")},
		{Namespace: "edge", Name: "partner-cacert", CertificateChain: []byte("pca")},
		{Namespace: "other", Name: "theirs", CertificateChain: []byte("c"), PrivateKey: []byte("k")},
	} {
		body, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Put(registry.CredentialTypeURL, registry.CredentialName(c.GetNamespace(), c.GetName()), model.Meta{}, body); err != nil {
			t.Fatal(err)
		}
	}
	pc, _ := s.Build(model.BuildOptions{}, nil, 1)
	names := []string{
		"kubernetes://shop-cert", "kubernetes://shop-cert-cacert", "kubernetes://partner", "kubernetes://partner-cacert",
		"kubernetes://edge/shop-cert", "kubernetes://other/theirs", "kubernetes://theirs", "default", "kubernetes://missing",
		// The Gateway API's names: qualified, and of the proxy's namespace
		// only (another's, which a ReferenceGrant allows in Istio, is
		// not served).
		"kubernetes-gateway://edge/shop-cert", "kubernetes-gateway://other/theirs", "kubernetes-gateway://shop-cert",
	}
	for _, tc := range []struct {
		verified string
		want     map[string]string // name → chain, key or CA
	}{
		{"edge", map[string]string{
			"kubernetes://shop-cert": "chain/key", "kubernetes://shop-cert-cacert": "ca", "kubernetes://partner": "pchain/pkey",
			"kubernetes://partner-cacert": "pca", "kubernetes://edge/shop-cert": "chain/key", "kubernetes-gateway://edge/shop-cert": "chain/key",
		}},
		{"", map[string]string{}},     // plaintext: no identity, no secret
		{"shop", map[string]string{}}, // another namespace's proxy
		{"other", map[string]string{"kubernetes://other/theirs": "c/k", "kubernetes://theirs": "c/k", "kubernetes-gateway://other/theirs": "c/k"}},
	} {
		p := &model.Proxy{Type: model.RouterProxy, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Namespace: "edge", VerifiedNamespace: tc.verified}
		got := map[string]string{}
		for _, sec := range NewGenerator(pc, p).Secrets(names) {
			if err := Validate(sec); err != nil {
				t.Fatalf("secret %s: %v", sec.GetName(), err)
			}
			if c := sec.GetTlsCertificate(); c != nil {
				got[sec.GetName()] = string(c.GetCertificateChain().GetInlineBytes()) + "/" + string(c.GetPrivateKey().GetInlineBytes())
			} else {
				got[sec.GetName()] = string(sec.GetValidationContext().GetTrustedCa().GetInlineBytes())
			}
		}
		if len(got) != len(tc.want) {
			t.Errorf("verified %q: %v, want %v", tc.verified, got, tc.want)
			continue
		}
		for n, v := range tc.want {
			if got[n] != v {
				t.Errorf("verified %q: %s = %q, want %q", tc.verified, n, got[n], v)
			}
		}
	}
	if got := NewGenerator(pc, &model.Proxy{Type: model.RouterProxy, Namespace: "edge", VerifiedNamespace: "edge", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}).Secrets(nil); len(got) != 0 {
		t.Errorf("a wildcard request got %d secrets", len(got))
	}
	// A proxy whose account may not read its namespace's Secrets
	// (Istio's SubjectAccessReview, discovery's SetSecretsRefused) gets
	// none, and the reason is a problem reported.
	refused := &model.Proxy{Type: model.RouterProxy, Namespace: "edge", VerifiedNamespace: "edge", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}
	refused.SetSecretsRefused("edge/intruder may not list secrets")
	gen := NewGenerator(pc, refused)
	if got := gen.Secrets(names); len(got) != 0 {
		t.Errorf("a proxy refused its Secrets got %d", len(got))
	}
	if p := gen.Problems(); len(p) != 1 || p[0] != "credentials withheld: edge/intruder may not list secrets" {
		t.Errorf("problems %q, want the refusal", p)
	}
}
