package app

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/certclient"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/platform/atomicfile"
	"github.com/flotilla-mesh/flotilla/internal/platform/buildinfo"
	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/internal/platform/grpcserver"
	"github.com/flotilla-mesh/flotilla/internal/platform/lifecycle"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/internal/spiffe"
	"github.com/flotilla-mesh/flotilla/services/agent/bootstrap"
	"github.com/flotilla-mesh/flotilla/services/agent/dns"
	"github.com/flotilla-mesh/flotilla/services/agent/envoy"
	"github.com/flotilla-mesh/flotilla/services/agent/health"
	"github.com/flotilla-mesh/flotilla/services/agent/identity"
	"github.com/flotilla-mesh/flotilla/services/agent/probe"
	"github.com/flotilla-mesh/flotilla/services/agent/sds"
	"github.com/flotilla-mesh/flotilla/services/agent/uds"
	"github.com/flotilla-mesh/flotilla/services/agent/xdsproxy"
)

// Config is the configuration of `flotilla-agent proxy`. The pod's
// identity comes from the environment the injected template sets
// (POD_NAME, POD_NAMESPACE, INSTANCE_IP, SERVICE_ACCOUNT, TRUST_DOMAIN,
// DISCOVERY_ADDRESS, CA_ADDRESS, CLUSTER_ID, PROXY_CONFIG), read as the
// defaults that flags and FLOTILLA_* variables override.
type Config struct {
	command.Common `yaml:",inline"`
	// Type is proxycontract.Sidecar or Router, the command's argument.
	Type string `yaml:"-"`

	PodName        string `yaml:"podName" usage:"the pod's name (default $POD_NAME, else the host's name, as on a VM)"`
	PodNamespace   string `yaml:"podNamespace" usage:"the pod's namespace (default $POD_NAMESPACE)"`
	InstanceIP     string `yaml:"instanceIP" usage:"the pod's IP (default $INSTANCE_IP, else $ISTIO_SVC_IP as a VM's cluster.env sets it, else the first private address of the pod's interfaces, as Istio's agent)"`
	ServiceAccount string `yaml:"serviceAccount" usage:"the pod's service account (default $SERVICE_ACCOUNT)"`
	TrustDomain    string `yaml:"trustDomain" usage:"the mesh's trust domain (default $TRUST_DOMAIN, else cluster.local)"`
	DomainSuffix   string `yaml:"domainSuffix" usage:"the cluster's DNS domain"`
	ClusterID      string `yaml:"clusterID" usage:"the cluster's name (default $CLUSTER_ID, else Kubernetes)"`
	// DiscoveryAddress is discovery's mTLS xDS port.
	DiscoveryAddress string `yaml:"discoveryAddress" usage:"discovery's mTLS xDS address, host:port (default $DISCOVERY_ADDRESS)"`
	// DiscoveryServerName is checked against discovery's certificate.
	DiscoveryServerName string `yaml:"discoveryServerName" usage:"DNS name discovery's certificate must carry (default the host of discoveryAddress)"`
	// CA gets the workload certificate (CA_ADDRESS; the projected token and
	// the istio-ca-root-cert mount).
	CA certclient.Config `yaml:",inline"`
	// CertsDir holds Istio's file-mounted certificates, used instead of ca
	// when present.
	CertsDir string        `yaml:"certsDir" usage:"directory of file-mounted certificates (cert-chain.pem, key.pem, root-cert.pem), used instead of ca when all three are there"`
	CertTTL  time.Duration `yaml:"certTTL" usage:"lifetime asked of ca for the workload certificate"`
	// ProxyConfig is the pod's proxy.istio.io/config, as JSON.
	ProxyConfig string `yaml:"proxyConfig" usage:"the pod's proxy config (Istio's ProxyConfig, JSON or YAML; default $PROXY_CONFIG)"`
	// MeshConfigFile is a mesh configuration whose defaultConfig is the
	// proxy config when ProxyConfig is empty (a VM's mesh.yaml).
	MeshConfigFile string `yaml:"meshConfigFile" usage:"mesh configuration file whose defaultConfig is the proxy config when proxyConfig is empty, as on a VM (Istio's path; a missing file is none)"`
	// AppProbers are the application's original probes, which the
	// injector rewrote to the agent's /app-health/ paths.
	AppProbers  string `yaml:"appProbers" usage:"the application's original probes, answered on /app-health/<container>/{livez,readyz,startupz} (Istio's JSON; default $ISTIO_KUBE_APP_PROBERS)"`
	SDSSocket   string `yaml:"sdsSocket" usage:"Unix socket of the SDS server Envoy reads its certificates from"`
	XDSSocket   string `yaml:"xdsSocket" usage:"Unix socket of the xDS proxy Envoy connects to"`
	Delta       bool   `yaml:"delta" usage:"Envoy asks for incremental (delta) xDS, as in Istio; false: state of the world"`
	EnvoyBinary string `yaml:"envoyBinary" usage:"Envoy's binary"`
	EnvoyConfig string `yaml:"envoyConfig" usage:"where the bootstrap is written for Envoy"`
	EnvoyAdmin  string `yaml:"envoyAdmin" usage:"Envoy's admin address, host:port, written into the bootstrap (loopback: it is not protected)"`
	// DisableEnvoy runs the agent for proxyless gRPC applications only.
	DisableEnvoy bool `yaml:"disableEnvoy" usage:"run no Envoy and serve no SDS: the pod's applications are proxyless gRPC (default $DISABLE_ENVOY)"`
	// GRPCBootstrap is where the gRPC xDS bootstrap is written.
	GRPCBootstrap string `yaml:"grpcBootstrap" usage:"write the gRPC xDS bootstrap for proxyless applications here (default $GRPC_XDS_BOOTSTRAP; empty: none)"`
	// OutputCerts is where the certificate files are kept for them.
	OutputCerts string `yaml:"outputCerts" usage:"keep the workload certificate, key and roots in this directory as cert-chain.pem, key.pem, root-cert.pem (default $OUTPUT_CERTS, else /var/lib/istio/data with grpcBootstrap; empty: none)"`
	// GRPCCertRefresh is how often gRPC reads the files again.
	GRPCCertRefresh time.Duration `yaml:"grpcCertRefresh" usage:"how often proxyless applications read the certificate files again (the gRPC bootstrap's refresh_interval)"`
	// AppMetrics are the application's Prometheus scrape settings, whose
	// metrics /stats/prometheus serves after Envoy's and the agent's.
	AppMetrics string `yaml:"appMetrics" usage:"the application's Prometheus scrape settings as JSON ({\"port\", \"path\", \"scrape\"}), merged into /stats/prometheus (default $ISTIO_PROMETHEUS_ANNOTATIONS, which the injector sets from the pod's prometheus.io annotations)"`
	// PodAnnotations is the pod's annotations file (the downward API's).
	PodAnnotations string `yaml:"podAnnotations" usage:"the pod's annotations, as the downward API writes them (the sidecar.istio.io/stats* ones shape Envoy's stats, as in Istio; a missing file is none)"`
	// Wasm is the cache of the modules ECDS resources load.
	Wasm WasmConfig `yaml:"wasm"`
	// DNSCapture runs the DNS proxy (Istio's ISTIO_META_DNS_CAPTURE).
	DNSCapture bool `yaml:"dnsCapture" usage:"answer the pod's DNS for the mesh's hosts from the name table discovery sends, forwarding other names to the resolvers of /etc/resolv.conf, on dnsProxyAddress, where the init container's capture (--redirect-dns) sends the pod's DNS; sidecars only, as Istio's agent (default $ISTIO_META_DNS_CAPTURE, which proxyMetadata sets)"`
	// DNSProxyAddress is where the DNS proxy listens.
	DNSProxyAddress string `yaml:"dnsProxyAddress" usage:"UDP and TCP address of the DNS proxy; localhost listens on 127.0.0.1, and ::1 too when a resolver is IPv6 (default $DNS_PROXY_ADDR, else localhost:15053)"`
}

