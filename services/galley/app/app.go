// Package app is the flotilla-galley command: its configuration and the
// wiring of its components.
package app

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/klog/v2"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/flotilla-mesh/flotilla/internal/certclient"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/filesource"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/platform/admission"
	"github.com/flotilla-mesh/flotilla/internal/platform/buildinfo"
	"github.com/flotilla-mesh/flotilla/internal/platform/cabundle"
	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/internal/platform/grpcserver"
	"github.com/flotilla-mesh/flotilla/internal/platform/kubeconfig"
	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
	"github.com/flotilla-mesh/flotilla/internal/platform/tlsreload"
	"github.com/flotilla-mesh/flotilla/internal/publish"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/spiffe"
	"github.com/flotilla-mesh/flotilla/internal/validation"
	"github.com/flotilla-mesh/flotilla/services/galley/autoregister"
	"github.com/flotilla-mesh/flotilla/services/galley/envoyfilterstatus"
	gwcontroller "github.com/flotilla-mesh/flotilla/services/galley/gatewayapi"
	"github.com/flotilla-mesh/flotilla/services/galley/ipallocate"
	"github.com/flotilla-mesh/flotilla/services/galley/kubesource"
	"github.com/flotilla-mesh/flotilla/services/galley/secretaccess"
	"github.com/flotilla-mesh/flotilla/services/galley/status"
	"github.com/flotilla-mesh/flotilla/services/galley/webhook"
)

