package translate

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/anypb"
	networking "istio.io/api/networking/v1alpha3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
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
		{Namespace: "certs", Name: "shared", CertificateChain: []byte("s"), PrivateKey: []byte("sk")},
		{Namespace: "certs", Name: "shop-only", CertificateChain: []byte("o"), PrivateKey: []byte("ok")},
	} {
		body, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Put(registry.CredentialTypeURL, registry.CredentialName(c.GetNamespace(), c.GetName()), model.Meta{}, body); err != nil {
			t.Fatal(err)
		}
	}
	// Gateway API certificates go to a gateway only as a Gateway of its
	// own namespace selecting it names them (Istio's
	// VerifiedCertificateReferences): edge's Gateway names shop-cert,
	// validating clients (so its CA too); a Gateway of another namespace
	// selecting the same proxies names partner, which is therefore not
	// verified; other's Gateway names theirs for other's gateways.
	kinds := kindsByName()
	// edge's Gateway also has certs/shared, which a ReferenceGrant admits
	// (galley's conversion says so in AnnotationGrantedCredentials); the
	// shop Gateway claims certs/shop-only the same way, but is not of
	// the proxy's namespace.
	for _, g := range []struct{ ns, cred, granted string }{
		{"edge", "kubernetes-gateway://edge/shop-cert", "kubernetes-gateway://certs/shared"},
		{"shop", "kubernetes-gateway://edge/partner", "kubernetes-gateway://certs/shop-only"},
		{"other", "kubernetes-gateway://other/theirs", ""},
	} {
		var annotations map[string]string
		if g.granted != "" {
			annotations = map[string]string{model.AnnotationGrantedCredentials: g.granted}
		}
		s.PutObject(&istio.Object{Kind: kinds[istio.Gateway], Meta: istio.Meta{Name: "gw", Namespace: g.ns, Annotations: annotations}, Spec: &networking.Gateway{
			Selector: map[string]string{"istio": "ingress"},
			Servers: []*networking.Server{{
				Port: &networking.Port{Number: 443, Name: "https", Protocol: "HTTPS"}, Hosts: []string{"*"},
				Tls: &networking.ServerTLSSettings{Mode: networking.ServerTLSSettings_MUTUAL, CredentialName: g.cred},
			}},
		}})
	}
	pc, _ := s.Build(model.BuildOptions{}, nil, 1)
	names := []string{
		"kubernetes://shop-cert", "kubernetes://shop-cert-cacert", "kubernetes://partner", "kubernetes://partner-cacert",
		"kubernetes://edge/shop-cert", "kubernetes://other/theirs", "kubernetes://theirs", "default", "kubernetes://missing",
		// The Gateway API's names: qualified, of the proxy's namespace
		// only (another's, which a ReferenceGrant allows in Istio, is
		// not served), and named by a Gateway of that namespace.
		"kubernetes-gateway://edge/shop-cert", "kubernetes-gateway://edge/shop-cert-cacert", "kubernetes-gateway://edge/partner",
		"kubernetes-gateway://other/theirs", "kubernetes-gateway://shop-cert",
		"kubernetes-gateway://certs/shared", "kubernetes-gateway://certs/shop-only",
	}
	for _, tc := range []struct {
		verified string
		want     map[string]string // name → chain, key or CA
	}{
		{"edge", map[string]string{
			"kubernetes://shop-cert": "chain/key", "kubernetes://shop-cert-cacert": "ca", "kubernetes://partner": "pchain/pkey",
			"kubernetes://partner-cacert": "pca", "kubernetes://edge/shop-cert": "chain/key", "kubernetes-gateway://edge/shop-cert": "chain/key",
			"kubernetes-gateway://edge/shop-cert-cacert": "ca", "kubernetes-gateway://certs/shared": "s/sk",
		}},
		{"", map[string]string{}}, // plaintext: no identity, no secret
		// Another namespace's proxy: only what its own namespace's
		// Gateway has granted (edge/partner, named there but not
		// granted, it does not get).
		{"shop", map[string]string{"kubernetes-gateway://certs/shop-only": "o/ok"}},
		{"other", map[string]string{"kubernetes://other/theirs": "c/k", "kubernetes://theirs": "c/k", "kubernetes-gateway://other/theirs": "c/k"}},
	} {
		p := &model.Proxy{
			Type: model.RouterProxy, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Namespace: "edge", VerifiedNamespace: tc.verified,
			Labels: map[string]string{"istio": "ingress"},
		}
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
	// no credentialName Secret, and the reason is a problem reported; the
	// Gateway API's verified certificates it gets all the same, as Istio
	// checks them by reference, not by RBAC.
	refused := &model.Proxy{
		Type: model.RouterProxy, Namespace: "edge", VerifiedNamespace: "edge", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		Labels: map[string]string{"istio": "ingress"},
	}
	refused.SetSecretsRefused("edge/intruder may not list secrets")
	gen := NewGenerator(pc, refused)
	var got []string
	for _, sec := range gen.Secrets(names) {
		got = append(got, sec.GetName())
	}
	if want := []string{"kubernetes-gateway://certs/shared", "kubernetes-gateway://edge/shop-cert", "kubernetes-gateway://edge/shop-cert-cacert"}; !slices.Equal(got, want) {
		t.Errorf("a proxy refused its Secrets got %q, want only %q", got, want)
	}
	// A sidecar is no gateway: no Gateway API certificate, whatever
	// selects its labels.
	sidecar := &model.Proxy{
		Type: model.SidecarProxy, Namespace: "edge", VerifiedNamespace: "edge", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		Labels: map[string]string{"istio": "ingress"},
	}
	if got := NewGenerator(pc, sidecar).Secrets([]string{"kubernetes-gateway://edge/shop-cert"}); len(got) != 0 {
		t.Errorf("a sidecar got %d Gateway API certificates", len(got))
	}
	if p := gen.Problems(); len(p) != 1 || p[0] != "credentials withheld: edge/intruder may not list secrets" {
		t.Errorf("problems %q, want the refusal", p)
	}
}