func proxyDefaults() Config {
	env := func(k, d string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return d
	}
	// The proxy config's statusPort and proxyAdminPort move the agent's
	// status server and Envoy's admin (as in Istio's agent); flags and
	// FLOTILLA_* variables still override them. A proxy config that does
	// not parse is refused by Validate.
	statusPort, adminPort := int32(bootstrap.AgentPort), int32(bootstrap.AdminPort)
	if pc, err := istio.ParseProxyConfig([]byte(os.Getenv("PROXY_CONFIG"))); err == nil {
		if p := pc.GetStatusPort(); p > 0 && p <= 65535 {
			statusPort = p
		}
		if p := pc.GetProxyAdminPort(); p > 0 && p <= 65535 {
			adminPort = p
		}
	}
	return Config{
		Common:           command.CommonDefaults(fmt.Sprintf(":%d", statusPort)),
		PodName:          env("POD_NAME", hostname()),
		PodNamespace:     os.Getenv("POD_NAMESPACE"),
		InstanceIP:       env("INSTANCE_IP", os.Getenv("ISTIO_SVC_IP")),
		ServiceAccount:   os.Getenv("SERVICE_ACCOUNT"),
		TrustDomain:      env("TRUST_DOMAIN", controlplane.DefaultTrustDomain),
		DomainSuffix:     controlplane.DefaultDomainSuffix,
		ClusterID:        env("CLUSTER_ID", controlplane.DefaultClusterID),
		DiscoveryAddress: os.Getenv("DISCOVERY_ADDRESS"),
		CA: certclient.Config{ //nolint:gosec // paths of the projected token and root mounts, not credentials
			Address: os.Getenv("CA_ADDRESS"), RootsFile: "/var/run/secrets/istio/root-cert.pem", TokenFile: "/var/run/secrets/tokens/istio-token",
		},
		CertsDir:       identity.CertsDir,
		CertTTL:        24 * time.Hour,
		ProxyConfig:    os.Getenv("PROXY_CONFIG"),
		MeshConfigFile: MeshConfigFile,
		AppProbers:     os.Getenv(probe.EnvVar),
		SDSSocket:      sds.SocketPath,
		XDSSocket:      xdsproxy.SocketPath,
		Delta:          true,
		EnvoyBinary:    "/usr/local/bin/envoy",
		EnvoyConfig:    bootstrap.ConfigPath,
		EnvoyAdmin:     fmt.Sprintf("127.0.0.1:%d", adminPort),

		DisableEnvoy:    os.Getenv("DISABLE_ENVOY") == "true",
		GRPCBootstrap:   os.Getenv("GRPC_XDS_BOOTSTRAP"),
		OutputCerts:     os.Getenv("OUTPUT_CERTS"),
		GRPCCertRefresh: 5 * time.Minute,
		Wasm:            wasmDefaults(),
		PodAnnotations:  PodAnnotationsFile,
		AppMetrics:      os.Getenv(proxycontract.PrometheusScrapeEnv),
		// Istio's StringBool: a value that is not a boolean is false.
		DNSCapture:      envBool(proxycontract.DNSCaptureEnv),
		DNSProxyAddress: env("DNS_PROXY_ADDR", dns.DefaultAddress()),
	}
}