// Config is the configuration of flotilla-galley.
type Config struct {
	command.Common `yaml:",inline"`
	// Kubeconfig selects the cluster; empty means in-cluster configuration.
	Kubeconfig string `yaml:"kubeconfig" usage:"kubeconfig file of the cluster to watch; empty uses the in-cluster service account (ignored with --config-dir)"`
	// SystemNamespace holds galley's Lease (status writer election).
	SystemNamespace string `yaml:"systemNamespace" usage:"control-plane namespace, where the status writer's Lease lives"`
	// ClusterID names the cluster in the registry.
	ClusterID string `yaml:"clusterID" usage:"cluster name recorded on registry services"`
	// SecretNamespaces limits the Secrets galley reads.
	SecretNamespaces []string `yaml:"secretNamespaces" usage:"namespaces whose Secrets galley reads for Gateways' and DestinationRules' credentialName and extensions' imagePullSecret (empty: every namespace); only Secrets configuration names are published, and to discovery only"`
	// MeshConfigFile is the mesh configuration in file mode (the cluster
	// mode reads the istio ConfigMap).
	MeshConfigFile string `yaml:"meshConfigFile" usage:"mesh configuration (MeshConfig YAML) to serve with --config-dir, read at start (refused without --config-dir: in a cluster the istio ConfigMap's mesh key is served)"`
	// ConfigDir serves the Istio YAML in a directory instead of a cluster.
	ConfigDir string `yaml:"configDir" usage:"directory of Istio YAML files to serve instead of a cluster; watched for changes. Local mode: plain-text ports (admin, MCP without TLS) whose address names no host listen on 127.0.0.1"`
	// MCPAddress is where subscribers connect.
	MCPAddress string `yaml:"mcpAddress" usage:"listen address of the MCP-over-xDS gRPC server (with --config-dir and without TLS, an address without a host means 127.0.0.1)"`
	// MCPTLS serves MCP over (m)TLS from reloading files; without them and
	// with caAddress, MCP is served over mTLS with galley's certificate from
	// ca, to discovery's and the injector's service accounts only.
	MCPTLS tlsreload.Files `yaml:"mcpTLS"`
	// Webhook serves the validating admission webhook (path /validate). It
	// runs only with a serving certificate, from webhookTLS or from ca (the
	// apiserver calls webhooks over HTTPS only). In a cluster, a leader
	// keeps the ValidatingWebhookConfiguration's caBundle equal to
	// caBundleFile (default: caRootsFile).
	Webhook admission.Config `yaml:",inline"`
	// CA gets galley's certificate from ca (flotilla-galley's Service
	// names): it serves the webhook in place of webhookTLS and, without
	// mcpTLS, MCP over mTLS; its roots are also the caBundle the controller
	// keeps.
	CA certclient.Config `yaml:",inline"`
	// DefaultNamespace applies to file objects without a namespace.
	DefaultNamespace string `yaml:"defaultNamespace" usage:"namespace of file objects that name none"`
	// DomainSuffix is the cluster's DNS domain.
	DomainSuffix string `yaml:"domainSuffix" usage:"cluster DNS domain used to qualify short host names"`
	// GatewayAPI serves the Kubernetes Gateway API.
	GatewayAPI bool `yaml:"gatewayAPI" usage:"watch the Kubernetes Gateway API (gateway.networking.k8s.io/v1, once its CRDs are installed) and serve its Gateways and routes as Istio Gateways and VirtualServices, the leader writing their status (ignored with --config-dir)"`
	// GatewayController is the controllerName of Flotilla's GatewayClass.
	GatewayController string `yaml:"gatewayControllerName" usage:"controllerName of the GatewayClasses galley serves, besides Istio's istio.io/gateway-controller; the GatewayClasses flotilla and istio are served without an object"`
	// ServiceEntryAddresses allocates addresses to ServiceEntry hosts
	// that have none (Istio's PILOT_ENABLE_IP_AUTOALLOCATE).
	ServiceEntryAddresses bool `yaml:"serviceEntryAddresses" usage:"in a cluster, give every ServiceEntry host without addresses an IPv4 and an IPv6 address from serviceEntryIPRangeV4 and serviceEntryIPRangeV6, written to its status.addresses by the leader and used by sidecars that capture DNS (ISTIO_META_DNS_CAPTURE), as Istio's PILOT_ENABLE_IP_AUTOALLOCATE; false neither writes nor uses them"`
	// ServiceEntryIPv4Range and ServiceEntryIPv6Range are where
	// allocated addresses come from.
	ServiceEntryIPv4Range string `yaml:"serviceEntryIPRangeV4" usage:"range of ServiceEntry addresses allocated (Istio's PILOT_IP_AUTOALLOCATE_IPV4_PREFIX); keep it clear of every address in the cluster"`
	ServiceEntryIPv6Range string `yaml:"serviceEntryIPRangeV6" usage:"range of IPv6 ServiceEntry addresses allocated (Istio's PILOT_IP_AUTOALLOCATE_IPV6_PREFIX)"`
	// WorkloadEntryGracePeriod and WorkloadEntryMaxConnectionAge rule the
	// removal of auto-registered WorkloadEntries (autoregister).
	WorkloadEntryGracePeriod      time.Duration `yaml:"workloadEntryGracePeriod" usage:"in a cluster, how long the WorkloadEntry of a workload that joined with a WorkloadGroup stays after it disconnected from discovery (Istio's PILOT_WORKLOAD_ENTRY_GRACE_PERIOD)"`
	WorkloadEntryMaxConnectionAge time.Duration `yaml:"workloadEntryMaxConnectionAge" usage:"the longest a proxy stays connected to a discovery replica (discovery's xdsMaxConnectionAge, plus its 10 % jitter and its drain): an auto-registered WorkloadEntry marked connected for longer is removed, its workload and its replica having gone down together; 0 never removes a connected one"`
	// ReplicaName names this replica to debug clients (flotilla version
	// and check).
	ReplicaName string `yaml:"replicaName" usage:"this replica's name, as flotilla version and check show it (default: the host name, which is the pod's name in a cluster)"`
}