// A Gateway API listener validating clients names its CA by
// caCertCredentialName, a Secret's "-cacert": the server's validation
// context asks SDS for that name, which the gateway gets as its own
// Gateway names it, from a Secret or from a ConfigMap galley published
// ("configmap://"). A ConfigMap's CA is public as in Istio
// (filterAuthorizedResources): another namespace's is served too, but
// only by its "-cacert" name.
func TestAGatewayAPIListenerValidatesClientsWithItsCACertificateRef(t *testing.T) {
	kinds := kindsByName()
	for _, tc := range []struct {
		ca         string
		certs      []string // credentialNames; none: credentialName shop-cert
		wantCA     string   // the validation context's SDS name; "" none
		wantBundle string   // what SDS serves for it
	}{
		{ca: "kubernetes-gateway://edge/client-ca-cacert", wantCA: "kubernetes-gateway://edge/client-ca-cacert", wantBundle: "clients"},
		{ca: "", wantCA: "kubernetes-gateway://edge/shop-cert-cacert", wantBundle: "own"},
		// Two certificateRefs (an RSA and an ECDSA certificate): both
		// served, the first's CA validating.
		{
			certs:  []string{"kubernetes-gateway://edge/shop-cert", "kubernetes-gateway://edge/shop-ecdsa"},
			wantCA: "kubernetes-gateway://edge/shop-cert-cacert", wantBundle: "own",
		},
		{ca: "configmap://edge/client-ca-cacert", wantCA: "configmap://edge/client-ca-cacert", wantBundle: "from the ConfigMap"},
	} {
		s := model.NewStore()
		for _, c := range []*registryv1.Credential{
			{Namespace: "edge", Name: "shop-cert", CertificateChain: []byte("chain"), PrivateKey: []byte("key"), CaCertificates: []byte("own")},
			{Namespace: "edge", Name: "client-ca", CaCertificates: []byte("clients")},
			{Namespace: "edge", Name: "client-ca", CaCertificates: []byte("from the ConfigMap"), ConfigMap: true},
			{Namespace: "other", Name: "client-ca", CaCertificates: []byte("another namespace's"), ConfigMap: true},
		} {
			body, err := anypb.New(c)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Put(registry.CredentialTypeURL, registry.CredentialResourceName(c), model.Meta{}, body); err != nil {
				t.Fatal(err)
			}
		}
		s.PutObject(&istio.Object{Kind: kinds[istio.Gateway], Meta: istio.Meta{Name: "gw", Namespace: "edge"}, Spec: &networking.Gateway{
			Selector: map[string]string{"istio": "ingress"},
			Servers: []*networking.Server{{
				Port: &networking.Port{Number: 443, Name: "https", Protocol: "HTTPS"}, Hosts: []string{"*"},
				Tls: tlsSettings(tc.ca, tc.certs),
			}},
		}})
		pc, _ := s.Build(model.BuildOptions{}, nil, 1)
		p := &model.Proxy{
			Type: model.RouterProxy, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Namespace: "edge", VerifiedNamespace: "edge",
			Labels: map[string]string{"istio": "ingress"},
		}
		gen := NewGenerator(pc, p)
		var sds, certs []string
		for _, l := range gen.Listeners(nil) {
			if err := Validate(l); err != nil {
				t.Fatal(err)
			}
			for _, fc := range l.GetFilterChains() {
				ts := &tlsv3.DownstreamTlsContext{}
				if fc.GetTransportSocket() == nil {
					continue
				}
				if err := fc.GetTransportSocket().GetTypedConfig().UnmarshalTo(ts); err != nil {
					t.Fatal(err)
				}
				sds = append(sds, ts.GetCommonTlsContext().GetCombinedValidationContext().GetValidationContextSdsSecretConfig().GetName())
				for _, c := range ts.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs() {
					certs = append(certs, c.GetName())
				}
			}
		}
		problems := strings.Join(gen.Problems(), "\n")
		wantCerts := tc.certs
		if wantCerts == nil {
			wantCerts = []string{"kubernetes-gateway://edge/shop-cert"}
		}
		if !slices.Equal(certs, wantCerts) {
			t.Errorf("CA %q: certificates %q, want %q", tc.ca, certs, wantCerts)
		}
		if !slices.Equal(sds, []string{tc.wantCA}) {
			t.Errorf("CA %q: validation from %q, want %q (problems %q)", tc.ca, sds, tc.wantCA, problems)
		}
		if got := gen.Secrets([]string{tc.wantCA}); len(got) != 1 || string(got[0].GetValidationContext().GetTrustedCa().GetInlineBytes()) != tc.wantBundle {
			t.Errorf("CA %q: the gateway got %v for %s, want the bundle %q", tc.ca, got, tc.wantCA, tc.wantBundle)
		}
		if got := gen.Secrets([]string{"configmap://other/client-ca-cacert", "configmap://edge/client-ca"}); len(got) != 1 ||
			got[0].GetName() != "configmap://other/client-ca-cacert" || string(got[0].GetValidationContext().GetTrustedCa().GetInlineBytes()) != "another namespace's" {
			t.Errorf("CA %q: the gateway got %v for another namespace's ConfigMap and a name without -cacert, want the first only", tc.ca, got)
		}
	}
}