// MeshConfigFile is where Istio's agent reads the mesh configuration
// (a VM's mesh.yaml goes there).
const MeshConfigFile = "/etc/istio/config/mesh"

// hostname is the machine's name: the pod's name on a VM, where nothing
// sets POD_NAME (Istio's agent names the proxy after the host there).
func hostname() string {
	h, _ := os.Hostname()
	return h
}

// proxyConfig is the proxy config: proxyConfig's, else the mesh
// configuration file's defaultConfig, else none.
func (c Config) proxyConfig() (*meshv1alpha1.ProxyConfig, error) {
	if c.ProxyConfig != "" {
		pc, err := istio.ParseProxyConfig([]byte(c.ProxyConfig))
		if err != nil {
			return nil, fmt.Errorf("proxyConfig (PROXY_CONFIG): %w", err)
		}
		return pc, nil
	}
	if c.MeshConfigFile == "" {
		return nil, nil
	}
	if _, err := os.Stat(c.MeshConfigFile); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	mesh, err := istio.ReadMeshConfig(c.MeshConfigFile)
	if err != nil {
		return nil, fmt.Errorf("meshConfigFile: %w", err)
	}
	return mesh.GetDefaultConfig(), nil
}

// envBool is an environment variable read as a boolean; false when unset
// or not one.
func envBool(name string) bool {
	b, _ := strconv.ParseBool(os.Getenv(name))
	return b
}

// Validate checks the configuration.
func (c Config) Validate() error {
	errs := []error{c.Common.Validate(), c.CA.Validate(), c.Wasm.Validate()}
	for _, f := range [][2]string{{"podName (POD_NAME)", c.PodName}, {"podNamespace (POD_NAMESPACE)", c.PodNamespace}, {"serviceAccount (SERVICE_ACCOUNT)", c.ServiceAccount}} {
		if f[1] == "" {
			errs = append(errs, fmt.Errorf("%s is not set", f[0]))
		}
	}
	if c.InstanceIP != "" && net.ParseIP(c.InstanceIP) == nil {
		errs = append(errs, fmt.Errorf("instanceIP (INSTANCE_IP) %q is not an IP address", c.InstanceIP))
	}
	if _, _, err := net.SplitHostPort(c.DiscoveryAddress); err != nil {
		errs = append(errs, fmt.Errorf("discoveryAddress (DISCOVERY_ADDRESS) %q: %w", c.DiscoveryAddress, err))
	}
	if pc, err := c.proxyConfig(); err != nil {
		errs = append(errs, err)
	} else if rp := pc.GetReadinessProbe(); rp != nil {
		if _, err := health.New(health.Options{Probe: rp}); err != nil {
			errs = append(errs, fmt.Errorf("the proxy config's readinessProbe: %w", err))
		}
	}
	if _, err := probe.Parse(c.AppProbers); err != nil {
		errs = append(errs, fmt.Errorf("appProbers: %w", err))
	}
	if c.CertTTL <= 0 {
		errs = append(errs, errors.New("certTTL must be positive"))
	}
	if c.GRPCCertRefresh < time.Second {
		errs = append(errs, errors.New("grpcCertRefresh must be at least 1s"))
	}
	if c.DNSCapture {
		if _, _, err := net.SplitHostPort(c.DNSProxyAddress); err != nil {
			errs = append(errs, fmt.Errorf("dnsProxyAddress (DNS_PROXY_ADDR) %q: %w", c.DNSProxyAddress, err))
		}
	}
	if c.DisableEnvoy && c.GRPCBootstrap == "" {
		errs = append(errs, errors.New("disableEnvoy (DISABLE_ENVOY) without grpcBootstrap (GRPC_XDS_BOOTSTRAP) leaves the pod nothing to serve"))
	}
	return errors.Join(errs...)
}

