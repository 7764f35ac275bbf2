// Package certclient gets a control-plane service its own certificate from
// ca (Istio's IstioCertificateService) and keeps it fresh: renewed at a
// random point between 50 % and 80 % of its lifetime, retried with backoff
// on failure while the current certificate keeps being served.
package certclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
	"github.com/flotilla-mesh/flotilla/internal/platform/grpcclient"
)

// Options configures a Client.
type Options struct {
	// Address of ca, host:port; ServerName is the name its certificate is
	// checked against (default: the host of Address).
	Address, ServerName string
	// Roots returns the roots ca's certificate chains to (the trust
	// bundle), asked for at each request so a rotated bundle is used
	// (StaticRoots for a fixed pool).
	Roots func() *x509.CertPool
	// Token returns the service account token to authenticate with (a
	// projected token file is re-read each time).
	Token func() (string, error)
	// DNSNames to ask for (the service's own Service names; ca grants them
	// to control-plane service accounts only). The identity itself is not
	// asked for: ca gives the one the credential proves.
	DNSNames []string
	// RenewWithCertificate presents the held certificate, while it is
	// valid, as the TLS client certificate of renewals, so a renewal
	// succeeds without a token (ca authenticates it by that certificate);
	// the token is sent too when it can be read.
	RenewWithCertificate bool
	// OnCertificate, when set, is called with each new certificate, after
	// it is held.
	OnCertificate func(*tls.Certificate)
	// OnError, when set, is called with each attempt's error, before the
	// retry: a one-shot caller (the CLI) stops at the first and says why.
	OnError func(error)
	// TTL to ask for; zero takes ca's default.
	TTL time.Duration
	Log *slog.Logger
	// MinBackoff and MaxBackoff bound retries (default 1s to 1min).
	MinBackoff, MaxBackoff time.Duration
}

// Client holds the current certificate.
type Client struct {
	o       Options
	current atomic.Pointer[tls.Certificate]
	ready   chan struct{}
	server  atomic.Pointer[string]
}

// Server is how ca named itself in its last answer (the
// debugapi.ReplicaHeader: a replica's JSON); empty before one, or when it
// does not.
func (c *Client) Server() string {
	if p := c.server.Load(); p != nil {
		return *p
	}
	return ""
}

// New returns a client; Run gets and renews the certificate.
func New(o Options) *Client {
	if o.MinBackoff == 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = time.Minute
	}
	o.Log = o.Log.With("component", "certclient")
	return &Client{o: o, ready: make(chan struct{})}
}

// Ready is closed once a certificate is held.
func (c *Client) Ready() <-chan struct{} { return c.ready }

// Wait blocks until a certificate is held (true) or ctx ends (false), for
// what cannot start without one: a subscription over mTLS, readiness.
func (c *Client) Wait(ctx context.Context) bool {
	select {
	case <-c.ready:
		return true
	case <-ctx.Done():
		return false
	}
}

// Certificate is the current certificate, nil before the first.
func (c *Client) Certificate() *tls.Certificate { return c.current.Load() }

// ServerConfig serves with the current certificate; with clientRoots it
// also requires client certificates chaining to them (mTLS).
func (c *Client) ServerConfig(clientRoots *x509.CertPool) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if cert := c.current.Load(); cert != nil {
				return cert, nil
			}
			return nil, errors.New("no certificate from ca yet")
		},
	}
	if clientRoots != nil {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = clientRoots
	}
	return cfg
}

// Roots are ca's roots the client was given: the mesh's trust bundle.
func (c *Client) Roots() *x509.CertPool { return c.o.Roots() }

// StaticRoots returns a fixed pool as Options.Roots.
func StaticRoots(pool *x509.CertPool) func() *x509.CertPool {
	return func() *x509.CertPool { return pool }
}

// ClientConfig presents the current certificate to a server that must be
// the given service account ("<namespace>/<sa>"): its certificate must
// chain to the mesh roots and carry that SPIFFE identity. The identity,
// not a DNS name, is what is checked (as between Istio's components), so
// the server may be reached by any address.
func (c *Client) ClientConfig(account string) *tls.Config {
	want := spiffePath(account)
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verified below, by chain and identity instead of host name.
		InsecureSkipVerify: true, //nolint:gosec // VerifyConnection checks the chain and the SPIFFE ID
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the server sent no certificate")
			}
			inter := x509.NewCertPool()
			for _, ic := range cs.PeerCertificates[1:] {
				inter.AddCert(ic)
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: c.o.Roots(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("server certificate: %w", err)
			}
			for _, u := range leaf.URIs {
				if u.Scheme == "spiffe" && u.Path == want {
					return nil
				}
			}
			return fmt.Errorf("server %v is not %s", leaf.URIs, account)
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if cert := c.current.Load(); cert != nil {
				return cert, nil
			}
			return nil, errors.New("no certificate from ca yet")
		},
	}
}

// VerifyOnlyConfig verifies a server as ClientConfig does and presents no
// certificate: for calls on behalf of another party, whose own credential
// (a token) is the one the server must authenticate.
func (c *Client) VerifyOnlyConfig(account string) *tls.Config {
	cfg := c.ClientConfig(account)
	cfg.GetClientCertificate = nil
	return cfg
}

func spiffePath(account string) string {
	ns, sa, _ := strings.Cut(account, "/")
	return "/ns/" + ns + "/sa/" + sa
}