// Defaults returns the default configuration.
func Defaults() Config {
	return Config{
		Common:            command.CommonDefaults(":15015"),
		MCPAddress:        ":15019",
		Webhook:           admission.Config{Address: ":15017", Configuration: "flotilla-validator"},
		DefaultNamespace:  "default",
		DomainSuffix:      controlplane.DefaultDomainSuffix,
		ClusterID:         controlplane.DefaultClusterID,
		SystemNamespace:   controlplane.DefaultNamespace,
		GatewayAPI:        true,
		GatewayController: string(gatewayapi.DefaultController),

		ServiceEntryAddresses: true,
		ServiceEntryIPv4Range: ipallocate.DefaultIPv4Prefix,
		ServiceEntryIPv6Range: ipallocate.DefaultIPv6Prefix,

		WorkloadEntryGracePeriod:      autoregister.DefaultGracePeriod,
		WorkloadEntryMaxConnectionAge: autoregister.DefaultMaxConnectionAge,
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate(), c.MCPTLS.Validate(), c.CA.Validate()}
	if c.Webhook.TLS.Enabled() || c.CA.Enabled() {
		errs = append(errs, c.Webhook.Validate(c.CA.Enabled()))
	}
	if _, _, err := net.SplitHostPort(c.MCPAddress); err != nil {
		errs = append(errs, fmt.Errorf("mcpAddress %q: %w", c.MCPAddress, err))
	}
	if c.MeshConfigFile != "" && c.ConfigDir == "" {
		errs = append(errs, errors.New("meshConfigFile is read only with configDir: in a cluster galley serves the mesh configuration of the istio ConfigMap"))
	}
	if _, err := c.addressRanges(); err != nil {
		errs = append(errs, err)
	}
	if c.DefaultNamespace == "" {
		errs = append(errs, errors.New("defaultNamespace must not be empty"))
	}
	if c.WorkloadEntryGracePeriod <= 0 || c.WorkloadEntryMaxConnectionAge < 0 {
		errs = append(errs, fmt.Errorf("workloadEntryGracePeriod %s must be positive, workloadEntryMaxConnectionAge %s not negative", c.WorkloadEntryGracePeriod, c.WorkloadEntryMaxConnectionAge))
	}
	return errors.Join(errs...)
}

// addressRanges parses and checks the ServiceEntry address ranges.
func (c Config) addressRanges() ([2]netip.Prefix, error) {
	var out [2]netip.Prefix
	for i, r := range []struct{ key, value string }{{"serviceEntryIPRangeV4", c.ServiceEntryIPv4Range}, {"serviceEntryIPRangeV6", c.ServiceEntryIPv6Range}} {
		p, err := netip.ParsePrefix(r.value)
		if err != nil {
			return out, fmt.Errorf("%s %q: %w", r.key, r.value, err)
		}
		out[i] = p
	}
	if _, err := ipallocate.New(out[0], out[1]); err != nil {
		return out, err
	}
	return out, nil
}

// NewCommand returns the flotilla-galley command.
func NewCommand() *cobra.Command {
	return command.New(command.Spec[Config]{
		Name:  "flotilla-galley",
		Short: "Flotilla's config and registry ingestion service",
		Long: "galley is the only Flotilla service that reads Kubernetes (or a directory of YAML). " +
			"It validates Istio configuration and streams it to discovery and injector over MCP-over-xDS.",
		Defaults: Defaults,
		Run:      run,
	})
}

