package proxyconfig

import (
	"crypto/x509"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	wasmhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

func TestClusterNamesSplitAsIstioctlSplitsThem(t *testing.T) {
	for name, want := range map[string][4]string{
		"outbound|80|v1|reviews.default.svc.cluster.local": {"outbound", "80", "v1", "reviews.default.svc.cluster.local"},
		"inbound|9080||":                    {"inbound", "9080", "", ""},
		"BlackHoleCluster":                  {"", "", "", "BlackHoleCluster"},
		"outbound_.80_.v1_.reviews.default": {"", "", "", "outbound_.80_.v1_.reviews.default"},
		"sideways|80|v1|reviews":            {"", "", "", "sideways|80|v1|reviews"},
	} {
		d, p, s, f := clusterName(name)
		if got := [4]string{d, p, s, f}; got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
}

func TestASecretShowsItsSerialValidityAndIdentityNeverItsKey(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.Request{CommonName: "gw", DNSNames: []string{"bookinfo.example.com"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	inline := func(b []byte) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
	}
	now := time.Now()
	cert := secretRow(&tlsv3.Secret{Name: "kubernetes://bookinfo", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: inline(leaf.CertPEM), PrivateKey: inline([]byte("[redacted]")),
	}}}, now)
	want := []string{
		"kubernetes://bookinfo", "Cert Chain", "ACTIVE", "true", leaf.Cert.SerialNumber.Text(16),
		leaf.Cert.NotAfter.UTC().Format(time.RFC3339), leaf.Cert.NotBefore.UTC().Format(time.RFC3339), "bookinfo.example.com",
	}
	if !slices.Equal(cert, want) {
		t.Fatalf("certificate row %q, want %q", cert, want)
	}
	if later := secretRow(&tlsv3.Secret{Name: "x", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{CertificateChain: inline(leaf.CertPEM)}}}, now.Add(2*time.Hour)); later[3] != "false" {
		t.Fatalf("an expired certificate: %q", later)
	}
	root := secretRow(&tlsv3.Secret{Name: "kubernetes://bookinfo-cacert", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: inline(ca.CertPEM),
	}}}, now)
	if root[1] != "ROOTCA" || root[3] != "true" {
		t.Fatalf("CA row %q", root)
	}
	if bad := secretRow(&tlsv3.Secret{Name: "b", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{CertificateChain: inline([]byte("garbage"))}}}, now); bad[2] != "NOT PEM" {
		t.Fatalf("garbage row %q", bad)
	}
}

func TestExtensionConfigurationsShowTheirNameTypeAndTheEnvoyFilterThatAddedThem(t *testing.T) {
	wasm, err := anypb.New(&wasmhttpv3.Wasm{})
	if err != nil {
		t.Fatal(err)
	}
	d := &Dump{
		ExtensionConfigs: []*corev3.TypedExtensionConfig{
			{Name: "extensions.istio.io/trafficextension/bookinfo.auth", TypedConfig: wasm},
			{Name: "ecds-added", TypedConfig: wasm},
		},
		PatchedBy: map[string][]string{"extension configuration/ecds-added": {"bookinfo/lua"}},
	}
	var b strings.Builder
	if err := Print(&b, d, []string{"ecds"}, Filters{}, "short", time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"NAME", "TYPE", "ENVOYFILTERS",
		"extensions.istio.io/trafficextension/bookinfo.auth", "envoy.extensions.filters.http.wasm.v3.Wasm",
		"bookinfo/lua",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := Print(&b, d, []string{"ecds"}, Filters{Name: "ecds-added"}, "json", time.Now()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "bookinfo.auth") || !strings.Contains(b.String(), `"name": "ecds-added"`) {
		t.Errorf("--name ecds-added -o json:\n%s", b.String())
	}
}

// A route shows the VirtualService it came from, as istioctl shows it
// (the route's "istio" filter metadata); one generated from the Gateway
// API shows the rule it came from, as Istio names it.
func TestARouteShowsTheVirtualServiceOrGatewayAPIRuleItCameFrom(t *testing.T) {
	meta := func(path string) *corev3.Metadata {
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"istio": {Fields: map[string]*structpb.Value{"config": structpb.NewStringValue(path)}},
		}}
	}
	rc := &routev3.RouteConfiguration{Name: "80", VirtualHosts: []*routev3.VirtualHost{{
		Name: "reviews:80", Domains: []string{"reviews"},
		Routes: []*routev3.Route{
			{
				Name: "r1", Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Metadata: meta("/apis/networking.istio.io/v1/namespaces/bookinfo/virtual-service/reviews"),
			},
			{
				Name: "shop.cart.0", Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/cart"}},
				Metadata: meta("/apis/networking.istio.io/v1/namespaces/shop/virtual-service/edge~web~istio-autogenerated-k8s-gateway~http~shop.example.com"),
			},
		},
	}}}
	rows := routeRows(rc)
	if len(rows) != 2 || rows[0][4] != "reviews.bookinfo" || rows[1][4] != "shop.cart.0 (Gateway API)" {
		t.Fatalf("rows %q", rows)
	}
}