// RequirePeers makes a server configuration that verifies client
// certificates also accept only the given service accounts: the peer's
// SPIFFE ID (its certificate's URI SAN) must end in /ns/<namespace>/sa/<sa>
// for one of them, given as "<namespace>/<sa>", or "<namespace>/*" for
// every service account of a namespace. The trust domain is the issuing
// ca's, already checked by the chain.
func RequirePeers(cfg *tls.Config, accounts ...string) *tls.Config {
	allowed := map[string]bool{}
	anyOf := map[string]bool{} // namespaces whose every account is allowed
	for _, a := range accounts {
		if ns, ok := strings.CutSuffix(a, "/*"); ok {
			anyOf["/ns/"+ns+"/sa/"] = true
			continue
		}
		allowed[spiffePath(a)] = true
	}
	allows := func(path string) bool {
		if allowed[path] {
			return true
		}
		i := strings.LastIndex(path, "/sa/")
		return i >= 0 && anyOf[path[:i+4]] && len(path) > i+4 && !strings.Contains(path[i+4:], "/")
	}
	cfg = cfg.Clone()
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("no client certificate")
		}
		for _, u := range cs.PeerCertificates[0].URIs {
			if u.Scheme == "spiffe" && allows(u.Path) {
				return nil
			}
		}
		return fmt.Errorf("client %v is not one of %v", cs.PeerCertificates[0].URIs, accounts)
	}
	return cfg
}

// Run gets a certificate and renews it until ctx ends.
func (c *Client) Run(ctx context.Context) error {
	backoff := c.o.MinBackoff
	for {
		fetched := time.Now()
		cert, err := c.fetch(ctx)
		var wait time.Duration
		if err != nil {
			if ctx.Err() != nil {
				return nil //nolint:nilerr // stopping
			}
			if status.Code(err) == codes.Unavailable {
				// ca is not reachable: try again soon, so a returning ca
				// has its callers back within a second; the attempt costs
				// a refused connection.
				wait = time.Duration(mrand.Int64N(int64(grpcclient.MaxReconnectDelay))) + grpcclient.MaxReconnectDelay/10 //nolint:gosec // jitter
			} else {
				wait = time.Duration(mrand.Int64N(int64(backoff))) + backoff/2 //nolint:gosec // jitter
				backoff = min(2*backoff, c.o.MaxBackoff)
			}
			c.o.Log.Warn("getting a certificate from ca failed; retrying", "error", err, "in", wait)
			if c.o.OnError != nil {
				c.o.OnError(err)
			}
		} else {
			backoff = c.o.MinBackoff
			c.current.Store(cert)
			select {
			case <-c.ready:
			default:
				close(c.ready)
			}
			if c.o.OnCertificate != nil {
				c.o.OnCertificate(cert)
			}
			// The lifetime counts from when it was asked for: ca backdates
			// NotBefore for clock skew.
			leaf := cert.Leaf
			life := leaf.NotAfter.Sub(fetched)
			renewAt := fetched.Add(time.Duration(float64(life) * (0.5 + 0.3*mrand.Float64()))) //nolint:gosec // jitter
			wait = time.Until(renewAt)
			c.o.Log.Info("certificate from ca", "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter, "renew_in", wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

func (c *Client) fetch(ctx context.Context) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: c.o.DNSNames}, key)
	if err != nil {
		return nil, fmt.Errorf("csr: %w", err)
	}
	tlsCfg := &tls.Config{RootCAs: c.o.Roots(), ServerName: c.o.ServerName, MinVersion: tls.VersionTLS12}
	held := c.current.Load()
	renewing := c.o.RenewWithCertificate && held != nil && time.Now().Before(held.Leaf.NotAfter)
	if renewing {
		tlsCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return held, nil }
	}
	tok, err := c.o.Token()
	switch {
	case err == nil:
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	case !renewing:
		return nil, fmt.Errorf("token: %w", err)
	default:
		c.o.Log.Warn("no token; renewing with the held certificate alone", "error", err)
	}
	cc, err := grpc.NewClient(c.o.Address, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)), grpcclient.ReconnectQuickly())
	if err != nil {
		return nil, fmt.Errorf("ca client: %w", err)
	}
	defer cc.Close()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var header metadata.MD
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(cc).CreateCertificate(rctx, &securityv1alpha1.IstioCertificateRequest{
		Csr:              string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})),
		ValidityDuration: int64(c.o.TTL / time.Second),
	}, grpc.Header(&header))
	if err != nil {
		return nil, fmt.Errorf("CreateCertificate: %w", err)
	}
	if v := header.Get(debugapi.ReplicaHeader); len(v) > 0 {
		server := clip.String(v[0], 1024)
		c.server.Store(&server)
	}
	chain := resp.GetCertChain()
	if len(chain) < 2 {
		return nil, fmt.Errorf("ca returned %d certificates; want the leaf and its root", len(chain))
	}
	cert := &tls.Certificate{PrivateKey: key}
	for i, p := range chain[:len(chain)-1] { // the root is not sent to peers
		b, _ := pem.Decode([]byte(p))
		if b == nil {
			return nil, fmt.Errorf("certificate %d is not PEM", i)
		}
		cert.Certificate = append(cert.Certificate, b.Bytes)
	}
	if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
		return nil, fmt.Errorf("leaf: %w", err)
	}
	if pub, ok := cert.Leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(key.Public()) {
		return nil, errors.New("ca returned a certificate for another key")
	}
	return cert, nil
}
