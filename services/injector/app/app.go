// Package app is the flotilla-injector command: its configuration and the
// wiring of its components.
package app

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flotilla-mesh/flotilla/internal/certclient"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/platform/admission"
	"github.com/flotilla-mesh/flotilla/internal/platform/buildinfo"
	"github.com/flotilla-mesh/flotilla/internal/platform/cabundle"
	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/internal/platform/grpcclient"
	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
	"github.com/flotilla-mesh/flotilla/internal/platform/tlsreload"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/services/injector/injectconfig"
	"github.com/flotilla-mesh/flotilla/services/injector/namespaces"
	"github.com/flotilla-mesh/flotilla/services/injector/proxyconfigs"
	"github.com/flotilla-mesh/flotilla/services/injector/webhook"
)

// Config is the configuration of flotilla-injector.
type Config struct {
	command.Common `yaml:",inline"`
	// Webhook serves /inject over HTTPS. Without webhookTLS or a
	// certificate from ca, a self-signed certificate is made at start
	// (development only: the caBundle controller, or the user, must give
	// the apiserver its CA). A leader keeps the
	// MutatingWebhookConfiguration's caBundle equal to caBundleFile (the
	// CA of the serving certificate; the self-signed one itself).
	Webhook admission.Config `yaml:",inline"`
	// CA gets the serving certificate from ca (flotilla-injector's Service
	// names) in place of webhookTLS, and reaches galley over mTLS with it;
	// its roots are also the caBundle the controller keeps.
	CA certclient.Config `yaml:",inline"`
	// GalleyAddress streams the namespaces (their injection labels).
	GalleyAddress string `yaml:"galleyAddress" usage:"galley's MCP-over-xDS address, for namespace labels"`
	// SystemNamespace is never injected.
	SystemNamespace string `yaml:"systemNamespace" usage:"control-plane namespace, never injected"`
	// Revision this injector serves (istio.io/rev): which pods it injects
	// (inject.Decide), its injection ConfigMap and webhook configuration
	// (flotilla-sidecar-injector[-<revision>]), and its name
	// (flotilla-injector[-<revision>]) for its certificate and Lease.
	Revision string `yaml:"revision" usage:"revision served (Istio's istio.io/rev): its namespaces and pods are injected, with flotilla-sidecar-injector-<revision>'s template; default: istio-injection=enabled namespaces too"`
	// TemplateFile and ValuesFile replace the built-in sidecar template
	// and values while galley has no injection ConfigMap for the revision
	// (which then takes their place).
	TemplateFile string `yaml:"templateFile" usage:"sidecar template (Go text/template of initContainers, containers, volumes) used while galley has no injection ConfigMap; empty uses the built-in"`
	ValuesFile   string `yaml:"valuesFile" usage:"values for the template (YAML, laid over the built-in ones) used while galley has no injection ConfigMap"`
	// Kubeconfig is the cluster the caBundle controller writes to.
	Kubeconfig   string `yaml:"kubeconfig" usage:"kubeconfig for the caBundle controller; empty uses the in-cluster service account when running in a cluster, else the controller is off"`
	DomainSuffix string `yaml:"domainSuffix" usage:"cluster DNS domain, for the Service names in the certificate from ca"`
	// ReplicaName names this replica to debug clients (flotilla version
	// and check).
	ReplicaName string `yaml:"replicaName" usage:"this replica's name, as flotilla version and check show it (default: the host name, which is the pod's name in a cluster)"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{
		Common:          command.CommonDefaults(":15022"),
		Webhook:         admission.Config{Address: ":15016"},
		GalleyAddress:   "127.0.0.1:15019",
		SystemNamespace: controlplane.DefaultNamespace,
		Revision:        "default",
		DomainSuffix:    controlplane.DefaultDomainSuffix,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate(), c.CA.Validate(), c.Webhook.Validate(c.CA.Enabled()), controlplane.CheckRevision(c.Revision)}
	if _, _, err := net.SplitHostPort(c.GalleyAddress); err != nil {
		errs = append(errs, fmt.Errorf("galleyAddress %q: %w", c.GalleyAddress, err))
	}
	return errors.Join(errs...)
}

// NewCommand returns the flotilla-injector command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[Config]{
		Name:  "flotilla-injector",
		Short: "Flotilla's sidecar injection webhook",
		Long: "injector is the mutating admission webhook that adds the traffic-capture init container and the proxy container with the agent to pods. " +
			"It reads namespaces' labels from galley and watches nothing in the cluster itself.",
		Defaults: Defaults,
		Run:      run,
	})
}

func run(ctx context.Context, cfg Config, rt *command.Runtime) error {
	// This revision's names: its webhook configuration (unless given), its
	// Service's (the certificate's), its Lease.
	cfg.Webhook.Configuration = cmp.Or(cfg.Webhook.Configuration, inject.RevisionName(cfg.Revision))
	self := controlplane.Name(controlplane.Injector, cfg.Revision)
	local, err := inject.ConfigFromFiles(cfg.Revision, cfg.TemplateFile, cfg.ValuesFile)
	if err != nil {
		return err
	}
	labels := namespaces.New()
	configs := injectconfig.New(cfg.Revision, local, rt.Log)
	// The mesh's root namespace is the control plane's, as in Istio's
	// default installation.
	proxyConfigs := proxyconfigs.New(cfg.SystemNamespace)
	h, err := webhook.Handler(webhook.Options{
		Log: rt.Log, Meter: rt.Telemetry.Meter.Meter("flotilla/injector"), IstioMeter: rt.Telemetry.Istio.Meter("istio"),
		Config:          configs.Current,
		Policy:          inject.Policy{SystemNamespace: cfg.SystemNamespace, Revision: cfg.Revision},
		NamespaceLabels: labels.Get,
		ProxyConfigs:    proxyConfigs.Current,
	})
	if err != nil {
		return err
	}
	var tlsCfg *tls.Config
	var reloader *tlsreload.Reloader
	var devCert []byte
	certs, err := cfg.CA.ForService(self, cfg.SystemNamespace, cfg.DomainSuffix, rt.Log)
	if err != nil {
		return err
	}
	if certs != nil {
		tlsCfg = certs.ServerConfig(nil)
	} else if tlsCfg, reloader, devCert, err = servingTLS(cfg, rt); err != nil {
		return err
	}
	// With a certificate from ca, galley is reached over mTLS.
	creds := insecure.NewCredentials()
	if certs != nil {
		creds = credentials.NewTLS(certs.ClientConfig(cfg.SystemNamespace + "/" + controlplane.Galley))
	}
	conn, err := grpc.NewClient(cfg.GalleyAddress, grpc.WithTransportCredentials(creds), grpcclient.ReconnectQuickly())
	if err != nil {
		return fmt.Errorf("galley client: %w", err)
	}
	host, _ := os.Hostname() // the pod's name in a cluster: tells replicas apart in galley's subscribers
	client, err := mcp.NewClient(mcp.ClientOptions{
		Conn: conn, NodeID: "injector~" + cmp.Or(cfg.ReplicaName, host, controlplane.Injector), Version: buildinfo.Get().Version, TypeURLs: append([]string{registry.NamespaceTypeURL, registry.InjectionConfigTypeURL}, proxyConfigs.TypeURLs()...),
		Handler: mcp.HandlerFunc(func(typeURL string, updated []*mcp.Resource, removed []string) error {
			switch typeURL {
			case registry.InjectionConfigTypeURL:
				return configs.Apply(typeURL, updated, removed)
			case registry.NamespaceTypeURL:
				return labels.Apply(typeURL, updated, removed)
			}
			return proxyConfigs.Apply(typeURL, updated, removed)
		}),
		Log: rt.Log, Meter: rt.Telemetry.Meter.Meter("flotilla/injector"),
	})
	if err != nil {
		return errors.Join(err, conn.Close())
	}
	lis, err := net.Listen("tcp", cfg.Webhook.Address)
	if err != nil {
		return fmt.Errorf("webhook listen: %w", err)
	}
	ready := rt.Ready.Component("galley")
	ready.SetNotReady("waiting for galley's namespaces and injection configuration")
	actors := []lifecycle.Actor{
		{Name: "webhook", Run: func(ctx context.Context) error {
			return admission.Serve(ctx, rt.Log, lis, tlsCfg, h, cfg.ShutdownTimeout)
		}},
		{Name: "galley:" + cfg.GalleyAddress, Run: func(ctx context.Context) error {
			defer conn.Close()
			if certs != nil && !certs.Wait(ctx) { // galley wants a client certificate
				return nil
			}
			return client.Run(ctx)
		}},
		{Name: "readiness", Run: func(ctx context.Context) error {
			for _, synced := range []<-chan struct{}{labels.Synced(), configs.Synced()} {
				select {
				case <-synced:
				case <-ctx.Done():
					return nil
				}
			}
			ready.SetReady()
			rt.Log.Info("serving", "webhook_address", lis.Addr().String())
			<-ctx.Done()
			return nil
		}},
	}
	if reloader != nil {
		actors = append(actors, lifecycle.Actor{Name: "webhook-tls", Run: reloader.Run})
	}
	if certs != nil {
		actors = append(actors, lifecycle.Actor{Name: "certificate:" + cfg.CA.Address, Run: certs.Run})
	}
	if c, err := caBundleController(cfg, rt, devCert); err != nil {
		return err
	} else if c != nil {
		actors = append(actors, lifecycle.Actor{Name: "cabundle", Run: c.Run})
	}
	return rt.Serve(ctx, actors...)
}

// caBundleController runs when there is a cluster to write to.
func caBundleController(cfg Config, rt *command.Runtime, devCert []byte) (*cabundle.Controller, error) {
	bundle := func() []byte { return devCert }
	if cfg.Webhook.CABundleFile == "" && cfg.CA.RootsFile != "" {
		cfg.Webhook.CABundleFile = cfg.CA.RootsFile // certificates from ca chain to its roots
	}
	if cfg.Webhook.CABundleFile != "" {
		bundle = cabundle.FileBundle(cfg.Webhook.CABundleFile, rt.Log)
	} else if devCert == nil {
		rt.Log.Warn("no caBundleFile: the caBundle controller is off")
		return nil, nil
	}
	return cabundle.FromSetup(cabundle.Setup{
		Kubeconfig: cfg.Kubeconfig, Kind: cabundle.Mutating, Webhook: cfg.Webhook.Configuration, Selector: inject.TagWebhooksOf(cfg.Revision), Bundle: bundle,
		LeaseNamespace: cfg.SystemNamespace, LeaseName: controlplane.Name(controlplane.Injector, cfg.Revision) + "-cabundle", Log: rt.Log,
	})
}

// servingTLS serves the configured certificate, or a self-signed one made
// now (development: nothing trusts it unless told; the caBundle
// controller can tell the apiserver), returned as PEM.
func servingTLS(cfg Config, rt *command.Runtime) (*tls.Config, *tlsreload.Reloader, []byte, error) {
	if cfg.Webhook.TLS.Enabled() {
		rl, err := tlsreload.New(cfg.Webhook.TLS, rt.Log)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("webhook tls: %w", err)
		}
		return rl.ServerConfig(), rl, nil, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dev certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dev certificate: %w", err)
	}
	name := controlplane.Name(controlplane.Injector, cfg.Revision) + "." + cfg.SystemNamespace + ".svc"
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name, "localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true, // its own CA, so a caBundle holding it verifies it
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dev certificate: %w", err)
	}
	rt.Log.Warn("no webhookTLS: serving a self-signed development certificate")
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, nil,
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
