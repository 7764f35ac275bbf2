// Package connect is how the flotilla CLI reaches the control plane: the
// discovery replicas to ask (flags, else the context file a local stack
// writes, else make run's first replica) and how to authenticate to them.
// Every replica is asked the same debug request (internal/debugapi) at
// once, over its xDS port: in plain text where discovery serves debug
// types so (a plain-text port on loopback: make run), else over mTLS with
// a client certificate, given as files or got from ca with a service
// account token, as workloads get theirs. The commands that read the
// configuration (analyze --live) reach galley's MCP port the same way.
// The commands that take a proxy name it and find the replica serving it
// here (proxy.go).
package connect

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/certclient"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
)

// Context is what a context file holds (internal/debugapi).
type Context = debugapi.Context

// Options are the CLI's connection flags.
type Options struct {
	ContextFile string
	Context     Context
	Kube        KubeOptions
	Timeout     time.Duration
	set         func(name string) bool
	// caCert is the certificate ca issued the command, and caServer how
	// ca named itself then (CA).
	caCert   *tls.Certificate
	caServer string
}

// CA is the ca replica that issued the CLI's certificate, as it named
// itself; false when none did (plain text, or --cert).
func (o *Options) CA() (debugapi.Replica, bool) {
	if o.caServer == "" {
		return debugapi.Replica{}, false
	}
	return debugapi.ReplicaOf(&corev3.ControlPlane{Identifier: o.caServer}), true
}

// AddFlags registers the connection flags (persistent on the root).
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.ContextFile, "context-file", os.Getenv("FLOTILLA_CONTEXT"),
		"context file saying where the control plane is (default: $FLOTILLA_CONTEXT, else .flotilla/"+debugapi.ContextFileName+" in this directory or the nearest parent, which make run writes)")
	fs.StringSliceVar(&o.Context.DiscoveryAddresses, "discovery-address", nil,
		"discovery replicas' xDS addresses, host:port, comma-separated or repeated (default: the context file's, else "+debugapi.DefaultDiscoveryAddress+")")
	fs.StringVar(&o.Context.GalleyAddress, "galley-address", "",
		"galley's MCP address, host:port, for the commands that read the configuration (analyze --live; default: the context file's); reached with the same credentials as discovery")
	fs.BoolVar(&o.Context.Plaintext, "plaintext", false, "reach discovery and galley without TLS (discovery serves debug types so only on a plain-text port that listens on loopback; galley has one only in file mode without ca)")
	fs.StringVar(&o.Context.CertFile, "cert", "", "client certificate (PEM) for discovery's mTLS port")
	fs.StringVar(&o.Context.KeyFile, "key", "", "private key (PEM) of --cert")
	fs.StringVar(&o.Context.CAFile, "cacert", "", "the mesh's roots (PEM): discovery's and ca's certificates are checked against them")
	fs.StringVar(&o.Context.CAAddress, "ca-address", "", "get a client certificate from ca at this address (with --token-file and --cacert) instead of --cert")
	fs.StringVar(&o.Context.TokenFile, "token-file", "", "service account token (audience istio-ca) to show ca; a token of the system namespace sees every proxy, another namespace's only its own")
	fs.StringVar(&o.Context.SystemNamespace, "istio-namespace", "", "the control plane's namespace, which its certificates name (default istio-system)")
	fs.DurationVar(&o.Timeout, "timeout", 30*time.Second, "how long to wait for the control plane")
	fs.StringVar(&o.Kube.Kubeconfig, "kubeconfig", "", "reach the control plane in this cluster: its discovery (or, for analyze --live, galley) and ca pods, from their Services' EndpointSlices, through the apiserver's port-forward")
	fs.StringVar(&o.Kube.Context, "context", "", "the kubeconfig context of the cluster (the default kubeconfig's, without --kubeconfig)")
	fs.StringVar(&o.Kube.ServiceAccount, "service-account", controlplane.OperatorAccount,
		"with --kubeconfig: the service account of the control plane's namespace whose token the CLI shows ca (it then sees every proxy)")
	o.set = func(name string) bool { return fs.Changed(name) }
}

// LogDir is where a local stack keeps its services' logs, as its context
// file says; none in a cluster (its pods' logs are the apiserver's).
func (o *Options) LogDir() (string, bool) {
	if o.Kube.Enabled() {
		return "", false
	}
	c, err := o.resolve()
	return c.LogDir, err == nil && c.LogDir != ""
}