func run(ctx context.Context, cfg Config, rt *command.Runtime) error {
	if cfg.ConfigDir != "" {
		// Local mode: plain-text ports that name no host stay on this
		// machine; MCP over (m)TLS listens as given.
		rt.LocalMode()
		if !cfg.MCPTLS.Enabled() && !cfg.CA.Enabled() {
			cfg.MCPAddress = command.LoopbackIfNoHost(cfg.MCPAddress)
		}
	}
	srv, err := mcp.NewServer(ctx, rt.Log, rt.Telemetry.Meter.Meter("flotilla/galley"), append(publish.Collections(), registry.CredentialTypeURL))
	if err != nil {
		return err
	}
	// Every response names this replica and its version, as istiod's do
	// (flotilla version reads it).
	host, _ := os.Hostname()
	srv.Identify(debugapi.NewReplica(controlplane.Galley, cmp.Or(cfg.ReplicaName, host, controlplane.Galley), buildinfo.Get().Version).ControlPlane())
	// Credentials (the Secrets credentialName names) go to discovery's
	// identity only (of any revision): never to the injector, nor over
	// plaintext.
	isDiscovery := func(identity string) bool {
		id, err := spiffe.Parse(identity)
		if err != nil || id.Namespace != cfg.SystemNamespace {
			return false
		}
		service, _, ok := controlplane.Parse(id.ServiceAccount)
		return ok && service == controlplane.Discovery
	}
	srv.Restrict(registry.CredentialTypeURL, isDiscovery)
	// Whether a gateway's account may read its namespace's Secrets (its
	// credentials' keys): asked by discovery alone, reviewed in the cluster
	// (UseCluster, in newSource); without one every account may.
	access := secretaccess.New(isDiscovery, rt.Log, time.Now)
	// What discovery could not apply of the EnvoyFilters, for their
	// status (written in cluster mode, by newSource's status writer).
	findings := envoyfilterstatus.New(isDiscovery, rt.Log, time.Now)
	// Istio's own pilot, pointed at galley as a config source, reads the
	// mesh config under Istio's collection name.
	if err := srv.Alias(registry.IstioMeshConfigTypeURL, registry.MeshConfigTypeURL, true); err != nil {
		return err
	}
	// A certificate from ca serves the webhook and, unless mcpTLS files are
	// given, MCP over mTLS to the identities of the system namespace only:
	// discovery, the injector, and an operator's `flotilla analyze --live`
	// (whose token is of that namespace, as Istio's debug endpoints ask).
	// Credentials go to discovery alone (Restrict above).
	var actors []lifecycle.Actor
	var mcpTLS *tls.Config
	certs, err := cfg.CA.ForService(controlplane.Galley, cfg.SystemNamespace, cfg.DomainSuffix, rt.Log)
	if err != nil {
		return err
	}
	if certs != nil {
		actors = append(actors, lifecycle.Actor{Name: "certificate:" + cfg.CA.Address, Run: certs.Run})
		if !cfg.MCPTLS.Enabled() {
			mcpTLS = certclient.RequirePeers(certs.ServerConfig(certs.Roots()), cfg.SystemNamespace+"/*")
		}
	}
	gs, err := grpcserver.New(grpcserver.Options{
		Log: rt.Log, Telemetry: rt.Telemetry, TLS: cfg.MCPTLS, TLSConfig: mcpTLS, DrainTimeout: grpcserver.DrainWithin(cfg.ShutdownTimeout),
		MaxRecvMsgBytes: grpcserver.MaxSubscriberRequestBytes,
	})
	if err != nil {
		return err
	}
	srv.Register(gs.Server)
	access.Register(gs.Server)
	findings.Register(gs.Server)
	lis, err := net.Listen("tcp", cfg.MCPAddress)
	if err != nil {
		return fmt.Errorf("mcp listen: %w", err)
	}
	sources, loaded, objects, err := newSource(cfg, rt, srv, access, findings, gs.Server, isDiscovery)
	if err != nil {
		return err
	}
	ready := rt.Ready.Component("config")
	ready.SetNotReady("reading the configuration")
	hooks, err := webhookActors(cfg, rt, objects, certs)
	if err != nil {
		return err
	}
	actors = append(actors, hooks...)
	return rt.Serve(ctx, append(actors,
		append(sources,
			lifecycle.Actor{Name: "mcp", Run: func(ctx context.Context) error {
				// Subscribers are answered only once the configuration is
				// loaded: a restarted galley must not tell a reconnecting
				// discovery that everything it holds is gone.
				select {
				case <-loaded:
				case <-ctx.Done():
					return nil
				}
				return gs.Serve(ctx, lis)
			}},
			lifecycle.Actor{Name: "readiness", Run: func(ctx context.Context) error {
				select {
				case <-loaded:
					if certs != nil { // MCP and the webhook serve with it
						ready.SetNotReady("waiting for a certificate from ca")
						if !certs.Wait(ctx) {
							return nil
						}
					}
					ready.SetReady()
					rt.Log.Info("serving", "source", sources[0].Name, "mcp_address", lis.Addr().String())
				case <-ctx.Done():
				}
				<-ctx.Done()
				return nil
			}},
		)...)...)
}

