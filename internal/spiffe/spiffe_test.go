package spiffe

import (
	"crypto/x509"
	"net/url"
	"testing"
)

func TestParseAcceptsOnlyIstioWorkloadIDs(t *testing.T) {
	want := ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "cart"}
	got, err := Parse("spiffe://cluster.local/ns/shop/sa/cart")
	if err != nil || got != want || got.String() != "spiffe://cluster.local/ns/shop/sa/cart" {
		t.Fatalf("Parse = %+v, %v", got, err)
	}
	for _, bad := range []string{
		"", "https://cluster.local/ns/a/sa/b", "spiffe:///ns/a/sa/b", "spiffe://td/ns/a", "spiffe://td/ns//sa/b",
		"spiffe://td/ns/a/sa/b/c", "spiffe://td/sa/b/ns/a", "spiffe://td/ns/a/sa/b?x=1", "spiffe://td/ns/a/sa/b#f", "spiffe://u@td/ns/a/sa/b",
	} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestFromCertificateWantsExactlyOneSPIFFEURI(t *testing.T) {
	u1, _ := url.Parse("spiffe://td/ns/a/sa/b")
	u2, _ := url.Parse("spiffe://td/ns/c/sa/d")
	if id, err := FromCertificate(&x509.Certificate{URIs: []*url.URL{u1}}); err != nil || id.Namespace != "a" {
		t.Fatalf("one URI: %+v, %v", id, err)
	}
	for name, c := range map[string]*x509.Certificate{"nil": nil, "none": {}, "two": {URIs: []*url.URL{u1, u2}}} {
		if _, err := FromCertificate(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