func proxyCommand() *cobra.Command {
	return command.New(command.Spec[Config]{
		Name:  "flotilla-agent",
		Use:   "proxy sidecar|router",
		Short: "Run next to Envoy or proxyless gRPC applications: the workload certificate, the xDS proxy to discovery, Envoy's bootstrap and lifecycle",
		Long: "proxy gets the pod's certificate from ca (or serves the files mounted at /etc/certs) and serves it to Envoy over SDS on " + sds.SocketPath +
			"; relays Envoy's ADS from " + xdsproxy.SocketPath + " to discovery over mTLS with that certificate; writes Envoy's bootstrap and runs Envoy, " +
			"draining it on SIGTERM; and answers :15020/healthz/ready (Envoy ready, certificate held, xDS connected), /stats/prometheus (Envoy's and the agent's metrics) " +
			"and the application's probes on /app-health/<container>/{livez,readyz,startupz} (the originals come from $ISTIO_KUBE_APP_PROBERS, which the injector sets when it rewrites them); " +
			"to loopback clients only (kubectl port-forward), the bootstrap it wrote (/debug/bootstrap), the workload secrets without keys (/debug/secrets), the DNS proxy's name table (/debug/ndsz, as Istio's agent) and Envoy's config_dump, clusters, stats, server_info and logging levels (/debug/envoy/..., for flotilla proxy-config --source proxy, proxy-config log and x envoy-stats). " +
			"For proxyless gRPC applications (Istio's grpc-agent template) it writes the gRPC xDS bootstrap ($GRPC_XDS_BOOTSTRAP), whose server is the xDS proxy's socket, " +
			"and keeps the certificate files its certificate provider reads ($OUTPUT_CERTS); with $DISABLE_ENVOY=true it runs no Envoy and no SDS server. " +
			"The Wasm modules of ECDS resources (WasmPlugins) are fetched by the agent, over http(s) or from OCI registries with the plugin's pull secret, " +
			"kept in --wasm-cache-dir, and Envoy loads them from there; a module that cannot be fetched leaves an RBAC filter allowing (FAIL_OPEN) or denying all in its place. " +
			"Istio's WASM_INSECURE_REGISTRIES, WASM_MODULE_EXPIRY, WASM_PURGE_INTERVAL, WASM_HTTP_REQUEST_TIMEOUT, WASM_HTTP_REQUEST_MAX_RETRIES, " +
			"ISTIO_WASM_MAX_BINARY_SIZE_BYTES and BLOCKED_CIDRS_IN_WASM_FETCH are the defaults of the --wasm-* flags. " +
			"With ISTIO_META_DNS_CAPTURE=true (--dns-capture; proxyMetadata sets it) a sidecar's agent asks discovery for the name table and answers the pod's DNS from it on --dns-proxy-address (UDP and TCP), " +
			"as Istio's agent: the mesh's hosts (A and AAAA, a Service's short forms, the first search domain's expansion), every other name forwarded to /etc/resolv.conf's resolvers; " +
			"the init container (iptables --redirect-dns, from the same variable) captures the pod's DNS to it. " +
			"With a readinessProbe in the proxy config (a VM's mesh.yaml carries its WorkloadGroup's, as `flotilla x workload entry configure` writes it) the agent probes the workload as Istio's agent does (httpGet, tcpSocket, grpc or exec, after Envoy is ready; Istio's defaults and thresholds) " +
			"and reports each change of its health up the xDS stream; discovery has galley write it into the workload's WorkloadEntry (condition Healthy), and an entry whose health is checked gets traffic only while it is True. " +
			"The node's metadata carries, besides what the agent sets itself, every ISTIO_META_<KEY> variable of its environment and of the proxy config's proxyMetadata as <KEY>, as Istio's agent sends them (an EnvoyFilter's proxy.metadata match reads them).",
		Defaults: proxyDefaults,
		Args: func(args []string, cfg *Config) error {
			if len(args) != 1 || (args[0] != proxycontract.Sidecar && args[0] != proxycontract.Router) {
				return fmt.Errorf("want one argument, %s or %s; got %q", proxycontract.Sidecar, proxycontract.Router, args)
			}
			cfg.Type = args[0]
			return nil
		},
		Run: runProxy,
	})
}