// newSource builds the file source (with --config-dir) or the Kubernetes
// source with its status writer, and returns the channel closed when the
// source has read everything once.
//
// In a cluster it also serves discovery the registration of the
// WorkloadEntries of workloads that join with a WorkloadGroup
// (autoregister), on g; isDiscovery says who may call.
func newSource(cfg Config, rt *command.Runtime, srv *mcp.Server, access *secretaccess.Server, findings *envoyfilterstatus.Server, g *grpc.Server, isDiscovery func(string) bool) ([]lifecycle.Actor, <-chan struct{}, func() []*istio.Object, error) {
	pub := publish.New(srv)
	// client-go logs through klog, a process-wide logger: send it to ours.
	klog.SetSlogLogger(rt.Log.With("component", "client-go"))
	if cfg.ConfigDir != "" {
		pub.PublishNamespaces() // no cluster lists them: the files' own
		src := filesource.New(filesource.Options{
			Dir:              cfg.ConfigDir,
			DefaultNamespace: cfg.DefaultNamespace,
			DomainSuffix:     cfg.DomainSuffix,
			Log:              rt.Log,
			Tracer:           rt.Telemetry.Tracer,
		}, pub)
		if cfg.MeshConfigFile != "" {
			if err := publish.MeshFile(srv, cfg.MeshConfigFile); err != nil {
				return nil, nil, nil, err
			}
		}
		srv.ServeDebug(debugapi.Rejections, func() ([]*structpb.Struct, error) {
			var out []debugapi.Rejection
			for _, p := range src.Problems() {
				out = append(out, debugapi.Rejection{Object: p.Object, Message: p.Message, Since: p.Since})
			}
			return debugapi.Structs(out)
		})
		return []lifecycle.Actor{{Name: "files:" + cfg.ConfigDir, Run: src.Run}}, src.Loaded(), src.Objects, nil
	}
	rest, err := kubeconfig.Load(cfg.Kubeconfig, "--config-dir")
	if err != nil {
		return nil, nil, nil, err
	}
	kube, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	ic, err := istioclient.NewForConfig(rest)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("istio client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rest)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dynamic client: %w", err)
	}
	meta, err := metadata.NewForConfig(rest)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("metadata client: %w", err)
	}
	identity, err := os.Hostname()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("status writer identity: %w", err)
	}
	var gateways *gwcontroller.Controller
	var src *kubesource.Source
	srcOpts := kubesource.Options{
		Kube: kube, Istio: ic, Metadata: meta, SystemNamespace: cfg.SystemNamespace,
		Log: rt.Log, DomainSuffix: cfg.DomainSuffix, ClusterID: cfg.ClusterID, SecretNamespaces: cfg.SecretNamespaces,
		Tracer: rt.Telemetry.Tracer,
	}
	if cfg.GatewayAPI {
		gwc, err := gwclient.NewForConfig(rest)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("gateway api client: %w", err)
		}
		gateways = gwcontroller.New(gwcontroller.Options{
			// A publisher of its own: a Publisher is used from one goroutine.
			Client: gwc, Kube: kube, Sink: publish.New(srv), DomainSuffix: cfg.DomainSuffix, Log: rt.Log,
			Cluster:      func() gatewayapi.Cluster { return src.GatewayCluster() },
			Published:    func(u []*istio.Object, d []istio.ID) { src.GeneratedChanged(u, d) },
			ConfigMapCAs: func(cas map[string][]byte) { src.ConfigMapCAsChanged(cas) },
			Controllers:  []gwv1.GatewayController{gwv1.GatewayController(cfg.GatewayController), gatewayapi.IstioController},
			Classes: map[string]gwv1.GatewayController{
				gatewayapi.DefaultClass: gwv1.GatewayController(cfg.GatewayController), gatewayapi.IstioClass: gatewayapi.IstioController,
			},
			Injection: func(rev string) (inject.Values, bool) { return src.InjectionValues(rev) }, SystemNamespace: cfg.SystemNamespace,
			Identity: identity, LeaseNamespace: cfg.SystemNamespace, LeaseName: "flotilla-galley-gateway-status",
		})
		srcOpts.ClusterChanged = gateways.Changed
	}
	var allocator *ipallocate.Controller
	if cfg.ServiceEntryAddresses {
		srcOpts.ServiceEntriesChanged = func() { allocator.Changed() } // set below, before the source runs
	} else {
		srcOpts.IgnoreAllocatedAddresses = true
	}
	src = kubesource.New(srcOpts, pub, srv)
	if cfg.ServiceEntryAddresses {
		ranges, err := cfg.addressRanges()
		if err != nil {
			return nil, nil, nil, err
		}
		allocator, err = ipallocate.NewController(ipallocate.Options{
			Kube: kube, Dynamic: dyn, Log: rt.Log, Objects: src.Objects, Synced: src.Synced(),
			IPv4: ranges[0], IPv6: ranges[1],
			Identity: identity, LeaseNamespace: cfg.SystemNamespace, LeaseName: "flotilla-galley-ipallocate",
		})
		if err != nil {
			return nil, nil, nil, err
		}
	}
	srv.ServeDebug(debugapi.Rejections, func() ([]*structpb.Struct, error) { return debugapi.Structs(src.Rejections()) })
	writer := status.New(status.Options{
		Kube: kube, Dynamic: dyn, Log: rt.Log, Rejected: src.Rejected, Findings: findings.Findings,
		Identity: identity, LeaseNamespace: cfg.SystemNamespace, LeaseName: "flotilla-galley-status",
	})
	access.UseCluster(kube.AuthorizationV1().SubjectAccessReviews())
	registrations := autoregister.New(autoregister.Options{
		Istio: ic, Caller: isDiscovery, Log: rt.Log, Now: time.Now,
		GracePeriod: cfg.WorkloadEntryGracePeriod, MaxConnectionAge: cfg.WorkloadEntryMaxConnectionAge,
	})
	registrations.Register(g)
	actors := []lifecycle.Actor{
		{Name: "kubernetes:" + rest.Host, Run: src.Run},
		{Name: "status-writer", Run: writer.Run},
		{Name: "workloadentry-autoregistration", Run: registrations.Run},
		{Name: "rbac", Run: func(ctx context.Context) error { return access.WatchRBAC(ctx, kube) }},
	}
	if gateways != nil {
		actors = append(actors, lifecycle.Actor{Name: "gateway-api", Run: gateways.Run})
	}
	if allocator != nil {
		actors = append(actors, lifecycle.Actor{Name: "ip-autoallocate", Run: allocator.Run})
	}
	return actors, src.Synced(), src.Objects, nil
}

