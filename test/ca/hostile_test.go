package ca_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/flotilla-mesh/flotilla/test/proc"
)

// TestACSROfManyMebibytesIsRefusedBeforeItIsRead: 24 unauthenticated
// requests at once, each carrying a 15 MiB CSR (they once took ca from 53
// to 469 MiB), are refused with ResourceExhausted by the size of the
// message alone; a workload is served after them.
func TestACSROfManyMebibytesIsRefusedBeforeItIsRead(t *testing.T) {
	s := proc.NewSigner(t)
	c := startCA(t, t.TempDir(), s)
	pemRoots, err := os.ReadFile(filepath.Join(c.state, "roots.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemRoots)
	cc, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	huge := &securityv1alpha1.IstioCertificateRequest{Csr: strings.Repeat("A", 15<<20)}
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for range 24 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, err := securityv1alpha1.NewIstioCertificateServiceClient(cc).CreateCertificate(ctx, huge)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a 15 MiB CSR: %v, want ResourceExhausted", err)
		}
	}
	c.certificate(t, s.Token(t, "default", "app"))
}

// TestIdleConnectionsThatNeverHandshakeAreClosed: 100 TCP connections to
// ca that never start TLS (once held for as long as the peer liked) are
// closed by ca within its handshake timeout, and ca serves a workload.
func TestIdleConnectionsThatNeverHandshakeAreClosed(t *testing.T) {
	s := proc.NewSigner(t)
	c := startCA(t, t.TempDir(), s)
	conns := make([]net.Conn, 100)
	for i := range conns {
		conn, err := net.Dial("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns[i] = conn
	}
	deadline := time.Now().Add(30 * time.Second)
	for i, conn := range conns {
		if err := conn.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		_, err := conn.Read(make([]byte, 1))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection %d that never handshook was still open after 30 s", i)
		}
	}
	c.certificate(t, s.Token(t, "default", "app"))
}

// TestBadTokensFromOneAddressNeverShutOutAGenuineTokenFromIt: ca in
// cluster mode against the real apiserver. 300 garbage tokens from
// 127.0.0.1 (pods behind one node address would share it) put the address
// over its budget of failures; a new token of a workload there, never
// reviewed before, still gets its certificate, for the apiserver signed it;
// a token signed with another key is not reviewed (ResourceExhausted).
func TestBadTokensFromOneAddressNeverShutOutAGenuineTokenFromIt(t *testing.T) {
	ctx := t.Context()
	addrs, app, roots := clusterCAs(t, 1)
	addr := addrs[0]
	exhausted := 0
	for range 300 {
		_, err := request(t, addr, []byte(roots), "not.a.token")
		switch status.Code(err) {
		case codes.ResourceExhausted:
			exhausted++
		case codes.Unauthenticated:
		default:
			t.Fatalf("a garbage token: %v", err)
		}
	}
	if exhausted == 0 {
		t.Fatal("300 garbage tokens from one address were all reviewed")
	}
	// The address's budget refills at one failure a second: each check
	// below comes right after garbage has emptied it again, and is tried
	// anew (a few times at most) if the forged token, asked last, finds the
	// budget refilled in between — then the address was not over it.
	s := proc.NewSigner(t) // a key the apiserver never signed with
	overBudget := func() {
		t.Helper()
		for range 100 {
			if _, err := request(t, addr, []byte(roots), "not.a.token"); status.Code(err) == codes.ResourceExhausted {
				return
			}
		}
		t.Fatal("100 more garbage tokens did not put the address over its budget")
	}
	for try := 0; ; try++ {
		tok, err := env.CreateToken(ctx, app, "cart", []string{"istio-ca"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		overBudget()
		if _, err := request(t, addr, []byte(roots), tok); err != nil {
			t.Fatalf("a genuine token never reviewed, from an address over its budget: %v", err)
		}
		_, err = request(t, addr, []byte(roots), s.Token(t, app, "cart"))
		if status.Code(err) == codes.ResourceExhausted {
			return
		}
		if status.Code(err) != codes.Unauthenticated || try == 4 {
			t.Fatalf("a token signed with another key, from that address: %v, want ResourceExhausted (not reviewed)", err)
		}
	}
}