func runProxy(ctx context.Context, cfg Config, rt *command.Runtime) error {
	pc, err := cfg.proxyConfig()
	if err != nil {
		return err
	}
	if cfg.InstanceIP == "" {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return fmt.Errorf("instanceIP (INSTANCE_IP) is not set and the interfaces' addresses cannot be read: %w", err)
		}
		if cfg.InstanceIP = privateIP(addrs); cfg.InstanceIP == "" {
			return errors.New("instanceIP (INSTANCE_IP) is not set and the pod has no private address on its interfaces: set it to the pod's IP")
		}
		rt.Log.Info("pod IP taken from the interfaces (INSTANCE_IP is not set)", "ip", cfg.InstanceIP)
	}
	state := identity.New()
	actors, err := identitySource(cfg, state, rt.Log)
	if err != nil {
		return err
	}
	node := bootstrap.Node{
		Type: cfg.Type, IP: cfg.InstanceIP, PodName: cfg.PodName, Namespace: cfg.PodNamespace, DomainSuffix: cfg.DomainSuffix,
		ServiceAccount: cfg.ServiceAccount, ClusterID: cfg.ClusterID, Labels: labelsFromEnv(rt.Log),
		Metadata: bootstrap.MetadataFromEnv(pc.GetProxyMetadata(), os.Environ()),
		// As pilot-agent does: the proxy's version is the agent's, which
		// flotilla proxy-status and version show.
		IstioVersion: buildinfo.Get().Version,
	}
	modules, err := cfg.Wasm.cache(rt.Log, rt.Telemetry.Istio.Meter("istio"))
	if err != nil {
		return err
	}
	if modules != nil {
		actors = append(actors, lifecycle.Actor{Name: "wasm-cache", Run: modules.Run})
	}
	xo := xdsproxy.Options{Address: cfg.DiscoveryAddress, ServerName: cfg.DiscoveryServerName, State: state, Wasm: modules, Log: rt.Log}
	// As Istio's agent (Agent.isDNSServerEnabled): the DNS proxy serves a
	// sidecar's pod, whose Envoy stream carries the name table.
	names := func() proto.Message { return nil }
	switch {
	case !cfg.DNSCapture:
	case cfg.Type != proxycontract.Sidecar || cfg.DisableEnvoy:
		rt.Log.Warn("dnsCapture (ISTIO_META_DNS_CAPTURE) is for sidecars with Envoy: no DNS proxy runs", "type", cfg.Type, "disable_envoy", cfg.DisableEnvoy)
	default:
		resolver, err := dnsProxy(cfg, rt)
		if err != nil {
			return err
		}
		node.DNSCapture = true
		xo.NameTable = resolver.Update
		names = func() proto.Message {
			if nt := resolver.NameTable(); nt != nil {
				return nt
			}
			return nil
		}
		actors = append(actors, lifecycle.Actor{Name: "dns-proxy", Run: resolver.Run})
	}
	rt.HandleAdmin("GET "+debugapi.AgentNameTablePath, debugapi.NameTableHandler(names))
	xproxy, err := xdsproxy.New(xo)
	if err != nil {
		return err
	}
	defer xproxy.Close()
	if rp := pc.GetReadinessProbe(); rp != nil {
		// As Istio's agent (NewWorkloadHealthChecker): Envoy's readiness
		// first, then the workload's own probe, reported up the xDS stream.
		o := health.Options{Probe: rp, Host: cfg.InstanceIP}
		if !cfg.DisableEnvoy {
			o.Also = func(ctx context.Context) error {
				if !envoy.Ready(ctx, cfg.EnvoyAdmin) {
					return errors.New("envoy is not ready")
				}
				return nil
			}
		}
		checker, err := health.New(o)
		if err != nil {
			return fmt.Errorf("proxy config: %w", err)
		}
		actors = append(actors, lifecycle.Actor{Name: "health-check", Run: func(ctx context.Context) error {
			checker.Run(ctx, func(e health.Event) {
				rt.Log.Info("workload health changed", "healthy", e.Healthy, "reason", e.Message)
				xproxy.ReportHealth(e.Healthy, e.Message)
			})
			return nil
		}})
	}
	xdsMode := uds.Private
	if cfg.GRPCBootstrap != "" {
		xdsMode = uds.Shared // the application's own xDS client dials it
	}
	xdsServer, err := unixServer(rt, cfg.XDSSocket, xdsMode, xproxy.Register, xdsproxy.ServerOptions()...)
	if err != nil {
		return err
	}
	probers, err := probe.Parse(cfg.AppProbers)
	if err != nil {
		return err
	}
	ready := readiness{state: state}
	if dir := cfg.outputCerts(); dir != "" {
		// In a pod (Kubernetes sets KUBERNETES_SERVICE_HOST in every
		// container) the files are for the application's containers, which
		// run as users of their own: readable by all, as Istio's agent
		// writes them there; elsewhere by this user alone.
		ready.files = &identity.Writer{Dir: dir, State: state, Log: rt.Log, Shared: os.Getenv("KUBERNETES_SERVICE_HOST") != ""}
		actors = append(actors, lifecycle.Actor{Name: "certificate-files", Run: ready.files.Run})
	}
	if cfg.GRPCBootstrap != "" {
		b, err := bootstrap.BuildGRPC(bootstrap.GRPCOptions{Node: node, XDSSocket: cfg.XDSSocket, CertsDir: cfg.outputCerts(), CertRefresh: cfg.GRPCCertRefresh})
		if err != nil {
			return err
		}
		if err := atomicfile.Write(cfg.GRPCBootstrap, b, 0o644); err != nil {
			return fmt.Errorf("gRPC bootstrap: %w", err)
		}
		rt.HandleAdmin("GET "+debugapi.AgentBootstrapPath, debugapi.BootstrapHandler(debugapi.AgentBootstrap{Type: debugapi.BootstrapGRPC, Bootstrap: b}))
		rt.Log.Info("gRPC xDS bootstrap written", "path", cfg.GRPCBootstrap, "certificates", cfg.outputCerts())
	}
	appMetrics, err := appMetricsURL(cfg.AppMetrics, cfg.statusPort())
	if err != nil {
		return err
	}
	rt.HandleAdmin("GET "+probe.PathPrefix, probe.Handler{Probers: probers, Host: cfg.InstanceIP})
	rt.HandleAdmin("GET "+debugapi.AgentSecretsPath, debugapi.SecretsHandler(func() []*tlsv3.Secret { return sds.Redacted(state.Snapshot()) }))
	if cfg.DisableEnvoy {
		handleEnvoyAdmin(rt.HandleAdmin, "")
		rt.HandleAdmin("GET /healthz/ready", ready)
		rt.HandleAdmin("GET /stats/prometheus", mergedStats("", rt.Telemetry.MetricsHandler(), appMetrics))
		actors = append(actors, lifecycle.Actor{Name: "xds-proxy", Run: xdsServer})
		return rt.Serve(ctx, actors...)
	}

	annotations, err := readPodAnnotations(cfg.PodAnnotations)
	if err != nil {
		return err
	}
	boot, problems, err := bootstrap.Build(bootstrap.Options{
		Node: node, ProxyConfig: pc, Delta: cfg.Delta, XDSSocket: cfg.XDSSocket, SDSSocket: cfg.SDSSocket, Admin: cfg.EnvoyAdmin,
		StatusPort: cfg.statusPort(), Annotations: annotations,
	})
	if err != nil {
		return err
	}
	for _, p := range problems {
		rt.Log.Warn("proxy config not honoured", "problem", p)
	}
	js, err := protojson.Marshal(boot)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if err := atomicfile.Write(cfg.EnvoyConfig, js, 0o600); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	rt.HandleAdmin("GET "+debugapi.AgentBootstrapPath, debugapi.BootstrapHandler(debugapi.AgentBootstrap{Type: debugapi.BootstrapEnvoy, Bootstrap: js}))
	sdsServer, err := unixServer(rt, cfg.SDSSocket, uds.Private, sds.New(state, rt.Log).Register)
	if err != nil {
		return err
	}
	ready.xproxy, ready.envoyAdmin = xproxy, cfg.EnvoyAdmin
	rt.HandleAdmin("GET /healthz/ready", ready)
	handleEnvoyAdmin(rt.HandleAdmin, cfg.EnvoyAdmin)
	rt.HandleAdmin("GET /stats/prometheus", mergedStats(cfg.EnvoyAdmin, rt.Telemetry.MetricsHandler(), appMetrics))

	// The sockets serve until Envoy has stopped: it keeps its
	// certificates and configuration while it drains.
	envoyDone := make(chan struct{})
	untilEnvoyStops := func(serve func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error {
			sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			defer cancel()
			go func() {
				<-envoyDone
				cancel()
			}()
			return serve(sctx)
		}
	}
	drain := 5 * time.Second
	if d := pc.GetTerminationDrainDuration(); d != nil {
		drain = d.AsDuration()
	}
	actors = append(actors,
		lifecycle.Actor{Name: "sds", Run: untilEnvoyStops(sdsServer)},
		lifecycle.Actor{Name: "xds-proxy", Run: untilEnvoyStops(xdsServer)},
		lifecycle.Actor{Name: "envoy", Run: func(ctx context.Context) error {
			defer close(envoyDone)
			err := envoy.Run(ctx, envoy.Options{
				Binary: cfg.EnvoyBinary, Args: bootstrap.EnvoyArgs(pc, cfg.EnvoyConfig, envoyLogLevel(cfg.Log.Level)),
				Admin: cfg.EnvoyAdmin, TerminationDrain: drain, KillAfter: 5 * time.Second, Log: rt.Log,
			})
			var ee *envoy.ExitError
			if errors.As(err, &ee) {
				return &command.ExitCodeError{Code: ee.Code, Err: err}
			}
			return err
		}},
	)
	return rt.Serve(ctx, actors...)
}

