package bugreport

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

func TestPrivateKeysAndTokensAreScrubbedAndTheRestKept(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(testpki.Request{CommonName: "w", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	jwt := "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"
	in := "cert:\n" + string(leaf.CertPEM) + "key:\n" + string(leaf.KeyPEM) + "rsa:\n-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n" +
		"Authorization: Bearer " + jwt + "\nname: eyJ-short\n"
	out := string(Redact([]byte(in)))
	if strings.Contains(out, "PRIVATE KEY") || strings.Contains(out, jwt) {
		t.Errorf("a key or token is left:\n%s", out)
	}
	for _, want := range []string{string(leaf.CertPEM), "[redacted private key]\nrsa:\n[redacted private key]\n", "Bearer [redacted token]\n", "name: eyJ-short\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

func TestTheArchiveHoldsEachFileScrubbedAndSaysWhatFailed(t *testing.T) {
	var buf bytes.Buffer
	r := newReport(&buf, time.Unix(0, 0))
	r.Add("version.txt", []byte("client version: 1\n"))
	r.Add("logs/"+fileName("../../etc/passwd"), []byte("-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n"))
	r.Fail("galley's configuration", errors.New("galley answered 0 of 20 collections"))
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	got := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = string(b)
	}
	want := map[string]string{
		"bug-report/version.txt":           "client version: 1\n",
		"bug-report/logs/.._.._etc_passwd": "[redacted private key]\n",
		"bug-report/errors.txt":            "galley's configuration: galley answered 0 of 20 collections\n",
	}
	if len(got) != len(want) {
		t.Errorf("files %q, want %q", got, want)
	}
	for name, body := range want {
		if got[name] != body {
			t.Errorf("%s: %q, want %q", name, got[name], body)
		}
	}
}

// FuzzRedact: scrubbing never panics, and leaves no whole PEM private key
// block behind.
func FuzzRedact(f *testing.F) {
	f.Add([]byte("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n"))
	f.Add([]byte("Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"))
	f.Fuzz(func(t *testing.T, data []byte) {
		out := Redact(data)
		if privateKey.Match(out) {
			t.Fatalf("a private key block is left in %q", out)
		}
	})
}
