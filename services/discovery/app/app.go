// Package app is the flotilla-discovery command: its configuration and the
// wiring of its components.
package app

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	cav1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/ca/v1"
	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/certclient"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/jwks"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/platform/admin"
	"github.com/flotilla-mesh/flotilla/internal/platform/buildinfo"
	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/internal/platform/grpcclient"
	"github.com/flotilla-mesh/flotilla/internal/platform/grpcserver"
	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
	"github.com/flotilla-mesh/flotilla/internal/platform/tlsreload"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/services/discovery/carelay"
	"github.com/flotilla-mesh/flotilla/services/discovery/ingest"
	"github.com/flotilla-mesh/flotilla/services/discovery/istiod"
	"github.com/flotilla-mesh/flotilla/services/discovery/tokens"
	"github.com/flotilla-mesh/flotilla/services/discovery/xds"
)

// Config is the configuration of flotilla-discovery.
type Config struct {
	command.Common `yaml:",inline"`
	// GalleyAddress is galley's MCP server.
	GalleyAddress string `yaml:"galleyAddress" usage:"galley's MCP-over-xDS address, host:port (ignored with --config-dir)"`
	// GalleyTLS authenticates to galley with mTLS when set (cert, key and
	// the roots galley's certificate chains to).
	GalleyTLS tlsreload.Files `yaml:"galleyTLS"`
	// ConfigDir serves a directory of Istio YAML instead of subscribing to
	// galley (local runs and tests).
	ConfigDir string `yaml:"configDir" usage:"directory of Istio YAML to serve instead of subscribing to galley; watched for changes. Local mode: plain-text ports (admin, xDS) whose address names no host listen on 127.0.0.1"`
	// MeshConfigFile is the mesh configuration with --config-dir.
	MeshConfigFile string `yaml:"meshConfigFile" usage:"mesh configuration (MeshConfig YAML) to use with --config-dir, read at start (refused without --config-dir: galley serves it then)"`
	// XDSAddress serves plaintext ADS (loopback and development).
	XDSAddress string `yaml:"xdsAddress" usage:"listen address of the plaintext xDS server (with --config-dir, an address without a host means 127.0.0.1)"`
	// SecureXDSAddress serves ADS over mTLS; only when XDSTLS is set.
	SecureXDSAddress string `yaml:"secureXDSAddress" usage:"listen address of the secure xDS server (served with xdsTLS, or with a certificate from ca: proxies then authenticate with a certificate from ca or, as Istio's agent does, with their service account token, which ca checks; Istio's certificate service is relayed to ca there too)"`
	// XDSTLS is the certificate of the secure xDS server.
	XDSTLS tlsreload.Files `yaml:"xdsTLS"`
	// VerifyProxyIdentity refuses, on the mTLS port, a proxy whose node
	// claims another namespace or service account than its certificate.
	VerifyProxyIdentity bool `yaml:"verifyProxyIdentity" usage:"on the secure xDS port, refuse a proxy whose node metadata claims another namespace or service account than its certificate's SPIFFE ID or its token's service account"`
	// XDSSendTimeout closes the stream of a proxy that takes no response
	// for that long.
	XDSSendTimeout time.Duration `yaml:"xdsSendTimeout" usage:"close the stream of a proxy that takes no response for this long (it reads too slowly or not at all); 0 waits for ever"`
	// XDSMaxConnectionAge ends proxies' connections after about that
	// long, so they spread over replicas added since.
	XDSMaxConnectionAge time.Duration `yaml:"xdsMaxConnectionAge" usage:"end each proxy stream after about this long (±10 %), at its first moment with no response in flight (waiting up to 10s), its connection told before to take no new streams (a GOAWAY), so proxies reconnect and spread over replicas added by a scale-out; 0 keeps connections for ever"`
	// XDSMaxConnectionsPerPeer bounds the connections of one peer address.
	XDSMaxConnectionsPerPeer int `yaml:"xdsMaxConnectionsPerPeer" usage:"connections one peer address (IP) may hold open to each xDS port at once; more are closed as they are accepted (a proxy holds one or two); 0: no bound"`
	// DebounceFirst, DebounceQuiet and DebounceMax shape pushes
	// (ingest.Options).
	DebounceFirst time.Duration `yaml:"debounceFirst" usage:"a change that comes after thirty debounceQuiet periods (3s by default) without any is pushed after this long; each further change before the push doubles the wait, up to debounceQuiet (equal to debounceQuiet: every push waits that long, as Istio's PILOT_DEBOUNCE_AFTER)"`
	DebounceQuiet time.Duration `yaml:"debounceQuiet" usage:"push a burst of changes after this long without a change"`
	DebounceMax   time.Duration `yaml:"debounceMax" usage:"push at the latest this long after the first change, even if changes keep coming"`
	// JWKSRefresh is how often the issuers' keys are fetched again.
	JWKSRefresh time.Duration `yaml:"jwksRefresh" usage:"how often discovery fetches again the JSON Web Key Sets RequestAuthentications name (their jwksUri, or their issuer's OpenID configuration); proxies get the keys inline"`
	// DomainSuffix qualifies short host names.
	DomainSuffix string `yaml:"domainSuffix" usage:"cluster DNS domain used to qualify short host names"`
	// DefaultNamespace applies to file objects without a namespace.
	DefaultNamespace string `yaml:"defaultNamespace" usage:"namespace of --config-dir objects that name none"`
	// CA gets discovery's certificate from ca (flotilla-discovery's Service
	// names in SystemNamespace): it then subscribes to galley over mTLS and
	// serves ADS over mTLS on secureXDSAddress, unless galleyTLS / xdsTLS
	// files say otherwise.
	CA              certclient.Config `yaml:",inline"`
	SystemNamespace string            `yaml:"systemNamespace" usage:"control-plane namespace (discovery's Service names in its certificate from ca; a debug client with a certificate of it sees every proxy)"`
	// Revision is the control-plane revision this replica belongs to
	// (Istio's canary upgrades): its Service name (for its certificate)
	// is flotilla-discovery-<revision>, proxies see it in proxy-status,
	// and Istio configuration labelled istio.io/rev for another revision
	// is not its.
	Revision string `yaml:"revision" usage:"control-plane revision (istio.io/rev) this replica serves: its certificate is for flotilla-discovery-<revision>'s Service, flotilla proxy-status shows it, and Istio configuration labelled istio.io/rev with another revision is ignored"`
	// ReplicaName names this replica to galley and to debug clients.
	ReplicaName string `yaml:"replicaName" usage:"this replica's name, as galley's subscriber list and flotilla proxy-status show it (default: the host name, which is the pod's name in a cluster)"`
	// IstiodHTTPAddress serves what Istio's tools read from istiod's
	// port 8080.
	IstiodHTTPAddress string `yaml:"istiodHTTPAddress" usage:"listen address of an HTTP server as istiod's port 8080, for Istio's tools (Kiali) that reach istiod's pods there: /ready (200 once ready), /debug/syncz and /debug/registryz (to loopback clients, as a port-forward arrives; also on the admin port, as istiod's 15014); empty: not served"`
	// EnvoyFilterReportCheck is how often the EnvoyFilter findings are
	// looked at for galley.
	EnvoyFilterReportCheck time.Duration `yaml:"envoyFilterReportCheck" usage:"how often the problems proxies met applying EnvoyFilters are looked at and, when they changed, sent to galley, which writes them in the EnvoyFilters' status (subscribed to galley only)"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{
		Common:           command.CommonDefaults(":15014"),
		GalleyAddress:    "127.0.0.1:15019",
		XDSAddress:       ":15010",
		SecureXDSAddress: ":15012",
		DebounceFirst:    time.Millisecond,
		DebounceQuiet:    100 * time.Millisecond,
		DebounceMax:      10 * time.Second,
		JWKSRefresh:      jwks.DefaultRefresh,
		DomainSuffix:     model.DefaultDomainSuffix,
		DefaultNamespace: "default",
		SystemNamespace:  controlplane.DefaultNamespace,
		Revision:         controlplane.DefaultRevision,

		VerifyProxyIdentity:      true,
		XDSSendTimeout:           30 * time.Second,
		XDSMaxConnectionAge:      30 * time.Minute, // Istio's MaxServerConnectionAge
		XDSMaxConnectionsPerPeer: grpcserver.DefaultMaxConnsPerPeer,
		EnvoyFilterReportCheck:   5 * time.Second,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate(), c.GalleyTLS.Validate(), c.XDSTLS.Validate(), c.CA.Validate(), controlplane.CheckRevision(c.Revision)}
	addrs := map[string]string{"xdsAddress": c.XDSAddress}
	if c.XDSTLS.Enabled() || c.CA.Enabled() {
		addrs["secureXDSAddress"] = c.SecureXDSAddress
	}
	if c.ConfigDir == "" {
		addrs["galleyAddress"] = c.GalleyAddress
		if c.GalleyTLS.Enabled() && c.GalleyTLS.CAFile == "" {
			errs = append(errs, errors.New("galleyTLS.caFile must be set to verify galley"))
		}
		if c.MeshConfigFile != "" {
			errs = append(errs, errors.New("meshConfigFile is read only with configDir: subscribed to galley, discovery uses the mesh configuration galley serves (give the file to galley)"))
		}
	} else if c.MeshConfigFile != "" {
		if _, err := os.Stat(c.MeshConfigFile); err != nil {
			errs = append(errs, fmt.Errorf("meshConfigFile: %w", err))
		}
	}
	if c.IstiodHTTPAddress != "" {
		addrs["istiodHTTPAddress"] = c.IstiodHTTPAddress
	}
	for name, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", name, a, err))
		}
	}
	if c.JWKSRefresh <= 0 {
		errs = append(errs, fmt.Errorf("jwksRefresh %s: must be positive", c.JWKSRefresh))
	}
	if c.XDSMaxConnectionsPerPeer < 0 {
		errs = append(errs, fmt.Errorf("xdsMaxConnectionsPerPeer %d: must not be negative (0 turns it off)", c.XDSMaxConnectionsPerPeer))
	}
	if c.XDSMaxConnectionAge < 0 || c.XDSSendTimeout < 0 {
		errs = append(errs, fmt.Errorf("xdsMaxConnectionAge %s and xdsSendTimeout %s: must not be negative (0 turns each off)", c.XDSMaxConnectionAge, c.XDSSendTimeout))
	}
	if c.EnvoyFilterReportCheck <= 0 || c.EnvoyFilterReportCheck > time.Minute {
		errs = append(errs, fmt.Errorf("envoyFilterReportCheck %s: want more than 0 and at most 1m", c.EnvoyFilterReportCheck))
	}
	if c.DebounceFirst <= 0 || c.DebounceQuiet < c.DebounceFirst || c.DebounceMax < c.DebounceQuiet {
		errs = append(errs, fmt.Errorf("debounceFirst %s, debounceQuiet %s and debounceMax %s: want 0 < first <= quiet <= max", c.DebounceFirst, c.DebounceQuiet, c.DebounceMax))
	}
	return errors.Join(errs...)
}

// NewCommand returns the flotilla-discovery command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[Config]{
		Name:  "flotilla-discovery",
		Short: "Flotilla's xDS server (Pilot)",
		Long: "discovery subscribes to galley, builds an immutable push context and serves Envoy xDS (LDS, RDS, CDS, EDS; " +
			"state-of-the-world and delta) to sidecars and proxyless gRPC clients. It never talks to Kubernetes and runs as N independent replicas.",
		Defaults: Defaults,
		Run:      run,
	})
}

func run(ctx context.Context, cfg Config, rt *command.Runtime) (err error) {
	if cfg.ConfigDir != "" {
		// Local mode: plain-text ports that name no host stay on this
		// machine.
		rt.LocalMode()
		cfg.XDSAddress = command.LoopbackIfNoHost(cfg.XDSAddress)
		cfg.IstiodHTTPAddress = command.LoopbackIfNoHost(cfg.IstiodHTTPAddress)
	}
	meter := rt.Telemetry.Meter.Meter("flotilla/discovery")
	istio := rt.Telemetry.Istio.Meter("istio")
	if cfg.ReplicaName == "" {
		if cfg.ReplicaName, err = os.Hostname(); err != nil {
			cfg.ReplicaName = controlplane.Discovery
		}
	}
	lis, err := net.Listen("tcp", cfg.XDSAddress)
	if err != nil {
		return fmt.Errorf("xds listen: %w", err)
	}
	replica := debugapi.NewReplica(controlplane.Discovery, cfg.ReplicaName, buildinfo.Get().Version)
	replica.Revision = cfg.Revision
	// galley answers whether a gateway's account may read its Secrets
	// (set by newSource, before serving); reading a directory, every
	// account may.
	var secretAccess xds.SecretAccess
	certs, err := cfg.CA.ForService(controlplane.Name(controlplane.Discovery, cfg.Revision), cfg.SystemNamespace, cfg.DomainSuffix, rt.Log)
	if err != nil {
		return err
	}
	ca, err := dialCA(cfg, certs)
	if err != nil {
		return err
	}
	defer ca.close()
	registrar := &galleyRegistrar{} // dialled by newSource, before any proxy connects
	srv, err := xds.New(xds.Options{
		Tokens: ca.tokens, Registrar: registrar,
		SecretAccess: func(ctx context.Context, ns, sa string) (bool, string, error) {
			if secretAccess == nil {
				return true, "", nil
			}
			return secretAccess(ctx, ns, sa)
		},
		Log: rt.Log, Meter: meter, IstioMeter: istio, Tracer: rt.Telemetry.Tracer, VerifyIdentity: cfg.VerifyProxyIdentity, SendTimeout: cfg.XDSSendTimeout, ConnectionAge: cfg.XDSMaxConnectionAge,
		SystemNamespace: cfg.SystemNamespace, PlaintextDebug: isLoopback(lis.Addr()),
		Replica: replica,
	})
	if err != nil {
		return err
	}
	syncz := admin.LoopbackOnly(istiod.SynczPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(istiod.Syncz(srv.Status()))
	})
	registryz := admin.LoopbackOnly(istiod.RegistryzPath, func(w http.ResponseWriter, _ *http.Request) {
		var services []*registryv1.Service
		if pc := srv.Latest(); pc != nil {
			services = pc.Services()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(istiod.Registryz(services, controlplane.DefaultClusterID))
	})
	// As istiod's monitoring port: its sync state, registry and version,
	// as Kiali reads them.
	rt.HandleAdmin("GET "+istiod.SynczPath, syncz)
	rt.HandleAdmin("GET "+istiod.RegistryzPath, registryz)
	rt.HandleAdmin("GET /version", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, buildinfo.Get().Version)
	}))
	ready := rt.Ready.Component("config")
	ready.SetNotReady("waiting for the first configuration")
	var in *ingest.Ingest
	keys := jwks.New(jwks.Options{Log: rt.Log.With("component", "jwks"), Refresh: cfg.JWKSRefresh, OnChange: func() { in.KeysChanged() }})
	in, err = ingest.New(ingest.Options{
		Log: rt.Log, Meter: meter, IstioMeter: istio, First: cfg.DebounceFirst, Quiet: cfg.DebounceQuiet, Max: cfg.DebounceMax,
		DomainSuffix: cfg.DomainSuffix, TypeURLs: subscribed(cfg, certs), Push: srv.Push, JWKS: keys, Tracer: rt.Telemetry.Tracer,
		Revision: cfg.Revision,
	})
	if err != nil {
		return err
	}
	source, secretAccess, err := newSource(cfg, rt, in, certs, srv.EnvoyFilterFindings, registrar)
	if err != nil {
		return err
	}
	actors := []lifecycle.Actor{source, {Name: "debounce", Run: in.Run}, {Name: "jwks", Run: keys.Run}, {Name: "workloadentry-registrations", Run: func(ctx context.Context) error {
		srv.RunRegistrations(ctx)
		return nil
	}}}
	if certs != nil {
		actors = append(actors, lifecycle.Actor{Name: "certificate:" + cfg.CA.Address, Run: certs.Run})
	}
	plain, err := xdsServer(rt, tlsreload.Files{}, nil, srv, nil, cfg)
	if err != nil {
		return err
	}
	actors = append(actors, lifecycle.Actor{Name: "xds", Run: func(ctx context.Context) error { return plain.Serve(ctx, lis) }})
	if cfg.XDSTLS.Enabled() || certs != nil {
		// Proxies present their workload certificates from ca or, as
		// Istio's agent does, their tokens (which ca checks).
		var tlsCfg *tls.Config
		if certs != nil {
			tlsCfg = certs.ServerConfig(certs.Roots())
			tlsCfg.ClientAuth = tls.VerifyClientCertIfGiven
		}
		secure, err := xdsServer(rt, cfg.XDSTLS, tlsCfg, srv, ca.relay, cfg)
		if err != nil {
			return err
		}
		slis, err := net.Listen("tcp", cfg.SecureXDSAddress)
		if err != nil {
			return fmt.Errorf("secure xds listen: %w", err)
		}
		actors = append(actors, lifecycle.Actor{Name: "xds-mtls", Run: func(ctx context.Context) error { return secure.Serve(ctx, slis) }})
	}
	if cfg.IstiodHTTPAddress != "" {
		ilis, err := net.Listen("tcp", cfg.IstiodHTTPAddress)
		if err != nil {
			return fmt.Errorf("istiod http listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /ready", rt.Ready)
		mux.Handle("GET "+istiod.SynczPath, syncz)
		mux.Handle("GET "+istiod.RegistryzPath, registryz)
		actors = append(actors, lifecycle.Actor{Name: "istiod-http", Run: func(ctx context.Context) error {
			return admin.Serve(ctx, rt.Log, ilis, mux, cfg.ShutdownTimeout)
		}})
	}
	actors = append(actors, lifecycle.Actor{Name: "readiness", Run: func(ctx context.Context) error {
		select {
		case <-in.Synced():
			ready.SetReady()
			rt.Log.Info("serving", "source", source.Name, "xds_address", lis.Addr().String())
		case <-ctx.Done():
		}
		<-ctx.Done()
		return nil
	}})
	return rt.Serve(ctx, actors...)
}

func xdsServer(rt *command.Runtime, files tlsreload.Files, tlsCfg *tls.Config, srv *xds.Server, relay *carelay.Relay, cfg Config) (*grpcserver.Server, error) {
	shutdown, maxAge := cfg.ShutdownTimeout, cfg.XDSMaxConnectionAge
	perPeer := cfg.XDSMaxConnectionsPerPeer
	if perPeer == 0 {
		perPeer = -1 // no bound
	}
	gs, err := grpcserver.New(grpcserver.Options{
		MaxConnsPerPeer: perPeer,
		Log:             rt.Log, Telemetry: rt.Telemetry, TLS: files, TLSConfig: tlsCfg,
		MaxRecvMsgBytes: grpcserver.MaxSubscriberRequestBytes, ManyStreams: true, DrainTimeout: grpcserver.DrainWithin(shutdown),
		// The GOAWAY comes at 72–88 % of the age (gRPC's own ±10 %), before
		// the stream ends itself at 90–110 % and a quiet moment
		// (xds.Options.ConnectionAge), so the proxy's next stream opens a
		// new connection. gRPC closes the connection only if the stream
		// has not ended by 112–128 % plus the grace.
		MaxConnectionAge: maxAge * 8 / 10, MaxConnectionAgeGrace: maxAge*4/10 + xds.DefaultConnectionAgeGrace,
		Extra: []grpc.ServerOption{xds.ServerOption()},
	})
	if err != nil {
		return nil, err
	}
	srv.Register(gs.Server)
	if relay != nil {
		securityv1alpha1.RegisterIstioCertificateServiceServer(gs.Server, relay)
	}
	return gs, nil
}

// caClients are what discovery asks ca for proxies, when it gets its own
// certificate from ca: who a proxy's token is (over a connection with
// discovery's certificate, which ca requires for that), and certificates
// for Istio's agents that send their requests to discovery's address (over
// a connection with no certificate, so that ca authenticates the proxy's
// token and never discovery).
type caClients struct {
	tokens xds.TokenAuthenticator
	relay  *carelay.Relay
	conns  []*grpc.ClientConn
}

func (c caClients) close() {
	for _, cc := range c.conns {
		_ = cc.Close()
	}
}

func dialCA(cfg Config, certs *certclient.Client) (caClients, error) {
	if certs == nil {
		return caClients{}, nil
	}
	account := cfg.SystemNamespace + "/" + controlplane.CA
	var out caClients
	for _, tlsCfg := range []*tls.Config{certs.ClientConfig(account), certs.VerifyOnlyConfig(account)} {
		cc, err := grpc.NewClient(cfg.CA.Address, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)), grpcclient.ReconnectQuickly())
		if err != nil {
			out.close()
			return caClients{}, fmt.Errorf("ca client: %w", err)
		}
		out.conns = append(out.conns, cc)
	}
	out.tokens = tokens.New(tokens.Options{Client: cav1.NewTokenReviewServiceClient(out.conns[0])})
	out.relay = carelay.New(securityv1alpha1.NewIstioCertificateServiceClient(out.conns[1]))
	return out, nil
}

// isLoopback reports whether a listener takes connections from this
// machine only: its plain-text xDS port may then serve debug types
// (anyone who can reach it could already run the control plane's
// binaries as the same user), which elsewhere need a client certificate.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// subscribed are the collections discovery reads: all of them, but over
// plaintext to galley not the credentials, which galley serves to
// discovery's verified identity only.
func subscribed(cfg Config, certs *certclient.Client) []string {
	all := model.TypeURLs()
	if cfg.ConfigDir != "" || cfg.GalleyTLS.Enabled() || certs != nil {
		return all
	}
	return slices.DeleteFunc(all, func(t string) bool { return t == registry.CredentialTypeURL })
}

// newSource subscribes to galley, or reads --config-dir. Subscribed to
// galley, it also asks galley whether an account may read its Secrets.
func newSource(cfg Config, rt *command.Runtime, in *ingest.Ingest, certs *certclient.Client, findings func() []xds.EnvoyFilterFinding, registrar *galleyRegistrar) (lifecycle.Actor, xds.SecretAccess, error) {
	if cfg.ConfigDir != "" {
		files := ingest.NewFiles(ingest.FileOptions{
			Dir: cfg.ConfigDir, MeshConfigFile: cfg.MeshConfigFile,
			DefaultNamespace: cfg.DefaultNamespace, DomainSuffix: cfg.DomainSuffix, Log: rt.Log, Tracer: rt.Telemetry.Tracer,
		}, in)
		return lifecycle.Actor{Name: "files:" + cfg.ConfigDir, Run: files.Run}, nil, nil
	}
	creds := insecure.NewCredentials()
	var reloader *tlsreload.Reloader
	if cfg.GalleyTLS.Enabled() {
		host, _, _ := net.SplitHostPort(cfg.GalleyAddress)
		var err error
		if reloader, err = tlsreload.New(cfg.GalleyTLS, rt.Log); err != nil {
			return lifecycle.Actor{}, nil, fmt.Errorf("galley tls: %w", err)
		}
		creds = credentials.NewTLS(reloader.ClientConfig(host))
	} else if certs != nil {
		creds = credentials.NewTLS(certs.ClientConfig(cfg.SystemNamespace + "/" + controlplane.Galley))
	}
	conn, err := grpc.NewClient(cfg.GalleyAddress,
		grpc.WithTransportCredentials(creds), grpcclient.ReconnectQuickly(),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
	)
	if err != nil {
		return lifecycle.Actor{}, nil, fmt.Errorf("galley client: %w", err)
	}
	client, err := mcp.NewClient(mcp.ClientOptions{
		Conn: conn, NodeID: "discovery~" + cfg.ReplicaName, Version: buildinfo.Get().Version, TypeURLs: subscribed(cfg, certs), Handler: in, Log: rt.Log,
		Meter: rt.Telemetry.Meter.Meter("flotilla/discovery"),
	})
	if err != nil {
		return lifecycle.Actor{}, nil, errors.Join(err, conn.Close())
	}
	registrar.client = galleyv1.NewWorkloadEntryServiceClient(conn)
	reporter := envoyFilterReporter{
		client: galleyv1.NewEnvoyFilterStatusServiceClient(conn), replica: cfg.ReplicaName, findings: findings,
		check: cfg.EnvoyFilterReportCheck, interval: 30 * time.Second, log: rt.Log,
	}
	return lifecycle.Actor{Name: "galley:" + cfg.GalleyAddress, Run: func(ctx context.Context) error {
		defer conn.Close()
		if reloader != nil {
			go func() { _ = reloader.Run(ctx) }()
		}
		if certs != nil && !certs.Wait(ctx) { // galley wants a client certificate
			return nil
		}
		go func() { _ = reporter.Run(ctx) }()
		return client.Run(ctx)
	}}, askGalley(galleyv1.NewSecretAccessServiceClient(conn)), nil
}

// galleyRegistrar is galley's WorkloadEntryService (auto-registration),
// over the connection newSource dials: set before the server runs.
type galleyRegistrar struct {
	client galleyv1.WorkloadEntryServiceClient
}

// errNoGalley answers when discovery reads a directory instead.
var errNoGalley = status.Error(codes.Unimplemented, "discovery reads a directory, without galley")

func (g *galleyRegistrar) Connect(ctx context.Context, in *galleyv1.ConnectRequest, opts ...grpc.CallOption) (*galleyv1.ConnectResponse, error) {
	if g.client == nil {
		return nil, errNoGalley
	}
	return g.client.Connect(ctx, in, opts...)
}

func (g *galleyRegistrar) Disconnect(ctx context.Context, in *galleyv1.DisconnectRequest, opts ...grpc.CallOption) (*galleyv1.DisconnectResponse, error) {
	if g.client == nil {
		return nil, errNoGalley
	}
	return g.client.Disconnect(ctx, in, opts...)
}

func (g *galleyRegistrar) ReportHealth(ctx context.Context, in *galleyv1.ReportHealthRequest, opts ...grpc.CallOption) (*galleyv1.ReportHealthResponse, error) {
	if g.client == nil {
		return nil, errNoGalley
	}
	return g.client.ReportHealth(ctx, in, opts...)
}

// askGalley is galley's SecretAccessService as xds.SecretAccess.
func askGalley(c galleyv1.SecretAccessServiceClient) xds.SecretAccess {
	return func(ctx context.Context, ns, sa string) (bool, string, error) {
		resp, err := c.Authorize(ctx, &galleyv1.AuthorizeRequest{Namespace: ns, ServiceAccount: sa})
		if err != nil {
			return false, "", fmt.Errorf("galley: %w", err)
		}
		return resp.GetAllowed(), resp.GetReason(), nil
	}
}
