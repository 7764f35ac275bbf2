// Package app is the flotilla-ca command: its configuration and the
// wiring of its components.
package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/metric"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/platform/atomicfile"
	"github.com/flotilla-mesh/flotilla/internal/platform/buildinfo"
	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/internal/platform/controller"
	"github.com/flotilla-mesh/flotilla/internal/platform/fswatch"
	"github.com/flotilla-mesh/flotilla/internal/platform/grpcserver"
	"github.com/flotilla-mesh/flotilla/internal/platform/kubeconfig"
	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
	"github.com/flotilla-mesh/flotilla/services/ca/authority"
	"github.com/flotilla-mesh/flotilla/services/ca/kube"
	"github.com/flotilla-mesh/flotilla/services/ca/server"
	"github.com/flotilla-mesh/flotilla/services/ca/store"
)

// Config is the configuration of flotilla-ca.
type Config struct {
	command.Common `yaml:",inline"`
	// Address serves IstioCertificateService over TLS.
	Address string `yaml:"address" usage:"listen address of the certificate service (gRPC over TLS)"`
	// StateDir holds the signing material without a cluster: a plugged-in
	// CA (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem) or the
	// self-signed root created on first start. roots.pem there is the trust
	// bundle for clients. Without it, ca runs in cluster mode.
	StateDir string `yaml:"stateDir" usage:"no-cluster mode: directory of the signing material (plugged-in cacerts files, or the self-signed root created on first start)"`
	// RootsFile is where the trust bundle is published in no-cluster mode,
	// for clients that must not see the state directory (its keys).
	RootsFile string `yaml:"rootsFile" usage:"no-cluster mode: file the trust bundle is published to for clients (default <stateDir>/roots.pem)"`
	// Kubeconfig selects the cluster in cluster mode; empty means in-cluster.
	Kubeconfig string `yaml:"kubeconfig" usage:"cluster mode: kubeconfig file; empty uses the in-cluster service account"`
	// KeyType of a self-signed root.
	KeyType string `yaml:"keyType" usage:"key of a self-signed root: ECDSA_P256, RSA_2048 or RSA_4096"`
	// TrustDomain of issued SPIFFE IDs.
	TrustDomain string        `yaml:"trustDomain" usage:"trust domain of the SPIFFE IDs issued"`
	DefaultTTL  time.Duration `yaml:"defaultTTL" usage:"validity of a certificate when the request names none"`
	MaxTTL      time.Duration `yaml:"maxTTL" usage:"longest validity a request may ask for"`
	// JWT authentication without a cluster.
	JWKSFile  string `yaml:"jwksFile" usage:"JWKS of the keys that sign service account tokens (no-cluster mode); empty turns token authentication off"`
	JWTIssuer string `yaml:"jwtIssuer" usage:"issuer JWKS-checked tokens must name"`
	// Audience service account tokens must be for.
	Audience string `yaml:"audience" usage:"audience service account tokens must be for (TokenReview and JWT)"`
	// SystemNamespace holds the control-plane service accounts.
	SystemNamespace string `yaml:"systemNamespace" usage:"control-plane namespace: its galley, discovery, injector and ca service accounts get their Service names as DNS SANs"`
	DomainSuffix    string `yaml:"domainSuffix" usage:"cluster DNS domain"`
	// ServingIPs are put in ca's own certificate besides its DNS names.
	ServingIPs      []string `yaml:"servingIPs" usage:"IP addresses in ca's own serving certificate"`
	RatePerIdentity float64  `yaml:"ratePerIdentity" usage:"certificate requests per second allowed to one identity"`
	// ReplicaName names this replica to debug clients (flotilla version
	// and check).
	ReplicaName string `yaml:"replicaName" usage:"this replica's name, as flotilla version and check show it (default: the host name, which is the pod's name in a cluster)"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{
		Common:          command.CommonDefaults(":15018"),
		Address:         ":15013",
		KeyType:         string(authority.ECDSAP256),
		TrustDomain:     controlplane.DefaultTrustDomain,
		DefaultTTL:      authority.DefaultTTL,
		MaxTTL:          authority.DefaultMaxTTL,
		Audience:        "istio-ca",
		SystemNamespace: controlplane.DefaultNamespace,
		DomainSuffix:    controlplane.DefaultDomainSuffix,
		ServingIPs:      []string{"127.0.0.1"},
		RatePerIdentity: 10,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate()}
	if _, _, err := net.SplitHostPort(c.Address); err != nil {
		errs = append(errs, fmt.Errorf("address %q: %w", c.Address, err))
	}
	if err := authority.CheckKeyType(authority.KeyType(c.KeyType)); err != nil {
		errs = append(errs, err)
	}
	if c.DefaultTTL <= 0 || c.MaxTTL < c.DefaultTTL {
		errs = append(errs, fmt.Errorf("defaultTTL %s and maxTTL %s: want 0 < default <= max", c.DefaultTTL, c.MaxTTL))
	}
	if c.RootsFile != "" && c.StateDir == "" {
		errs = append(errs, errors.New("rootsFile needs stateDir (in a cluster the roots are published as ConfigMaps)"))
	}
	if c.JWKSFile != "" && c.JWTIssuer == "" {
		errs = append(errs, errors.New("jwksFile needs jwtIssuer"))
	}
	if c.Audience == "" {
		errs = append(errs, errors.New("audience must not be empty"))
	}
	for _, ip := range c.ServingIPs {
		if net.ParseIP(ip) == nil {
			errs = append(errs, fmt.Errorf("servingIPs: %q is not an IP address", ip))
		}
	}
	return errors.Join(errs...)
}

// NewCommand returns the flotilla-ca command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[Config]{
		Name:  "flotilla-ca",
		Short: "Flotilla's certificate authority (Citadel)",
		Long: "ca issues SPIFFE X.509 workload certificates over Istio's IstioCertificateService API, authenticating callers by " +
			"service account token (a JWT checked against a JWKS without a cluster) or by a certificate it issued (renewal), " +
			"and issues the other services' serving certificates.",
		Defaults: Defaults,
		Run:      run,
	})
}

func run(ctx context.Context, cfg Config, rt *command.Runtime) error {
	var client kubernetes.Interface
	source := "state dir " + cfg.StateDir
	material := func() (*store.Material, error) {
		return store.Dir(cfg.StateDir, authority.KeyType(cfg.KeyType), cfg.TrustDomain, time.Now())
	}
	if cfg.StateDir == "" {
		rest, err := kubeconfig.Load(cfg.Kubeconfig, "--state-dir")
		if err != nil {
			return err
		}
		if client, err = kubernetes.NewForConfig(rest); err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
		klog.SetSlogLogger(rt.Log.With("component", "client-go"))
		source = "secrets in " + cfg.SystemNamespace
		material = func() (*store.Material, error) {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			return kube.Material(lctx, client, cfg.SystemNamespace, authority.KeyType(cfg.KeyType), cfg.TrustDomain, time.Now())
		}
	}
	var current atomic.Pointer[authority.Authority]
	var loaded string // the material in force, to skip reloading what did not change
	load := func() error {
		m, err := material()
		if err != nil {
			return err
		}
		key := string(m.Signer) + "\x00" + string(m.Key) + "\x00" + string(m.Chain) + "\x00" + string(m.Roots)
		if key == loaded && current.Load() != nil {
			return nil // unchanged
		}
		a, err := authority.New(m.Signer, m.Key, m.Chain, m.Roots, authority.Options{DefaultTTL: cfg.DefaultTTL, MaxTTL: cfg.MaxTTL}, time.Now())
		if err != nil {
			return fmt.Errorf("signing material (%s): %w", source, err)
		}
		if cfg.StateDir != "" {
			if err := writeRoots(cfg.rootsFile(), a.RootsPEM()); err != nil {
				return err
			}
		}
		a.Succeed(current.Load(), time.Now()) // renewals with the previous signer's certificates go on
		current.Store(a)
		loaded = key
		rt.Log.Info("signing authority loaded", "source", source, "plugged_in", m.Plugged, "signer_not_after", a.SignerNotAfter(), "roots_not_after", a.RootsNotAfter())
		return nil
	}
	if err := load(); err != nil {
		return err
	}
	ca := func() *authority.Authority { return current.Load() }
	meter := rt.Telemetry.Meter.Meter("flotilla/ca")
	istio := rt.Telemetry.Istio.Meter("istio")
	if err := expiryGauges(meter, istio, ca); err != nil {
		return err
	}
	auths := []server.Authenticator{server.ClientCert{CA: ca, Now: time.Now}}
	if client != nil {
		tr, err := kube.NewTokenReview(client, cfg.Audience, meter, time.Now)
		if err != nil {
			return err
		}
		auths = append(auths, tr)
	}
	if cfg.JWKSFile != "" {
		j, err := server.NewJWT(cfg.JWKSFile, cfg.JWTIssuer, cfg.Audience, cfg.TrustDomain, time.Now)
		if err != nil {
			return err
		}
		auths = append(auths, j)
	}
	if len(auths) == 1 {
		rt.Log.Warn("no token authentication (no cluster, no jwksFile): only renewals with a client certificate are served")
	}
	host, _ := os.Hostname()
	srv, err := server.New(server.Options{
		Log: rt.Log, Meter: meter, IstioMeter: istio, CA: ca, Authenticators: auths, TrustDomain: cfg.TrustDomain,
		DomainSuffix: cfg.DomainSuffix, ControlPlane: server.ControlPlaneAccounts(cfg.SystemNamespace), RatePerIdentity: cfg.RatePerIdentity,
		Replica: debugapi.NewReplica(controlplane.CA, cmp.Or(cfg.ReplicaName, host, controlplane.CA), buildinfo.Get().Version),
	})
	if err != nil {
		return err
	}
	var ips []net.IP
	for _, ip := range cfg.ServingIPs {
		ips = append(ips, net.ParseIP(ip))
	}
	self := authority.Identity{
		TrustDomain: cfg.TrustDomain, Namespace: cfg.SystemNamespace, ServiceAccount: controlplane.CA,
		DNSNames: []string{controlplane.CA + "." + cfg.SystemNamespace + ".svc", controlplane.CA + "." + cfg.SystemNamespace + ".svc." + cfg.DomainSuffix, "localhost"},
	}
	tlsCfg, err := server.ServingTLS(ca, self, ips, min(cfg.MaxTTL, 30*24*time.Hour), time.Now)
	if err != nil {
		return err
	}
	gs, err := grpcserver.New(grpcserver.Options{
		Log: rt.Log, Telemetry: rt.Telemetry, TLSConfig: tlsCfg, DrainTimeout: grpcserver.DrainWithin(cfg.ShutdownTimeout),
		MaxRecvMsgBytes: server.MaxRequestBytes,
	})
	if err != nil {
		return err
	}
	srv.Register(gs.Server)
	lis, err := net.Listen("tcp", cfg.Address)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	rt.Ready.Component("authority").SetReady()
	rt.Log.Info("serving", "address", lis.Addr().String(), "source", source)
	actors := []lifecycle.Actor{{Name: "certificates", Run: func(ctx context.Context) error { return gs.Serve(ctx, lis) }}}
	if client != nil {
		identity, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("leader identity: %w", err)
		}
		pub := kube.NewRootPublisher(kube.RootPublisherOptions{
			Client: client, Log: rt.Log, Roots: func() []byte { return ca().RootsPEM() },
			Lease: controller.Lease{Identity: identity, Namespace: cfg.SystemNamespace, Name: "flotilla-ca-root-publisher"},
		})
		actors = append(actors,
			lifecycle.Actor{Name: "root-publisher", Run: pub.Run},
			lifecycle.Actor{Name: "secrets:" + cfg.SystemNamespace, Run: func(ctx context.Context) error {
				// A plugged-in CA put in (or changed) later is picked up.
				t := time.NewTicker(30 * time.Second)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return nil
					case <-t.C:
						if err := load(); err != nil {
							rt.Log.Error("reloading the signing material failed; keeping the current one", "error", err)
						}
					}
				}
			}})
		return rt.Serve(ctx, actors...)
	}
	return rt.Serve(ctx, append(actors,
		lifecycle.Actor{Name: "watch:" + cfg.StateDir, Run: func(ctx context.Context) error {
			// A plugged-in CA that changes is loaded again; a bad change
			// keeps the current one.
			return fswatch.Run(ctx, fswatch.Options{
				Dirs: []string{cfg.StateDir}, Debounce: 200 * time.Millisecond, Log: rt.Log,
				Relevant: func(p string) bool { b := filepath.Base(p); return b != "roots.pem" && !strings.HasPrefix(b, ".") },
				OnChange: func() error {
					if err := load(); err != nil {
						rt.Log.Error("reloading the signing material failed; keeping the current one", "error", err)
					}
					return nil
				},
			})
		}})...)
}

func (c Config) rootsFile() string {
	if c.RootsFile != "" {
		return c.RootsFile
	}
	return filepath.Join(c.StateDir, "roots.pem")
}

// writeRoots publishes the trust bundle for clients at path.
func writeRoots(path string, roots []byte) error {
	if old, err := os.ReadFile(path); err == nil && string(old) == string(roots) {
		return nil
	}
	if err := atomicfile.Write(path, roots, 0o644); err != nil { // public certificates: readable by clients
		return fmt.Errorf("roots: %w", err)
	}
	return nil
}

// expiryGauges export seconds until the signer and the earliest root
// expire, to alert on: Flotilla's, and Citadel's as Istio names them
// (the root's and, when the signer is not a root itself, its chain's
// expiry as a Unix time and as seconds left, negative once expired).
func expiryGauges(m, istio metric.Meter, ca func() *authority.Authority) error {
	for _, g := range []struct {
		name, help string
		value      func(a *authority.Authority) (float64, bool)
	}{
		{
			"citadel_server_root_cert_expiry_timestamp", "The unix timestamp, in seconds, when the root cert will expire.",
			func(a *authority.Authority) (float64, bool) { return float64(a.RootsNotAfter().Unix()), true },
		},
		{
			"citadel_server_root_cert_expiry_seconds", "The time remaining, in seconds, before the root cert will expire. A negative value indicates the cert is expired.",
			func(a *authority.Authority) (float64, bool) { return time.Until(a.RootsNotAfter()).Seconds(), true },
		},
		{
			"citadel_server_cert_chain_expiry_timestamp", "The unix timestamp, in seconds, when Istio generated cert chain will expire.",
			func(a *authority.Authority) (float64, bool) { t, ok := a.ChainNotAfter(); return float64(t.Unix()), ok },
		},
		{
			"citadel_server_cert_chain_expiry_seconds", "The time remaining, in seconds, before the Istio Generated cert chain will expire. A negative value indicates the cert is expired.",
			func(a *authority.Authority) (float64, bool) {
				t, ok := a.ChainNotAfter()
				return time.Until(t).Seconds(), ok
			},
		},
	} {
		if _, err := istio.Float64ObservableGauge(g.name, metric.WithDescription(g.help),
			metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
				if a := ca(); a != nil {
					if v, ok := g.value(a); ok {
						o.Observe(v)
					}
				}
				return nil
			})); err != nil {
			return fmt.Errorf("metric %s: %w", g.name, err)
		}
	}
	_, err := m.Float64ObservableGauge("flotilla.ca.signer_expiry_seconds",
		metric.WithDescription("Seconds until the signing (root or intermediate) certificate expires."),
		metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
			if a := ca(); a != nil {
				o.Observe(time.Until(a.SignerNotAfter()).Seconds())
			}
			return nil
		}))
	if err != nil {
		return fmt.Errorf("metric: %w", err)
	}
	_, err = m.Float64ObservableGauge("flotilla.ca.root_expiry_seconds",
		metric.WithDescription("Seconds until the earliest root of the trust bundle expires."),
		metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
			if a := ca(); a != nil {
				o.Observe(time.Until(a.RootsNotAfter()).Seconds())
			}
			return nil
		}))
	if err != nil {
		return fmt.Errorf("metric: %w", err)
	}
	return nil
}