// dnsProxy is the DNS proxy of the pod, forwarding to the resolvers of
// its resolv.conf; it listens before the agent reports ready.
func dnsProxy(cfg Config, rt *command.Runtime) (*dns.Server, error) {
	upstreams, search, err := dns.ReadResolvConf(dns.ResolvConf)
	if err != nil {
		return nil, err
	}
	srv, err := dns.New(dns.Options{
		Address: cfg.DNSProxyAddress, Upstreams: upstreams, Search: search,
		Namespace: cfg.PodNamespace, Domain: proxycontract.PodDNSDomain(cfg.PodNamespace, cfg.DomainSuffix),
		Meter: rt.Telemetry.Istio.Meter("istio"), Log: rt.Log,
	})
	if err != nil {
		return nil, err
	}
	if err := srv.Listen(); err != nil {
		return nil, err
	}
	return srv, nil
}

// outputCerts is the directory the certificate files are kept in: the
// one configured, else Istio's when a gRPC bootstrap is written.
func (c Config) outputCerts() string {
	if c.OutputCerts == "" && c.GRPCBootstrap != "" {
		return bootstrap.GRPCCertsDir
	}
	return c.OutputCerts
}

// identitySource is what keeps the workload certificate and roots: the
// files mounted at CertsDir, or ca with the roots file.
func identitySource(cfg Config, state *identity.State, log *slog.Logger) ([]lifecycle.Actor, error) {
	if identity.Mounted(cfg.CertsDir) {
		log.Info("serving the mounted certificates", "dir", cfg.CertsDir)
		return []lifecycle.Actor{{Name: "mounted-certificates", Run: func(ctx context.Context) error {
			return identity.WatchMounted(ctx, state, cfg.CertsDir, 0, log)
		}}}, nil
	}
	if !cfg.CA.Enabled() {
		return nil, errors.New("no certificate source: set caAddress (CA_ADDRESS), or mount cert-chain.pem, key.pem and root-cert.pem in " + cfg.CertsDir)
	}
	host, _, err := net.SplitHostPort(cfg.CA.Address)
	if err != nil {
		return nil, fmt.Errorf("caAddress: %w", err)
	}
	want := spiffe.ID{TrustDomain: cfg.TrustDomain, Namespace: cfg.PodNamespace, ServiceAccount: cfg.ServiceAccount}
	client := certclient.New(certclient.Options{
		Address: cfg.CA.Address, ServerName: host,
		Roots: func() *x509.CertPool {
			if r := state.Snapshot().Roots; r != nil {
				return r
			}
			return x509.NewCertPool() // nothing trusted until the bundle is read
		},
		Token: certclient.TokenFile(cfg.CA.TokenFile),
		TTL:   cfg.CertTTL, RenewWithCertificate: true, Log: log,
		OnCertificate: func(c *tls.Certificate) {
			// ca gives the identity the token proves; the environment only
			// says which one the pod expects.
			if got, err := spiffe.FromCertificate(c.Leaf); err != nil || got != want {
				log.Warn("the certificate from ca is not for the identity the pod's environment names; discovery will refuse the proxy's claims",
					"certificate", got.String(), "environment", want.String())
			}
			if err := state.SetCertificate(c); err != nil {
				log.Error("holding the certificate from ca", "error", err)
			}
		},
	})
	return []lifecycle.Actor{
		{Name: "roots", Run: func(ctx context.Context) error { return identity.WatchRoots(ctx, state, cfg.CA.RootsFile, 0, log) }},
		{Name: "certificate:" + cfg.CA.Address, Run: client.Run},
	}, nil
}