// Routes that differ only by a header (the demo's x-version pins) show
// the header in MATCH, where istioctl's table shows them all as /*.
func TestRoutesThatDifferByAHeaderShowTheHeader(t *testing.T) {
	exact := func(name, v string) *routev3.HeaderMatcher {
		return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v},
		}}}
	}
	prefix := &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
	withHeaders := func(hs ...*routev3.HeaderMatcher) *routev3.RouteMatch {
		return &routev3.RouteMatch{PathSpecifier: prefix.GetPathSpecifier(), Headers: hs}
	}
	for _, tc := range []struct {
		match *routev3.RouteMatch
		want  string
	}{
		{withHeaders(exact("x-version", "v1")), "/* header x-version=v1"},
		{withHeaders(exact("x-version", "v2")), "/* header x-version=v2"},
		{prefix, "/*"},
		{&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: "/login"}}, "/login"},
		{&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/cart"}}, "PathPrefix:/cart"},
		{withHeaders(&routev3.HeaderMatcher{Name: "end-user", InvertMatch: true, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "jas"},
		}}}), "/* header !end-user=jas*"},
		{withHeaders(&routev3.HeaderMatcher{Name: "x-debug", HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}), "/* header x-debug"},
		{&routev3.RouteMatch{PathSpecifier: prefix.GetPathSpecifier(), QueryParameters: []*routev3.QueryParameterMatcher{{
			Name: "v", QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
				MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "v[12]"}},
			}},
		}}}, "/* query v~v[12]"},
	} {
		if got := routeMatch(tc.match); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.match, got, tc.want)
		}
	}
	empty := routeRows(&routev3.RouteConfiguration{Name: "80", VirtualHosts: []*routev3.VirtualHost{{Name: "x:80", Domains: []string{"x"}}}})
	if want := []string{"80", "x:80", "x", "/*", "404"}; !slices.Equal(empty[0], want) {
		t.Errorf("a virtual host without routes: %q, want %q", empty[0], want)
	}
}

// Domains are shown as istioctl shows them: no ports, a short name's
// longer forms left out, two and a count of the rest.
func TestRouteDomainsAreShortenedAsIstioctlShortensThem(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{nil, "-"},
		{[]string{"*"}, "*"},
		{[]string{"reviews.bookinfo.svc.cluster.local", "reviews.bookinfo.svc.cluster.local:9080", "reviews", "reviews.bookinfo", "reviews.bookinfo.svc", "10.0.0.1", "10.0.0.1:9080"}, "reviews, reviews.bookinfo + 1 more..."},
		{[]string{"[fd00:10:96::7fc7]", "[fd00:10:96::7fc7]:8090", "a"}, "[fd00:10:96::7fc7], a"},
	} {
		if got := routeDomains(tc.in); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Two trust bundles let their proxies talk when they share a root, as
// istioctl's rootca-compare decides: during a root's rotation a bundle
// holds both.
func TestTwoBundlesShareARootWhenAnyCertificateIsInBoth(t *testing.T) {
	oldCA, err := testpki.NewCA("old")
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := testpki.NewCA("new")
	if err != nil {
		t.Fatal(err)
	}
	old, both, fresh := []*x509.Certificate{oldCA.Cert}, []*x509.Certificate{newCA.Cert, oldCA.Cert}, []*x509.Certificate{newCA.Cert}
	if !shareARoot(old, both) || !shareARoot(both, fresh) || shareARoot(old, fresh) {
		t.Fatal("rotation: the old and the new roots share none, each shares one with the bundle holding both")
	}
	roots, ok := rootsOf([]*tlsv3.Secret{
		{Name: "default", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{}}},
		{Name: "ROOTCA", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: oldCA.CertPEM}},
		}}},
	})
	if !ok || string(roots) != string(oldCA.CertPEM) {
		t.Fatalf("the ROOTCA of an agent's secrets: %q %v", roots, ok)
	}
	if _, ok := rootsOf(nil); ok {
		t.Fatal("an agent without secrets has no ROOTCA")
	}
}