// webhookActors serves the validating webhook when it has a certificate.
func webhookActors(cfg Config, rt *command.Runtime, objects func() []*istio.Object, certs *certclient.Client) ([]lifecycle.Actor, error) {
	var actors []lifecycle.Actor
	var tlsCfg *tls.Config
	switch {
	case certs != nil:
		tlsCfg = certs.ServerConfig(nil)
	case cfg.Webhook.TLS.Enabled():
		rl, err := tlsreload.New(cfg.Webhook.TLS, rt.Log)
		if err != nil {
			return nil, fmt.Errorf("webhook tls: %w", err)
		}
		tlsCfg = rl.ServerConfig()
		actors = append(actors, lifecycle.Actor{Name: "webhook-certs", Run: rl.Run})
	default:
		return nil, nil
	}
	h, err := webhook.Handler(webhook.Options{
		Log: rt.Log, Meter: rt.Telemetry.Meter.Meter("flotilla/galley/webhook"), IstioMeter: rt.Telemetry.Istio.Meter("istio"),
		// Subset warnings look at the DestinationRules galley serves.
		Context: func() validation.Context { return validation.NewSubsetIndex(objects(), cfg.DomainSuffix) },
	})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", cfg.Webhook.Address)
	if err != nil {
		return nil, fmt.Errorf("webhook listen: %w", err)
	}
	actors = append(actors, lifecycle.Actor{Name: "webhook", Run: func(ctx context.Context) error {
		return webhook.Serve(ctx, rt.Log, lis, tlsCfg, h, cfg.ShutdownTimeout)
	}})
	// In a cluster, a leader keeps the ValidatingWebhookConfiguration's
	// caBundle equal to the CA of the certificate served.
	if bundle := cmp.Or(cfg.Webhook.CABundleFile, cfg.CA.RootsFile); bundle != "" && cfg.ConfigDir == "" {
		c, err := cabundle.FromSetup(cabundle.Setup{
			Kubeconfig: cfg.Kubeconfig, Kind: cabundle.Validating, Webhook: cfg.Webhook.Configuration,
			Bundle: cabundle.FileBundle(bundle, rt.Log), LeaseNamespace: cfg.SystemNamespace, LeaseName: "flotilla-galley-cabundle", Log: rt.Log,
		})
		if err != nil {
			return nil, err
		}
		if c != nil {
			actors = append(actors, lifecycle.Actor{Name: "cabundle", Run: c.Run})
		}
	}
	return actors, nil
}
