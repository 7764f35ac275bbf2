// Package app is the flotilla-injector command: its configuration and the
// wiring of its components.
package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/platform/admission"
	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
	"github.com/flotilla-mesh/flotilla/internal/platform/tlsreload"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/services/injector/namespaces"
	"github.com/flotilla-mesh/flotilla/services/injector/webhook"
)

// Config is the configuration of flotilla-injector.
type Config struct {
	command.Common `yaml:",inline"`
	// WebhookAddress serves /inject over HTTPS.
	WebhookAddress string `yaml:"webhookAddress" usage:"listen address of the injection webhook (HTTPS, path /inject)"`
	// WebhookTLS is the serving certificate; without it a self-signed one
	// is made at start (development only: the apiserver must be given its
	// CA).
	WebhookTLS tlsreload.Files `yaml:"webhookTLS"`
	// GalleyAddress streams the namespaces (their injection labels).
	GalleyAddress string `yaml:"galleyAddress" usage:"galley's MCP-over-xDS address, for namespace labels"`
	// SystemNamespace is never injected.
	SystemNamespace string `yaml:"systemNamespace" usage:"control-plane namespace, never injected"`
	// Revision this injector serves (istio.io/rev).
	Revision string `yaml:"revision" usage:"revision served: namespaces labelled istio.io/rev=<revision> are injected"`
	// TemplateFile and ValuesFile replace the built-in sidecar template
	// and values.
	TemplateFile string `yaml:"templateFile" usage:"sidecar template (Go text/template of initContainers, containers, volumes); empty uses the built-in"`
	ValuesFile   string `yaml:"valuesFile" usage:"values for the template (YAML); empty uses the built-in"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{
		Common:          command.CommonDefaults(":15022"),
		WebhookAddress:  ":15016",
		GalleyAddress:   "127.0.0.1:15019",
		SystemNamespace: "istio-system",
		Revision:        "default",
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate(), c.WebhookTLS.Validate()}
	for name, a := range map[string]string{"webhookAddress": c.WebhookAddress, "galleyAddress": c.GalleyAddress} {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", name, a, err))
		}
	}
	if c.WebhookTLS.CAFile != "" {
		errs = append(errs, errors.New("webhookTLS.caFile must be empty: the apiserver does not present a client certificate to webhooks"))
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
	tmplText := inject.DefaultTemplate
	if cfg.TemplateFile != "" {
		data, err := os.ReadFile(cfg.TemplateFile)
		if err != nil {
			return fmt.Errorf("template: %w", err)
		}
		tmplText = string(data)
	}
	tmpl, err := inject.ParseTemplate(tmplText)
	if err != nil {
		return err
	}
	values := inject.DefaultValues()
	if cfg.ValuesFile != "" {
		data, err := os.ReadFile(cfg.ValuesFile)
		if err != nil {
			return fmt.Errorf("values: %w", err)
		}
		if err := sigsyaml.UnmarshalStrict(data, &values); err != nil {
			return fmt.Errorf("values %s: %w", cfg.ValuesFile, err)
		}
	}
	labels := namespaces.New()
	h, err := webhook.Handler(webhook.Options{
		Log: rt.Log, Meter: rt.Telemetry.Meter.Meter("flotilla/injector"),
		Template: func() *inject.Template { return tmpl }, Values: func() inject.Values { return values },
		Policy:          inject.Policy{SystemNamespace: cfg.SystemNamespace, Revision: cfg.Revision},
		NamespaceLabels: labels.Get,
	})
	if err != nil {
		return err
	}
	tlsCfg, reloader, err := servingTLS(cfg, rt)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(cfg.GalleyAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("galley client: %w", err)
	}
	client := mcp.NewClient(mcp.ClientOptions{
		Conn: conn, NodeID: "injector", TypeURLs: []string{registry.NamespaceTypeURL}, Handler: labels, Log: rt.Log,
	})
	lis, err := net.Listen("tcp", cfg.WebhookAddress)
	if err != nil {
		return fmt.Errorf("webhook listen: %w", err)
	}
	ready := rt.Ready.Component("namespaces")
	ready.SetNotReady("waiting for galley's namespaces")
	actors := []lifecycle.Actor{
		{Name: "webhook", Run: func(ctx context.Context) error {
			return admission.Serve(ctx, rt.Log, lis, tlsCfg, h, cfg.ShutdownTimeout) //nolint:wrapcheck // says what failed
		}},
		{Name: "galley:" + cfg.GalleyAddress, Run: func(ctx context.Context) error {
			defer conn.Close()
			return client.Run(ctx)
		}},
		{Name: "readiness", Run: func(ctx context.Context) error {
			select {
			case <-labels.Synced():
				ready.SetReady()
				rt.Log.Info("serving", "webhook_address", lis.Addr().String())
			case <-ctx.Done():
			}
			<-ctx.Done()
			return nil
		}},
	}
	if reloader != nil {
		actors = append(actors, lifecycle.Actor{Name: "webhook-tls", Run: reloader.Run})
	}
	return rt.Serve(ctx, actors...)
}

// servingTLS serves the configured certificate, or a self-signed one made
// now (development: nothing trusts it unless told).
func servingTLS(cfg Config, rt *command.Runtime) (*tls.Config, *tlsreload.Reloader, error) {
	if cfg.WebhookTLS.Enabled() {
		rl, err := tlsreload.New(cfg.WebhookTLS, rt.Log)
		if err != nil {
			return nil, nil, fmt.Errorf("webhook tls: %w", err)
		}
		return rl.ServerConfig(), rl, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("dev certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, fmt.Errorf("dev certificate: %w", err)
	}
	name := "flotilla-injector." + cfg.SystemNamespace + ".svc"
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name, "localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("dev certificate: %w", err)
	}
	rt.Log.Warn("no webhookTLS: serving a self-signed development certificate")
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, nil, nil
}