// unixServer is a gRPC server on a Unix socket, as an actor's Run.
func unixServer(rt *command.Runtime, path string, mode os.FileMode, register func(*grpc.Server), extra ...grpc.ServerOption) (func(context.Context) error, error) {
	gs, err := grpcserver.New(grpcserver.Options{Log: rt.Log, Telemetry: rt.Telemetry, MaxRecvMsgBytes: xdsproxy.MaxMessageBytes, DrainTimeout: time.Second, Extra: extra})
	if err != nil {
		return nil, err
	}
	register(gs.Server)
	lis, err := uds.Listen(path, mode)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return gs.Serve(ctx, lis) }, nil
}

// readiness is 15020's /healthz/ready: a certificate held, the
// certificate files written (when kept), and with Envoy, discovery
// answering through the xDS proxy and Envoy ready. Without Envoy the xDS
// stream is the application's own, so readiness cannot wait for it (the
// application would wait on itself when the pod holds it until the agent
// is ready).
type readiness struct {
	state      *identity.State
	files      *identity.Writer // nil: no files kept
	xproxy     *xdsproxy.Proxy  // nil: no Envoy
	envoyAdmin string           // empty: no Envoy
}

func (rd readiness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var missing []string
	if !rd.state.Snapshot().Ready() {
		missing = append(missing, "no workload certificate yet")
	}
	if rd.xproxy != nil && !rd.xproxy.Connected() {
		missing = append(missing, "discovery has not answered yet")
	}
	if rd.files != nil && !rd.files.Written() {
		missing = append(missing, "the certificate files are not written yet")
	}
	if rd.envoyAdmin != "" && !envoy.Ready(r.Context(), rd.envoyAdmin) {
		missing = append(missing, "envoy is not ready")
	}
	if len(missing) > 0 {
		http.Error(w, strings.Join(missing, "; "), http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ready\n")
}

// mergedStats is 15020's /stats/prometheus: Envoy's metrics (envoyAdmin
// "" for none), the agent's own, then the application's (appURL "" for
// none), in one text exposition, as Istio's agent merges them
// (handleStats; the application's last). A source that fails is left
// out; each is read to at most 64 MiB.
func mergedStats(envoyAdmin string, agent http.Handler, appURL string) http.Handler {
	client := &http.Client{Timeout: 5 * time.Second}
	scrape := func(r *http.Request, w io.Writer, url string) {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, url, nil)
		if err != nil {
			return
		}
		req.Header.Set("Accept", "text/plain")
		resp, err := client.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			_, _ = io.Copy(w, io.LimitReader(resp.Body, 64<<20))
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if envoyAdmin != "" {
			scrape(r, w, "http://"+envoyAdmin+"/stats/prometheus")
		}
		var own bufferedResponse
		ar := r.Clone(r.Context())
		ar.Header.Del("Accept")          // the text format, which appends to Envoy's
		ar.Header.Del("Accept-Encoding") // uncompressed
		agent.ServeHTTP(&own, ar)
		_, _ = io.Copy(w, &own.body)
		if appURL != "" {
			scrape(r, w, appURL)
		}
	})
}