func tlsSettings(ca string, certs []string) *networking.ServerTLSSettings {
	t := &networking.ServerTLSSettings{Mode: networking.ServerTLSSettings_MUTUAL, CaCertCredentialName: ca, CredentialNames: certs}
	if certs == nil {
		t.CredentialName = "kubernetes-gateway://edge/shop-cert"
	}
	return t
}

// A ListenerSet's certificates go to its parent Gateway's gateway (Istio's
// mergeGateways for a ListenerSet: the set's own namespace's Secrets,
// trusted because the parent's allowedListeners admitted the set, and
// those a ReferenceGrant from ListenerSets admits), and to no proxy
// verified in another namespace — not even the set's own.
func TestAListenerSetsCertificatesGoToItsParentGatewaysProxyOnly(t *testing.T) {
	store, proxies, opts := loadCase(t, "testdata/gateway-api-listener-set/input.yaml")
	pc, _ := store.Build(opts, nil, 1)
	names := []string{"kubernetes-gateway://team-a/secure-cert", "kubernetes-gateway://certs/shared-cert", "kubernetes-gateway://edge/secure-cert"}
	for _, tc := range []struct {
		proxy, verified string
		want            []string
	}{
		{"web-flotilla-abc.edge", "edge", []string{"kubernetes-gateway://certs/shared-cert", "kubernetes-gateway://team-a/secure-cert"}},
		{"web-flotilla-abc.edge", "team-a", nil},
		{"other-abc.edge", "edge", nil},
	} {
		var p *model.Proxy
		for _, cp := range proxies {
			if cp.ID == tc.proxy {
				p = cp.Proxy
			}
		}
		if p == nil {
			t.Fatalf("no proxy %s in the case", tc.proxy)
		}
		verified := &model.Proxy{
			Type: p.Type, IPs: p.IPs, ID: p.ID, DNSDomain: p.DNSDomain, Namespace: p.Namespace, Labels: p.Labels,
			VerifiedNamespace: tc.verified,
		}
		var got []string
		for _, sec := range NewGenerator(pc, verified).Secrets(names) {
			if err := Validate(sec); err != nil {
				t.Fatalf("secret %s: %v", sec.GetName(), err)
			}
			if len(sec.GetTlsCertificate().GetPrivateKey().GetInlineBytes()) == 0 {
				t.Errorf("secret %s has no key", sec.GetName())
			}
			got = append(got, sec.GetName())
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s verified in %q got %q, want %q", tc.proxy, tc.verified, got, tc.want)
		}
	}
}
