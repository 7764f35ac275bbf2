package pemcerts

import (
	"errors"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

func TestABundleYieldsItsCertificatesInOrderAndNothingElse(t *testing.T) {
	a, err := testpki.NewCA("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := testpki.NewCA("b")
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
	got, err := Parse(append(append(append([]byte{}, a.CertPEM...), key...), b.CertPEM...))
	if err != nil || len(got) != 2 || !got[0].Equal(a.Cert) || !got[1].Equal(b.Cert) {
		t.Fatalf("%v %v", got, err)
	}
	for name, in := range map[string][]byte{"empty": nil, "no certificate": key, "garbage": []byte("not pem")} {
		if _, err := Parse(in); !errors.Is(err, ErrNone) {
			t.Errorf("%s: %v, want ErrNone", name, err)
		}
	}
	broken := []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
	if _, err := Parse(broken); err == nil || errors.Is(err, ErrNone) {
		t.Errorf("a broken certificate: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		certs, err := Parse(b)
		if (err == nil) != (len(certs) > 0) {
			t.Fatalf("%d certificates with error %v", len(certs), err)
		}
	})
}