// resolve merges the flags over the context file over the defaults.
func (o *Options) resolve() (Context, error) {
	c := Context{}
	path := o.ContextFile
	if path == "" {
		path = findContextFile()
	}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return c, fmt.Errorf("context file: %w", err)
		}
		if c, err = debugapi.ParseContext(b); err != nil {
			return c, fmt.Errorf("context file %s: %w", path, err)
		}
	}
	flag := o.Context
	changed := func(name string) bool { return o.set != nil && o.set(name) }
	if changed("discovery-address") {
		c.DiscoveryAddresses = flag.DiscoveryAddresses
	}
	if changed("plaintext") {
		c.Plaintext = flag.Plaintext
	}
	if changed("galley-address") {
		c.GalleyAddress = flag.GalleyAddress
	}
	for name, f := range map[string]struct{ dst, src *string }{
		"cert": {&c.CertFile, &flag.CertFile}, "key": {&c.KeyFile, &flag.KeyFile}, "cacert": {&c.CAFile, &flag.CAFile},
		"ca-address": {&c.CAAddress, &flag.CAAddress}, "token-file": {&c.TokenFile, &flag.TokenFile},
		"istio-namespace": {&c.SystemNamespace, &flag.SystemNamespace},
	} {
		if changed(name) {
			*f.dst = *f.src
		}
	}
	if len(c.DiscoveryAddresses) == 0 {
		c.DiscoveryAddresses = []string{debugapi.DefaultDiscoveryAddress}
		if c.CertFile == "" && c.CAAddress == "" {
			c.Plaintext = true
		}
	}
	if c.SystemNamespace == "" {
		c.SystemNamespace = controlplane.DefaultNamespace
	}
	switch {
	case c.Plaintext:
	case c.CertFile != "" && c.CAAddress != "":
		return c, errors.New("--cert and --ca-address both give a client certificate: choose one")
	case c.CertFile != "" && (c.KeyFile == "" || c.CAFile == ""):
		return c, errors.New("--cert needs --key and --cacert")
	case c.CAAddress != "" && (c.TokenFile == "" || c.CAFile == ""):
		return c, errors.New("--ca-address needs --token-file and --cacert")
	case c.CertFile == "" && c.CAAddress == "":
		return c, errors.New("discovery's mTLS port wants a client certificate: give --cert/--key/--cacert, or --ca-address/--token-file/--cacert, or --plaintext for a plain-text port on loopback")
	}
	return c, nil
}

// findContextFile is .flotilla/context.yaml in the working directory or
// the nearest parent that has one.
func findContextFile() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		p := filepath.Join(dir, ".flotilla", debugapi.ContextFileName)
		if _, err := os.Stat(p); err == nil {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// Answer is one replica's answer to a debug request.
type Answer struct {
	Address string
	Replica debugapi.Replica
	Resp    *discoveryv3.DiscoveryResponse
	Err     error
}

// Client asks every replica.
type Client struct {
	conns map[string]*grpc.ClientConn
	creds credentials.TransportCredentials
	// serverName is the name the replicas' certificates are checked for.
	serverName string
	stop       func()
}

// maxAnswerBytes bounds one replica's answer (a syncz of thousands of
// proxies is a few MiB).
const maxAnswerBytes = 256 << 20

// Dial finds the replicas and connects (lazily: nothing is sent until a
// request); Close ends what it started (a cluster's port-forwards).
func (o *Options) Dial(ctx context.Context) (*Client, error) {
	c, creds, stop, err := o.credentials(ctx, o.Kube, controlplane.Discovery)
	if err != nil {
		return nil, err
	}
	cl := &Client{conns: map[string]*grpc.ClientConn{}, creds: creds, serverName: serverName(controlplane.Discovery, c), stop: stop}
	for _, a := range slices.Compact(slices.Sorted(slices.Values(everyAddress(ctx, c.DiscoveryAddresses)))) {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxAnswerBytes)))
		if err != nil {
			cl.Close()
			return nil, fmt.Errorf("discovery %s: %w", a, err)
		}
		cl.conns[a] = cc
	}
	return cl, nil
}

// everyAddress expands each host name that resolves to several
// addresses (compose's service name for its replicas, a headless
// Service) into one address each, so that every replica is asked, as
// istioctl asks every pod; a name that does not resolve, or resolves to
// one address or to loopback only, is kept as it is.
func everyAddress(ctx context.Context, addrs []string) []string {
	var out []string
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil || net.ParseIP(host) != nil {
			out = append(out, a)
			continue
		}
		ips, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil || len(ips) < 2 || !slices.ContainsFunc(ips, func(ip string) bool { return !net.ParseIP(ip).IsLoopback() }) {
			out = append(out, a)
			continue
		}
		for _, ip := range ips {
			out = append(out, net.JoinHostPort(ip, port))
		}
	}
	return out
}