// bufferedResponse keeps a handler's body to be copied into another
// response; its status and headers are dropped.
type bufferedResponse struct {
	header http.Header
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header {
	if b.header == nil {
		b.header = http.Header{}
	}
	return b.header
}

func (b *bufferedResponse) Write(p []byte) (int, error) { return b.body.Write(p) }

func (b *bufferedResponse) WriteHeader(int) {}

// appMetricsURL is where the application's metrics are, from the scrape
// settings the injector moved off the pod's prometheus.io annotations
// (proxycontract.PrometheusScrapeEnv; Istio's ISTIO_PROMETHEUS_ANNOTATIONS):
// localhost, port 80 and /metrics unless they say otherwise, none when
// they say scrape "false" or are not there. A port that is the agent's
// own would scrape itself: refused.
func appMetricsURL(settings string, statusPort uint32) (string, error) {
	if settings == "" {
		return "", nil
	}
	var s proxycontract.PrometheusScrape
	if err := json.Unmarshal([]byte(settings), &s); err != nil {
		return "", fmt.Errorf("%s: %w", proxycontract.PrometheusScrapeEnv, err)
	}
	if s.Scrape == "false" {
		return "", nil
	}
	port, path := cmp.Or(s.Port, "80"), cmp.Or(s.Path, "/metrics")
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return "", fmt.Errorf("%s: port %q is not a port", proxycontract.PrometheusScrapeEnv, port)
	}
	if uint32(n) == statusPort {
		return "", fmt.Errorf("%s: the application's metrics port %d is the agent's own, which would scrape itself (is the pod injected twice?)", proxycontract.PrometheusScrapeEnv, n)
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return (&url.URL{Scheme: "http", Host: net.JoinHostPort("localhost", strconv.FormatUint(n, 10)), Path: path}).String(), nil
}

// labelsFromEnv reads the pod's labels from ISTIO_METAJSON_LABELS (JSON),
// when the template sets it.
func labelsFromEnv(log *slog.Logger) map[string]string {
	raw := os.Getenv("ISTIO_METAJSON_LABELS")
	if raw == "" {
		return nil
	}
	var labels map[string]string
	if err := json.Unmarshal([]byte(raw), &labels); err != nil {
		log.Warn("ISTIO_METAJSON_LABELS is not a JSON object of strings; the node has no labels", "error", err)
		return nil
	}
	return labels
}

// envoyLogLevel maps the agent's log level to Envoy's.
func envoyLogLevel(level string) string {
	switch level {
	case "debug":
		return "debug"
	case "info":
		return "info"
	case "error":
		return "error"
	}
	return "warning"
}

// privateIP is the pod's IP when the environment does not give it: the
// first address of its interfaces that another host could reach (not
// loopback, link-local or unspecified), IPv4 first, as Istio's agent falls
// back to the interfaces' private addresses (network.GetPrivateIPs) without
// INSTANCE_IP. Empty when there is none.
func privateIP(addrs []net.Addr) string {
	var v6 string
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.IsLoopback() || n.IP.IsLinkLocalUnicast() || n.IP.IsUnspecified() || !n.IP.IsGlobalUnicast() {
			continue
		}
		if n.IP.To4() != nil {
			return n.IP.String()
		}
		if v6 == "" {
			v6 = n.IP.String()
		}
	}
	return v6
}

// statusPort is the port of the agent's own server (adminAddress), which
// Envoy's readiness listener reads; 0 when it names none.
func (c Config) statusPort() uint32 {
	_, port, err := net.SplitHostPort(c.AdminAddress)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return 0
	}
	return uint32(n)
}