// DialGalley connects to galley's MCP port (--galley-address, the context
// file's, or in a cluster a galley pod's through port-forward) with the
// credentials discovery is reached with; stop closes it and what it
// started.
func (o *Options) DialGalley(ctx context.Context) (conn *grpc.ClientConn, stop func(), err error) {
	k := o.Kube
	k.Galley = true
	c, creds, stopKube, err := o.credentials(ctx, k, controlplane.Galley)
	if err != nil {
		return nil, nil, err
	}
	if c.GalleyAddress == "" {
		stopKube()
		return nil, nil, errors.New("where is galley? give --galley-address (or --kubeconfig, or a context file that names it)")
	}
	conn, err = grpc.NewClient(c.GalleyAddress, grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxAnswerBytes)))
	if err != nil {
		stopKube()
		return nil, nil, fmt.Errorf("galley %s: %w", c.GalleyAddress, err)
	}
	return conn, func() { _ = conn.Close(); stopKube() }, nil
}

// credentials resolves where the control plane is and the transport
// credentials that reach service (whose certificate names it).
func (o *Options) credentials(ctx context.Context, k KubeOptions, service string) (Context, credentials.TransportCredentials, func(), error) {
	var c Context
	var roots []byte
	var token func() (string, error)
	stop := func() {}
	var err error
	if k.Enabled() {
		ns := cmp.Or(o.Context.SystemNamespace, controlplane.DefaultNamespace)
		if c, roots, token, stop, err = k.kubeContext(ctx, ns); err != nil {
			return c, nil, nil, err
		}
	} else {
		if c, err = o.resolve(); err != nil {
			return c, nil, nil, err
		}
		if !c.Plaintext {
			if roots, err = os.ReadFile(c.CAFile); err != nil {
				return c, nil, nil, fmt.Errorf("--cacert: %w", err)
			}
		}
		token = func() (string, error) {
			b, err := os.ReadFile(c.TokenFile)
			return strings.TrimSpace(string(b)), err
		}
	}
	creds, err := o.transport(ctx, c, roots, token, service)
	if err != nil {
		stop()
		return c, nil, nil, err
	}
	return c, creds, stop, nil
}

// Connect is Dial bounded by the --timeout: a command's requests use the
// returned context, and done releases both.
func (o *Options) Connect(parent context.Context) (context.Context, *Client, func(), error) {
	ctx, cancel := context.WithTimeout(parent, o.Timeout)
	cl, err := o.Dial(ctx)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, cl, func() { cl.Close(); cancel() }, nil
}

// transport is the credentials the context asks for: none, a client
// certificate from files, or one from ca for the token (asked once per
// command: discovery and galley are reached with the same one).
func (o *Options) transport(ctx context.Context, c Context, rootsPEM []byte, token func() (string, error), service string) (credentials.TransportCredentials, error) {
	if c.Plaintext {
		return insecure.NewCredentials(), nil
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rootsPEM) {
		return nil, errors.New("the mesh's roots (--cacert) hold no PEM certificate")
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert/--key: %w", err)
		}
		cfg := serverCheck(service, c.SystemNamespace, roots)
		cfg.Certificates = []tls.Certificate{cert}
		return credentials.NewTLS(cfg), nil
	}
	if o.caCert == nil {
		// The first attempt's failure ends the command, saying why (ca
		// not there, its certificate not of the roots, the token
		// refused): retrying would only wait out the --timeout.
		failed := make(chan error, 1)
		certs := certclient.New(certclient.Options{
			Address: c.CAAddress, ServerName: controlplane.CA + "." + c.SystemNamespace + ".svc", Roots: certclient.StaticRoots(roots),
			Token: token, Log: slog.New(slog.DiscardHandler), MaxBackoff: time.Second,
			OnError: func(err error) {
				select {
				case failed <- err:
				default:
				}
			},
		})
		runCtx, cancel := context.WithCancel(ctx)
		go func() { _ = certs.Run(runCtx) }() // the first certificate is all a command needs
		defer cancel()
		select {
		case <-certs.Ready():
		case err := <-failed:
			return nil, fmt.Errorf("no certificate from ca at %s: %w%s", c.CAAddress, err, caHint(err))
		case <-ctx.Done():
			return nil, fmt.Errorf("no certificate from ca at %s in time (is the token valid, and ca reachable?)", c.CAAddress)
		}
		o.caCert, o.caServer = certs.Certificate(), certs.Server()
	}
	cert := o.caCert
	cfg := serverCheck(service, c.SystemNamespace, roots)
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	return credentials.NewTLS(cfg), nil
}

// caHint is the way out of a failure to get a certificate from ca.
func caHint(err error) string {
	switch status.Code(err) {
	case codes.Unavailable:
		return " (is ca running? a context file of a make run that has stopped names addresses nothing listens on: start make run again, or give the addresses)"
	case codes.Unauthenticated, codes.PermissionDenied:
		return " (the token was refused: ca's log says why; make a new one, e.g. with flotilla token create, or with make run use its context file)"
	}
	return ""
}

// serverCheck is the TLS configuration that checks a replica of service:
// its certificate chains to the mesh's roots and names service's Service
// in the control plane's namespace; for discovery, the Service of any
// revision (flotilla-discovery-canary), since every revision's replicas
// are asked alike.
func serverCheck(service, namespace string, roots *x509.CertPool) *tls.Config {
	name := service + "." + namespace + ".svc"
	if !controlplane.Revisioned(service) {
		return &tls.Config{RootCAs: roots, ServerName: name, MinVersion: tls.VersionTLS12}
	}
	return &tls.Config{
		ServerName: name, MinVersion: tls.VersionTLS12,
		// The chain and the name are checked below, in full: the usual
		// check would accept one name only.
		InsecureSkipVerify: true, //nolint:gosec // VerifyConnection checks the chain and the name
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyRevisioned(cs.PeerCertificates, service, namespace, roots)
		},
	}
}

// verifyRevisioned checks that chain (leaf first) chains to roots for
// server authentication and that its leaf names the Service of service
// in namespace, of some revision.
func verifyRevisioned(chain []*x509.Certificate, service, namespace string, roots *x509.CertPool) error {
	if len(chain) == 0 {
		return errors.New("the server presented no certificate")
	}
	intermediates := x509.NewCertPool()
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	leaf := chain[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("the server's certificate: %w", err)
	}
	for _, dns := range leaf.DNSNames {
		host, ok := strings.CutSuffix(dns, "."+namespace+".svc")
		if s, _, isOne := controlplane.Parse(host); ok && isOne && s == service {
			return nil
		}
	}
	return fmt.Errorf("the server's certificate names %v, no %s Service (of any revision) in namespace %s", leaf.DNSNames, service, namespace)
}

// PeerCertificates is the certificate chain the replica at addr serves,
// checked as every request checks it (nil in plain text).
func (c *Client) PeerCertificates(ctx context.Context, addr string) ([]*x509.Certificate, error) {
	if c.creds.Info().SecurityProtocol != "tls" {
		return nil, nil
	}
	raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("discovery %s: %w", addr, err)
	}
	defer raw.Close()
	conn, info, err := c.creds.Clone().ClientHandshake(ctx, c.serverName, raw)
	if err != nil {
		return nil, fmt.Errorf("discovery %s: TLS: %w", addr, err)
	}
	defer conn.Close()
	tlsInfo, ok := info.(credentials.TLSInfo)
	if !ok {
		return nil, fmt.Errorf("discovery %s: not a TLS connection", addr)
	}
	return tlsInfo.State.PeerCertificates, nil
}

// Roots is the mesh's trust bundle as PEM: in a cluster the
// istio-ca-root-cert ConfigMap's, else --cacert's (the context file's);
// nil when neither is given.
func (o *Options) Roots(ctx context.Context) ([]byte, error) {
	if o.Kube.Enabled() {
		client, err := o.Kube.Client()
		if err != nil {
			return nil, err
		}
		return readRoots(ctx, client, cmp.Or(o.Context.SystemNamespace, controlplane.DefaultNamespace))
	}
	c, err := o.resolve()
	if err != nil || c.CAFile == "" {
		return nil, err
	}
	b, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("--cacert: %w", err)
	}
	return b, nil
}

// SystemNamespace is the control plane's namespace, as the flags or the
// context file say (default istio-system).
func (o *Options) SystemNamespace() string {
	if c, err := o.resolve(); err == nil && !o.Kube.Enabled() {
		return c.SystemNamespace
	}
	return cmp.Or(o.Context.SystemNamespace, controlplane.DefaultNamespace)
}

// serverName is the name a service's certificate is checked for: its
// Service's in the control plane's namespace.
func serverName(service string, c Context) string { return service + "." + c.SystemNamespace + ".svc" }

// Addresses are the replicas asked, sorted.
func (c *Client) Addresses() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for a := range c.conns {
			if !yield(a) {
				return
			}
		}
	})
}

// Close closes the connections.
func (c *Client) Close() {
	for _, cc := range c.conns {
		_ = cc.Close()
	}
	c.stop()
}

// FetchAll asks every replica at once; the answers are in Addresses'
// order, each with its error.
func (c *Client) FetchAll(ctx context.Context, typeURL string, names ...string) []Answer {
	addrs := c.Addresses()
	out := make([]Answer, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() { out[i] = c.Fetch(ctx, a, typeURL, names...) })
	}
	wg.Wait()
	return out
}

// Fetch asks one replica.
func (c *Client) Fetch(ctx context.Context, addr, typeURL string, names ...string) Answer {
	ans := Answer{Address: addr}
	cc := c.conns[addr]
	if cc == nil {
		ans.Err = fmt.Errorf("no replica %s", addr)
		return ans
	}
	ans.Resp, ans.Err = debugapi.Fetch(ctx, cc, typeURL, names...)
	if ans.Err == nil {
		ans.Replica = debugapi.ReplicaOf(ans.Resp.GetControlPlane())
	}
	return ans
}
