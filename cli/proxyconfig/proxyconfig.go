// Package proxyconfig is `flotilla proxy-config`: the configuration a
// proxy's discovery replica gives it (its config_dump, internal/debugapi),
// as istioctl proxy-config's short tables or in full as JSON or YAML,
// filtered as istioctl filters it. Sidecars, gateways and proxyless gRPC
// clients alike: what is shown is what the replica would send the proxy
// now (flotilla proxy-status PROXY tells whether the proxy has taken it).
package proxyconfig

import (
	"bytes"
	"cmp"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/platform/pemcerts"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	// The Envoy types a config dump holds, to decode them.
	_ "github.com/flotilla-mesh/flotilla/internal/translate"
)

// Filters narrow what is shown, as istioctl proxy-config's flags do.
type Filters struct {
	FQDN      string // clusters: the service host (a prefix of it matches, as istioctl's)
	Port      int    // clusters, listeners, endpoints
	Subset    string // clusters
	Direction string // clusters: inbound or outbound
	Name      string // listeners, routes, secrets: the resource's name; endpoints: the cluster
	Address   string // listeners, endpoints
}

// kinds are the things proxy-config shows, in the order "all" shows them.
var kinds = []string{"cluster", "listener", "route", "endpoint", "secret", "ecds"}

// plural is how output in full names a kind's list ("clusters", "ecds").
func plural(kind string) string {
	if kind == "ecds" {
		return kind
	}
	return kind + "s"
}

// The sources proxy-config reads: what discovery would send the proxy
// now, or what the proxy (Envoy) holds.
const (
	SourceDiscovery = "discovery"
	SourceProxy     = "proxy"
)

// NewCommand returns the proxy-config command; conn is the root's
// connection flags.
func NewCommand(conn *connect.Options) *cobra.Command {
	var f Filters
	var output, agent, source, file, levels string
	var reset bool
	cmd := &cobra.Command{
		Use:   "proxy-config {cluster|listener|route|endpoint|secret|ecds|all|bootstrap|log} PROXY | rootca-compare PROXY PROXY",
		Short: "Show the configuration a proxy's discovery replica gives it, or the proxy holds",
		Long: `proxy-config shows the clusters, listeners, routes, endpoints, secrets or extension configurations
(ecds: the Wasm modules of WasmPlugins and TrafficExtensions, and EnvoyFilter's EXTENSION_CONFIG) that the discovery replica
serving PROXY (its node ID, or pod.namespace) would send it now, for what the proxy watches (an Envoy
proxy's clusters, listeners, routes and endpoints in full), as istioctl proxy-config's tables (-o short)
or in full (-o json, -o yaml). Secrets are the workload certificate (default) and trust bundle (ROOTCA)
the proxy's agent holds, read from its status port as bootstrap below, and the gateway certificates
discovery serves (credentialName), with serial, validity and identity, never the key.
Extension configurations are as discovery sends them (a module's URL, not the agent's local copy), a
module's registry credentials redacted.
Endpoint health is what discovery sends (Envoy's outlier detection happens in the proxy and is not known
there).

--source proxy shows instead what the proxy itself holds, as istioctl proxy-config does: Envoy's own
config dump (its bootstrap's static resources beside those it took over xDS; Envoy redacts keys), and
for endpoints Envoy's /clusters, with each host's health and outlier check. It is read from Envoy's
admin through the agent's status port (as bootstrap below); a proxyless gRPC application has no Envoy
to read. --file reads an Envoy config dump (or, for endpoints, Envoy's /clusters?format=json) saved
before, "-" for standard input, and needs no PROXY.

bootstrap is the one the agent in the pod wrote for its proxy (Envoy's, or a proxyless gRPC
application's GRPC_XDS_BOOTSTRAP), as JSON (or -o yaml), read from the agent's status port: in a
cluster through the apiserver's port-forward to the pod (port 15020), under make run from the
context file, or at --agent-address.

log shows the levels of Envoy's loggers, and with --level changes them (a level for all, or
logger:level for one, comma-separated), or with --reset sets them all back to warning, as istioctl
proxy-config log does (Flotilla's injector starts Envoy at warning unless the pod's
sidecar.istio.io/logLevel says otherwise; --reset does not read it).

rootca-compare reads the trust bundles (ROOTCA) two proxies' agents hold, as istioctl proxy-config
rootca-compare: they can reach each other over mTLS when the bundles share a root; it exits 1 when
they share none.`,
		Example: `  flotilla proxy-config cluster client-1.demo
  flotilla proxy-config cluster client-1.demo --fqdn greeter.demo.svc.cluster.local --port 50051 --direction outbound
  flotilla proxy-config listener app-1.default --port 80
  flotilla proxy-config route app-1.default --name 80 -o json
  flotilla proxy-config endpoint app-1.default --cluster 'outbound|80||backend.default.svc.cluster.local'
  flotilla proxy-config endpoint app-1.default --source proxy
  flotilla proxy-config cluster --file config_dump.json
  flotilla proxy-config secret ingressgateway-1.istio-system
  flotilla proxy-config ecds reviews-1.bookinfo -o json
  flotilla proxy-config all app-1.default -o yaml
  flotilla proxy-config bootstrap client.demo
  flotilla proxy-config log app-1.default --level http:debug,router:debug
  flotilla proxy-config rootca-compare client.demo greeter-v1.demo`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && args[0] == "rootca-compare" {
				if len(args) != 3 {
					return fmt.Errorf("rootca-compare takes two proxies, got %d", len(args)-1)
				}
				return nil
			}
			if cmd.Flags().Changed("file") {
				return cobra.ExactArgs(1)(nil, args)
			}
			return cobra.ExactArgs(2)(nil, args)
		},
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			switch len(args) {
			case 0:
				return append(slices.Clone(kinds), "all", "bootstrap", "log", "rootca-compare"), cobra.ShellCompDirectiveNoFileComp
			case 1:
				return conn.ProxyNames(cmd.Context()), cobra.ShellCompDirectiveNoFileComp
			case 2:
				if args[0] == "rootca-compare" {
					return conn.ProxyNames(cmd.Context()), cobra.ShellCompDirectiveNoFileComp
				}
			}
			return nil, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			kind := args[0]
			if kind == "rootca-compare" {
				if agent != "" {
					return errors.New("rootca-compare reads two agents: from the context file, or the cluster's pods; --agent-address names one")
				}
				return rootCACompare(cmd.Context(), cmd.OutOrStdout(), conn, args[1], args[2])
			}
			if kind != "ecds" {
				kind = strings.TrimSuffix(kind, "s")
			}
			if kind != "all" && kind != "bootstrap" && kind != "log" && !slices.Contains(kinds, kind) {
				return fmt.Errorf("%q: want one of %s, all, bootstrap, log", args[0], strings.Join(kinds, ", "))
			}
			if (levels != "" || reset) && kind != "log" {
				return errors.New("--level and --reset are log's")
			}
			switch output {
			case "short", "json", "yaml":
			default:
				return fmt.Errorf("--output %q: want short, json or yaml", output)
			}
			if source != SourceDiscovery && source != SourceProxy {
				return fmt.Errorf("--source %q: want %s or %s", source, SourceDiscovery, SourceProxy)
			}
			if file != "" && (kind == "bootstrap" || kind == "log") {
				return fmt.Errorf("--file is an Envoy config dump: %s reads the proxy", kind)
			}
			switch kind {
			case "bootstrap":
				return showBootstrap(cmd.Context(), cmd.OutOrStdout(), conn, agent, args[1], output)
			case "log":
				if output != "short" {
					return errors.New("--output is not applicable to log")
				}
				return logLevels(cmd.Context(), cmd.OutOrStdout(), conn, agent, args[1], levels, reset)
			}
			if f.Direction != "" && f.Direction != proxycontract.Inbound && f.Direction != proxycontract.Outbound {
				return fmt.Errorf("--direction %q: want %s or %s", f.Direction, proxycontract.Inbound, proxycontract.Outbound)
			}
			show := []string{kind}
			if kind == "all" {
				show = kinds
			}
			if file != "" || source == SourceProxy {
				dump, err := proxyDump(cmd, conn, agent, args, file, kind)
				if dump == nil {
					return err
				}
				if err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "some of the proxy's configuration is not shown: %v\n", err)
				}
				return Print(cmd.OutOrStdout(), dump, show, f, output, time.Now())
			}
			ctx, cl, done, err := conn.Connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			dump, err := Fetch(ctx, cl, args[1])
			if err != nil {
				return err
			}
			if slices.Contains(show, "secret") {
				// The workload's own certificate and roots are the
				// agent's; without it, discovery's secrets are still true.
				ws, err := agentSecrets(cmd.Context(), conn, agent, args[1])
				if err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "the workload certificates (default, ROOTCA) are not shown: %v\n", err)
				}
				dump.Secrets = append(ws, dump.Secrets...)
			}
			return Print(cmd.OutOrStdout(), dump, show, f, output, time.Now())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.FQDN, "fqdn", "", "clusters of this service host")
	fl.IntVar(&f.Port, "port", 0, "clusters, listeners or endpoints of this port")
	fl.StringVar(&f.Subset, "subset", "", "clusters of this subset")
	fl.StringVar(&f.Direction, "direction", "", "clusters of this direction: inbound or outbound")
	fl.StringVar(&f.Name, "name", "", "the listener, route configuration, secret or extension configuration of this name")
	fl.StringVar(&f.Name, "cluster", "", "endpoints of this cluster (the same as --name)")
	fl.StringVar(&f.Address, "address", "", "listeners or endpoints of this address")
	fl.StringVarP(&output, "output", "o", "short", "output format: short, json or yaml (a bootstrap: json, or yaml)")
	fl.StringVar(&agent, "agent-address", "", "bootstrap, secrets, log and --source proxy: the proxy's agent's status port, host:port (default: the context file's, or in a cluster the pod's through port-forward)")
	fl.StringVar(&source, "source", SourceDiscovery, "what to show: discovery (what the proxy's replica would send it now) or proxy (what Envoy holds, read through its agent)")
	fl.StringVarP(&file, "file", "f", "", "read an Envoy config dump (endpoints: Envoy's /clusters?format=json) from this file, - for standard input, instead of a proxy")
	fl.StringVar(&levels, "level", "", "log: the level of every logger (trace, debug, info, warning, error, critical, off), or logger:level for one, comma-separated")
	fl.BoolVarP(&reset, "reset", "r", false, "log: set every logger back to warning")
	return cmd
}

// proxyDump is what the proxy holds: Envoy's config dump (for endpoints,
// its /clusters) from its agent or from --file. A Dump with an error is
// partial: some resources could not be read.
func proxyDump(cmd *cobra.Command, conn *connect.Options, agent string, args []string, file, kind string) (*Dump, error) {
	var body []byte
	var err error
	endpoints := kind == "endpoint"
	switch {
	case file != "":
		body, err = readFile(cmd.InOrStdin(), file)
	case endpoints:
		body, err = conn.AgentDo(cmd.Context(), agent, args[1], http.MethodGet, debugapi.AgentEnvoyPath+debugapi.EnvoyClusters+"?format=json", maxEnvoyBytes)
	default:
		body, err = conn.AgentDo(cmd.Context(), agent, args[1], http.MethodGet, debugapi.AgentEnvoyPath+debugapi.EnvoyConfigDump+"?include_eds=true", maxEnvoyBytes)
	}
	if err != nil {
		return nil, err
	}
	if endpoints {
		hosts, err := ParseEnvoyClusters(body)
		if err != nil {
			return nil, err
		}
		return &Dump{HostStatuses: hosts}, nil
	}
	return ParseEnvoyDump(body)
}

// readFile reads a saved dump ("-": stdin), to at most maxEnvoyBytes.
func readFile(stdin io.Reader, path string) ([]byte, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	body, err := io.ReadAll(io.LimitReader(r, maxEnvoyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(body) > maxEnvoyBytes {
		return nil, fmt.Errorf("%s: larger than %d MiB", path, maxEnvoyBytes>>20)
	}
	return body, nil
}

// envoyLevel is the level Envoy's loggers take for s, with istioctl's
// spelling "warn" for warning (stringToLevel).
func envoyLevel(s string) (string, bool) {
	switch s {
	case "trace", "debug", "info", "warning", "error", "critical", "off":
		return s, true
	case "warn":
		return "warning", true
	}
	return "", false
}

// resetLevel is what --reset sets every logger to: Envoy's level in an
// injected pod unless the pod says otherwise (istioctl's
// defaultEnvoyOutputLevel).
const resetLevel = "warning"

// LogChanges are the requests to Envoy's /logging that levels (as
// --level takes them: "L", "logger:L", "logger=L", a "ns::" prefix
// dropped, comma-separated) or reset ask for, in order: every logger
// first, then one at a time in the order given, as istioctl proxy-config
// log (logCmd). known is Envoy's answer listing its loggers; a logger it
// does not name is an error.
func LogChanges(levels string, reset bool, known string) ([]string, error) {
	if reset {
		if levels != "" {
			return nil, errors.New("--level cannot be combined with --reset")
		}
		return []string{"level=" + resetLevel}, nil
	}
	var all string
	var one []string
	for _, part := range strings.Split(levels, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if !strings.ContainsAny(part, ":=") {
			l, ok := envoyLevel(part)
			if !ok {
				return nil, fmt.Errorf("unrecognized logging level: %s", part)
			}
			all = "level=" + l
			continue
		}
		if i := strings.LastIndex(part, "::"); i >= 0 {
			part = part[i+2:]
		}
		logger, level, _ := strings.Cut(strings.Replace(part, "=", ":", 1), ":")
		l, ok := envoyLevel(level)
		if !ok {
			return nil, fmt.Errorf("unrecognized logging level: %s", level)
		}
		if logger == "level" {
			all = "level=" + l
			continue
		}
		if !strings.Contains(known, "  "+logger+": ") {
			return nil, fmt.Errorf("unrecognized logger name: %s (flotilla proxy-config log PROXY lists them)", logger)
		}
		one = append(one, logger+"="+l)
	}
	if all != "" {
		one = append([]string{all}, one...)
	}
	return one, nil
}

// logLevels shows Envoy's loggers' levels, after changing them as levels
// or reset ask.
func logLevels(ctx context.Context, w io.Writer, conn *connect.Options, agent, proxy, levels string, reset bool) error {
	post := func(query string) (string, error) {
		path := debugapi.AgentEnvoyPath + debugapi.EnvoyLogging
		if query != "" {
			path += "?" + query
		}
		body, err := conn.AgentDo(ctx, agent, proxy, http.MethodPost, path, maxAgentBytes)
		return string(body), err
	}
	answer, err := post("")
	if err != nil {
		return err
	}
	changes, err := LogChanges(levels, reset, answer)
	if err != nil {
		return err
	}
	for _, c := range changes {
		if answer, err = post(c); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(w, "%s:\n%s", connect.ProxyName(proxy), answer)
	return err
}

// showBootstrap prints the bootstrap the proxy's agent wrote.
func showBootstrap(ctx context.Context, w io.Writer, conn *connect.Options, given, proxy, output string) error {
	body, err := conn.AgentDo(ctx, given, proxy, http.MethodGet, debugapi.AgentBootstrapPath, maxAgentBytes)
	if err != nil {
		return err
	}
	var b debugapi.AgentBootstrap
	if err := json.Unmarshal(body, &b); err != nil {
		return fmt.Errorf("the agent of %s: %w", proxy, err)
	}
	var out bytes.Buffer
	if output == "yaml" {
		y, err := yaml.JSONToYAML(b.Bootstrap)
		if err != nil {
			return fmt.Errorf("bootstrap: %w", err)
		}
		out.Write(y)
	} else {
		if err := json.Indent(&out, b.Bootstrap, "", "  "); err != nil {
			return fmt.Errorf("bootstrap: %w", err)
		}
		out.WriteByte('\n')
	}
	_, err = w.Write(out.Bytes())
	return err
}

// agentSecrets are the workload secrets the proxy's agent holds
// (debugapi.AgentSecretsPath), their keys redacted.
func agentSecrets(ctx context.Context, conn *connect.Options, given, proxy string) ([]*tlsv3.Secret, error) {
	body, err := conn.AgentDo(ctx, given, proxy, http.MethodGet, debugapi.AgentSecretsPath, maxAgentBytes)
	if err != nil {
		return nil, err
	}
	var dump adminv3.SecretsConfigDump
	if err := protojson.Unmarshal(body, &dump); err != nil {
		return nil, fmt.Errorf("the agent of %s: secrets: %w", proxy, err)
	}
	var out []*tlsv3.Secret
	var errs []error
	for _, s := range dump.GetDynamicActiveSecrets() {
		errs = append(errs, into(s.GetSecret(), &out))
	}
	return out, errors.Join(errs...)
}

// rootCACompare says whether two proxies' agents hold trust bundles that
// share a root, as istioctl's rootca-compare (checkRootCACertMatchExist);
// an error when they share none.
func rootCACompare(ctx context.Context, w io.Writer, conn *connect.Options, a, b string) error {
	var bundles [2][]*x509.Certificate
	for i, p := range []string{a, b} {
		secrets, err := agentSecrets(ctx, conn, "", p)
		if err != nil {
			return err
		}
		pemRoots, ok := rootsOf(secrets)
		if !ok {
			return fmt.Errorf("the agent of %s holds no ROOTCA yet (has it a certificate from ca?)", p)
		}
		if bundles[i], err = pemcerts.Parse(pemRoots); err != nil {
			return fmt.Errorf("the ROOTCA of %s: %w", p, err)
		}
	}
	na, nb := connect.ProxyName(a), connect.ProxyName(b)
	if !shareARoot(bundles[0], bundles[1]) {
		return fmt.Errorf("both [%s] and [%s] have the non identical ROOTCA, theoretically the connectivity between them is unavailable", na, nb)
	}
	_, err := fmt.Fprintf(w, "Both [%s] and [%s] have the identical ROOTCA, theoretically the connectivity between them is available\n", na, nb)
	return err
}

// rootsOf is the trust bundle among an agent's secrets.
func rootsOf(secrets []*tlsv3.Secret) ([]byte, bool) {
	for _, s := range secrets {
		if s.GetName() == proxycontract.SecretRoot {
			return s.GetValidationContext().GetTrustedCa().GetInlineBytes(), true
		}
	}
	return nil, false
}

// shareARoot reports whether the two bundles hold a certificate in common.
func shareARoot(a, b []*x509.Certificate) bool {
	return slices.ContainsFunc(a, func(c *x509.Certificate) bool { return slices.ContainsFunc(b, c.Equal) })
}

// maxAgentBytes bounds what is read from an agent; maxEnvoyBytes what
// is read of Envoy's admin through it (a config dump of a large mesh runs
// to tens of MiB).
const (
	maxAgentBytes = 4 << 20
	maxEnvoyBytes = 256 << 20
)

// Dump is a proxy's configuration as its replica would send it now.
type Dump struct {
	Proxy     connect.Row
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	Secrets   []*tlsv3.Secret
	// ExtensionConfigs are the ECDS resources the proxy asks for.
	ExtensionConfigs []*corev3.TypedExtensionConfig
	// PatchedBy are the EnvoyFilters that changed a resource, by
	// "kind/name" ("cluster/outbound|80||a.b.svc.cluster.local").
	PatchedBy map[string][]string
	// DestinationRules are the DestinationRule ("namespace/name") each
	// outbound cluster follows, by cluster name.
	DestinationRules map[string]string
	// HostStatuses are the endpoints as Envoy holds them (its /clusters),
	// with their health and outlier check; when set, endpoints are shown
	// from them rather than from Endpoints.
	HostStatuses []*adminv3.ClusterStatus
}

// Fetch finds the proxy and reads its config_dump from its replica.
func Fetch(ctx context.Context, cl *connect.Client, name string) (*Dump, error) {
	row, err := cl.Locate(ctx, name)
	if err != nil {
		return nil, err
	}
	a := cl.Fetch(ctx, row.Address, debugapi.ConfigDump, row.Proxy.ID)
	if a.Err != nil {
		return nil, fmt.Errorf("config_dump of %s on %s: %w", row.Proxy.ID, row.Address, a.Err)
	}
	d := &Dump{Proxy: row}
	var errs []error
	for _, res := range a.Resp.GetResources() {
		m, err := res.UnmarshalNew()
		if err != nil {
			errs = append(errs, fmt.Errorf("section %s: %w", res.GetTypeUrl(), err))
			continue
		}
		errs = append(errs, d.add(m))
	}
	return d, errors.Join(errs...)
}

// add takes in one section of a config dump: discovery's, or Envoy's
// own, whose static resources (the bootstrap's) are shown beside the
// dynamic ones as istioctl shows them; warming and draining ones are not.
func (d *Dump) add(section proto.Message) error {
	var errs []error
	switch s := section.(type) {
	case *adminv3.ClustersConfigDump:
		for _, c := range s.GetStaticClusters() {
			errs = append(errs, into(c.GetCluster(), &d.Clusters))
		}
		for _, c := range s.GetDynamicActiveClusters() {
			errs = append(errs, into(c.GetCluster(), &d.Clusters))
		}
	case *adminv3.EndpointsConfigDump:
		for _, e := range s.GetStaticEndpointConfigs() {
			errs = append(errs, into(e.GetEndpointConfig(), &d.Endpoints))
		}
		for _, e := range s.GetDynamicEndpointConfigs() {
			errs = append(errs, into(e.GetEndpointConfig(), &d.Endpoints))
		}
	case *adminv3.ListenersConfigDump:
		for _, l := range s.GetStaticListeners() {
			errs = append(errs, into(l.GetListener(), &d.Listeners))
		}
		for _, l := range s.GetDynamicListeners() {
			if l.GetActiveState() != nil {
				errs = append(errs, into(l.GetActiveState().GetListener(), &d.Listeners))
			}
		}
	case *adminv3.RoutesConfigDump:
		for _, r := range s.GetStaticRouteConfigs() {
			errs = append(errs, into(r.GetRouteConfig(), &d.Routes))
		}
		for _, r := range s.GetDynamicRouteConfigs() {
			errs = append(errs, into(r.GetRouteConfig(), &d.Routes))
		}
	case *adminv3.SecretsConfigDump:
		for _, r := range s.GetStaticSecrets() {
			errs = append(errs, into(r.GetSecret(), &d.Secrets))
		}
		for _, r := range s.GetDynamicActiveSecrets() {
			errs = append(errs, into(r.GetSecret(), &d.Secrets))
		}
	case *adminv3.EcdsConfigDump:
		for _, r := range s.GetEcdsFilters() {
			errs = append(errs, into(r.GetEcdsFilter(), &d.ExtensionConfigs))
		}
	case *structpb.Struct:
		for k, v := range s.GetFields()[debugapi.MetadataDestinationRules].GetStructValue().GetFields() {
			if d.DestinationRules == nil {
				d.DestinationRules = map[string]string{}
			}
			d.DestinationRules[k] = v.GetStringValue()
		}
		for k, v := range s.GetFields()[debugapi.MetadataEnvoyFilters].GetStructValue().GetFields() {
			if d.PatchedBy == nil {
				d.PatchedBy = map[string][]string{}
			}
			for _, ef := range v.GetListValue().GetValues() {
				d.PatchedBy[k] = append(d.PatchedBy[k], ef.GetStringValue())
			}
		}
	}
	return errors.Join(errs...)
}

// ParseEnvoyDump reads Envoy's own /config_dump (JSON; with include_eds,
// its endpoints too). Each resource is read on its own: one whose types
// this CLI does not know (an extension of a build of Envoy's) is left
// out and named in the error, and the rest are in the Dump. Sections
// shown elsewhere (the bootstrap: proxy-config bootstrap) or not at all
// are skipped.
func ParseEnvoyDump(body []byte) (*Dump, error) {
	var top struct {
		Configs []map[string]json.RawMessage `json:"configs"`
	}
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("Envoy's config dump: %w", err) //nolint:staticcheck // Envoy is a name
	}
	d := &Dump{}
	var errs []error
	for _, sec := range top.Configs {
		var typeURL string
		if err := json.Unmarshal(sec["@type"], &typeURL); err != nil {
			errs = append(errs, fmt.Errorf("a section of Envoy's config dump without its @type: %w", err))
			continue
		}
		switch strings.TrimPrefix(typeURL, "type.googleapis.com/") {
		case "envoy.admin.v3.ClustersConfigDump", "envoy.admin.v3.EndpointsConfigDump", "envoy.admin.v3.ListenersConfigDump",
			"envoy.admin.v3.RoutesConfigDump", "envoy.admin.v3.SecretsConfigDump", "envoy.admin.v3.EcdsConfigDump":
		default:
			continue
		}
		mt, err := protoregistry.GlobalTypes.FindMessageByURL(typeURL)
		if err != nil {
			errs = append(errs, fmt.Errorf("section %s: %w", typeURL, err))
			continue
		}
		m := mt.New()
		fields := m.Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if !fd.IsList() || fd.Kind() != protoreflect.MessageKind {
				continue
			}
			raw, ok := sec[string(fd.Name())]
			if !ok {
				raw, ok = sec[fd.JSONName()]
			}
			var items []json.RawMessage
			if !ok {
				continue
			}
			if err := json.Unmarshal(raw, &items); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", typeURL, fd.Name(), err))
				continue
			}
			list := m.Mutable(fd).List()
			for _, it := range items {
				v := list.NewElement()
				if err := protojson.Unmarshal(it, v.Message().Interface()); err != nil {
					errs = append(errs, fmt.Errorf("%s: one of %s: %w", strings.TrimPrefix(typeURL, "type.googleapis.com/envoy.admin.v3."), fd.Name(), err))
					continue
				}
				list.Append(v)
			}
		}
		errs = append(errs, d.add(m.Interface()))
	}
	return d, errors.Join(errs...)
}

// ParseEnvoyClusters reads Envoy's /clusters?format=json: each cluster's
// hosts with their health as the proxy sees it (EDS's, and whether
// outlier detection has ejected it).
func ParseEnvoyClusters(body []byte) ([]*adminv3.ClusterStatus, error) {
	var c adminv3.Clusters
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(body, &c); err != nil {
		return nil, fmt.Errorf("Envoy's clusters: %w", err) //nolint:staticcheck // Envoy is a name
	}
	return c.GetClusterStatuses(), nil
}

// into decodes one resource and appends it.
func into[T proto.Message](a interface {
	UnmarshalTo(proto.Message) error
	GetTypeUrl() string
}, out *[]T,
) error {
	var zero T
	m := zero.ProtoReflect().New().Interface().(T) //nolint:forcetypeassert // New of T is a T
	if err := a.UnmarshalTo(m); err != nil {
		return fmt.Errorf("%s: %w", a.GetTypeUrl(), err)
	}
	*out = append(*out, m)
	return nil
}

// Print shows the kinds asked for, filtered, in the output format.
func Print(w io.Writer, d *Dump, show []string, f Filters, output string, now time.Time) error {
	var b bytes.Buffer
	full := map[string][]proto.Message{}
	for i, kind := range show {
		var rows [][]string
		var header []string
		var msgs []proto.Message
		// patched are the EnvoyFilters that changed each row's resource.
		var patched []string
		add := func(key string, rs ...[]string) {
			efs := strings.Join(d.PatchedBy[key], ",")
			for _, r := range rs {
				rows, patched = append(rows, r), append(patched, efs)
			}
		}
		switch kind {
		case "cluster":
			header = []string{"SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"}
			for _, c := range d.Clusters {
				if row, ok := clusterRow(c, d.DestinationRules[c.GetName()], f); ok {
					add("cluster/"+c.GetName(), row)
					msgs = append(msgs, c)
				}
			}
		case "listener":
			header = []string{"ADDRESSES", "PORT", "MATCH", "DESTINATION"}
			for _, l := range d.Listeners {
				if r := listenerRows(l, f); r != nil {
					add("listener/"+l.GetName(), r...)
					msgs = append(msgs, l)
				}
			}
		case "route":
			header = []string{"NAME", "VHOST NAME", "DOMAINS", "MATCH", "VIRTUAL SERVICE"}
			for _, r := range d.Routes {
				if f.Name == "" || r.GetName() == f.Name {
					add("route configuration/"+r.GetName(), routeRows(r)...)
					msgs = append(msgs, r)
				}
			}
		case "endpoint":
			header = []string{"ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"}
			for _, c := range d.HostStatuses {
				if r := hostRows(c, f); r != nil {
					rows, msgs = append(rows, r...), append(msgs, c)
				}
			}
			// As istioctl's retrieveSortedEndpointClusterSlice (the
			// endpoint's address sorts as text, as there).
			slices.SortStableFunc(rows, func(a, b []string) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[3], b[3])) })
			for _, e := range d.Endpoints {
				if r := endpointRows(e, f); r != nil {
					rows, msgs = append(rows, r...), append(msgs, e)
				}
			}
		case "secret":
			header = []string{"RESOURCE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "NOT BEFORE", "IDENTITY"}
			for _, s := range d.Secrets {
				if f.Name == "" || s.GetName() == f.Name {
					rows, msgs = append(rows, secretRow(s, now)), append(msgs, s)
				}
			}
		case "ecds":
			header = []string{"NAME", "TYPE"}
			for _, ec := range d.ExtensionConfigs {
				if f.Name == "" || ec.GetName() == f.Name {
					add("extension configuration/"+ec.GetName(), []string{ec.GetName(), strings.TrimPrefix(ec.GetTypedConfig().GetTypeUrl(), "type.googleapis.com/")})
					msgs = append(msgs, ec)
				}
			}
		}
		full[plural(kind)] = msgs
		if output != "short" {
			continue
		}
		// A column of the EnvoyFilters that changed the resources, when
		// one did.
		if slices.ContainsFunc(patched, func(s string) bool { return s != "" }) {
			header = append(header, "ENVOYFILTERS")
			for j := range rows {
				rows[j] = append(rows[j], cmp.Or(patched[j], "-"))
			}
		}
		if i > 0 {
			b.WriteString("\n")
		}
		tw := tabwriter.NewWriter(&b, 0, 8, 5, ' ', 0)
		fmt.Fprintln(tw, strings.Join(header, "\t"))
		for _, r := range rows {
			fmt.Fprintln(tw, strings.Join(r, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if output != "short" {
		return writeFull(w, show, full, output)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// writeFull prints the resources in full: one list for one kind, an
// object of lists for several.
func writeFull(w io.Writer, show []string, full map[string][]proto.Message, output string) error {
	toJSON := func(ms []proto.Message) ([]json.RawMessage, error) {
		out := make([]json.RawMessage, 0, len(ms))
		for _, m := range ms {
			b, err := protojson.Marshal(m)
			if err != nil {
				return nil, fmt.Errorf("%T: %w", m, err)
			}
			out = append(out, b)
		}
		return out, nil
	}
	var v any
	if len(show) == 1 {
		list, err := toJSON(full[plural(show[0])])
		if err != nil {
			return err
		}
		v = list
	} else {
		obj := map[string][]json.RawMessage{}
		for _, k := range show {
			list, err := toJSON(full[plural(k)])
			if err != nil {
				return err
			}
			obj[plural(k)] = list
		}
		v = obj
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("json: %w", err)
	}
	if output == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("yaml: %w", err)
		}
	} else {
		b = append(b, '\n')
	}
	_, err = w.Write(b)
	return err
}

// clusterName splits Istio's cluster names, direction|port|subset|host,
// as istioctl does; another name is its own FQDN.
func clusterName(name string) (direction, port, subset, fqdn string) {
	if dir, n, subset, host, ok := proxycontract.ParseClusterName(name); ok {
		return dir, strconv.FormatUint(uint64(n), 10), subset, host
	}
	return "", "", "", name
}

// clusterRow is a cluster's row; dr is the DestinationRule
// ("namespace/name") discovery says it follows, shown where the cluster's
// own istio metadata (an Envoy cluster's, as Istio's) does not say.
func clusterRow(c *clusterv3.Cluster, dr string, f Filters) ([]string, bool) {
	dir, port, subset, fqdn := clusterName(c.GetName())
	if (f.FQDN != "" && !strings.HasPrefix(fqdn, f.FQDN)) || (f.Port != 0 && port != strconv.Itoa(f.Port)) ||
		(f.Subset != "" && subset != f.Subset) || (f.Direction != "" && dir != f.Direction) {
		return nil, false
	}
	typ := c.GetType().String()
	if c.GetClusterType() != nil {
		typ = c.GetClusterType().GetName()
	}
	// As istioctl: the DestinationRule the cluster's istio metadata names,
	// as name.namespace.
	shown := "-"
	if cfg := c.GetMetadata().GetFilterMetadata()["istio"].GetFields()["config"].GetStringValue(); cfg != "" {
		shown = configName(cfg)
	} else if ns, name, ok := strings.Cut(dr, "/"); ok {
		shown = name + "." + ns
	}
	return []string{fqdn, cmp.Or(port, "-"), cmp.Or(subset, "-"), cmp.Or(dir, "-"), typ, shown}, true
}

// configName is "name.namespace" of Istio's config path
// /apis/<group>/<version>/namespaces/<ns>/<kind>/<name>.
func configName(path string) string {
	p := strings.Split(strings.Trim(path, "/"), "/")
	if len(p) == 7 && p[3] == "namespaces" {
		return p[6] + "." + p[4]
	}
	return path
}

func listenerRows(l *listenerv3.Listener, f Filters) [][]string {
	if f.Name != "" && l.GetName() != f.Name {
		return nil
	}
	addr := l.GetAddress().GetSocketAddress()
	if l.GetApiListener() != nil {
		// A proxyless client's listener: a name, no socket.
		host, port, _ := strings.Cut(l.GetName(), ":")
		if (f.Port != 0 && port != strconv.Itoa(f.Port)) || (f.Address != "" && host != f.Address) {
			return nil
		}
		return [][]string{{host, cmp.Or(port, "-"), "API listener", "Route: " + apiRoute(l)}}
	}
	address, port := addr.GetAddress(), addr.GetPortValue()
	if (f.Port != 0 && int(port) != f.Port) || (f.Address != "" && address != f.Address) {
		return nil
	}
	var rows [][]string
	for _, fc := range l.GetFilterChains() {
		rows = append(rows, []string{address, strconv.Itoa(int(port)), chainMatch(fc.GetFilterChainMatch()), destination(fc)})
	}
	if dc := l.GetDefaultFilterChain(); dc != nil {
		rows = append(rows, []string{address, strconv.Itoa(int(port)), "ALL (default)", destination(dc)})
	}
	if len(rows) == 0 {
		rows = append(rows, []string{address, strconv.Itoa(int(port)), "-", "-"})
	}
	return rows
}

func apiRoute(l *listenerv3.Listener) string {
	var hcm hcmv3.HttpConnectionManager
	if l.GetApiListener().GetApiListener().UnmarshalTo(&hcm) != nil {
		return "-"
	}
	if rds := hcm.GetRds(); rds != nil {
		return rds.GetRouteConfigName()
	}
	return cmp.Or(hcm.GetRouteConfig().GetName(), "-")
}

// chainMatch describes a filter chain's match as istioctl does.
func chainMatch(m *listenerv3.FilterChainMatch) string {
	if m == nil {
		return "ALL"
	}
	var parts []string
	if p := m.GetDestinationPort(); p != nil {
		parts = append(parts, "Port: "+strconv.Itoa(int(p.GetValue())))
	}
	if len(m.GetServerNames()) > 0 {
		parts = append(parts, "SNI: "+strings.Join(m.GetServerNames(), ","))
	}
	if t := m.GetTransportProtocol(); t != "" {
		parts = append(parts, "Trans: "+t)
	}
	if a := m.GetApplicationProtocols(); len(a) > 0 {
		parts = append(parts, "App: "+strings.Join(a, ","))
	}
	for _, r := range m.GetPrefixRanges() {
		parts = append(parts, "Addr: "+r.GetAddressPrefix()+"/"+strconv.Itoa(int(r.GetPrefixLen().GetValue())))
	}
	if len(parts) == 0 {
		return "ALL"
	}
	return strings.Join(parts, "; ")
}

// destination is where a filter chain sends traffic: its HTTP
// connection manager's route configuration, or its TCP proxy's cluster.
func destination(fc *listenerv3.FilterChain) string {
	for _, flt := range fc.GetFilters() {
		switch tc := flt.GetTypedConfig(); {
		case tc.MessageIs(&hcmv3.HttpConnectionManager{}):
			var hcm hcmv3.HttpConnectionManager
			if tc.UnmarshalTo(&hcm) != nil {
				return "-"
			}
			if rds := hcm.GetRds(); rds != nil {
				return "Route: " + rds.GetRouteConfigName()
			}
			return "Inline Route: " + cmp.Or(hcm.GetRouteConfig().GetName(), "-")
		case tc.MessageIs(&tcpv3.TcpProxy{}):
			var tp tcpv3.TcpProxy
			if tc.UnmarshalTo(&tp) != nil {
				return "-"
			}
			if c := tp.GetCluster(); c != "" {
				return "Cluster: " + c
			}
			var names []string
			for _, wc := range tp.GetWeightedClusters().GetClusters() {
				names = append(names, wc.GetName())
			}
			return "Clusters: " + strings.Join(names, ",")
		}
	}
	return "-"
}

// routeRows are a route configuration's rows as istioctl's verbose route
// table (PrintRouteSummary): one per route, with its domains, its match
// and the VirtualService it came from; a virtual host without routes is
// Envoy's 404.
func routeRows(rc *routev3.RouteConfiguration) [][]string {
	var rows [][]string
	for _, vh := range rc.GetVirtualHosts() {
		domains := routeDomains(vh.GetDomains())
		for _, r := range vh.GetRoutes() {
			vs := "-"
			if cfg := r.GetMetadata().GetFilterMetadata()["istio"].GetFields()["config"].GetStringValue(); cfg != "" {
				vs = configName(cfg)
				if strings.Contains(cfg, gatewayapi.GeneratedName) {
					// A VirtualService galley generated from the Gateway
					// API: the rule's name says which route it is, as
					// Istio names it (<namespace>.<route>.<position>, or
					// the rule's own name).
					vs = r.GetName() + " (Gateway API)"
				}
			} else if r.GetDirectResponse().GetStatus() == 404 {
				vs = "404"
			}
			rows = append(rows, []string{rc.GetName(), vh.GetName(), domains, routeMatch(r.GetMatch()), vs})
		}
		if len(vh.GetRoutes()) == 0 {
			rows = append(rows, []string{rc.GetName(), vh.GetName(), domains, "/*", "404"})
		}
	}
	if len(rows) == 0 {
		rows = append(rows, []string{rc.GetName(), "-", "-", "-", "-"})
	}
	return rows
}

// routeDomains is a virtual host's domains as istioctl's
// describeRouteDomains shows them: the ones without a port, a name's
// longer forms (.svc, .svc.cluster.local) left out when the short one is
// there, at most two and a count of the rest.
func routeDomains(domains []string) string {
	switch len(domains) {
	case 0:
		return "-"
	case 1:
		return domains[0]
	}
	all := map[string]bool{}
	for _, d := range domains {
		all[d] = true
	}
	var shown []string
	for _, d := range domains {
		colons := strings.Count(d, ":")
		if colons > 0 && (colons <= 2 || !strings.HasSuffix(d, "]")) {
			continue // a host:port, or an IPv6 address with a port
		}
		if short := strings.TrimSuffix(d, ".svc.cluster.local"); short != d && all[short] {
			continue
		}
		if short := strings.TrimSuffix(d, ".svc"); short != d && all[short] {
			continue
		}
		shown = append(shown, d)
	}
	if len(shown) > 2 {
		return fmt.Sprintf("%s + %d more...", strings.Join(shown[:2], ", "), len(shown)-2)
	}
	return strings.Join(shown, ", ")
}

// routeMatch is a route's match: its path as istioctl's describeMatch
// prints it, then the header and query conditions istioctl leaves out
// (without them routes that differ by a header look the same).
func routeMatch(m *routev3.RouteMatch) string {
	var conds []string
	switch {
	case m.GetPath() != "":
		conds = append(conds, m.GetPath())
	case m.GetPrefix() != "":
		conds = append(conds, m.GetPrefix()+"*")
	case m.GetSafeRegex() != nil:
		conds = append(conds, "regex "+m.GetSafeRegex().GetRegex())
	case m.GetPathSeparatedPrefix() != "":
		conds = append(conds, "PathPrefix:"+m.GetPathSeparatedPrefix())
	case m.GetPathMatchPolicy() != nil:
		conds = append(conds, "(path template)")
	default:
		conds = append(conds, "/*")
	}
	for _, h := range m.GetHeaders() {
		conds = append(conds, "header "+condition(h.GetName(), h.GetInvertMatch(), h.GetStringMatch(), h.GetPresentMatch() || h.GetHeaderMatchSpecifier() == nil))
	}
	for _, q := range m.GetQueryParameters() {
		conds = append(conds, "query "+condition(q.GetName(), false, q.GetStringMatch(), q.GetPresentMatch()))
	}
	return strings.Join(conds, " ")
}

// condition is one header or query parameter match: name=value (a * for
// a prefix, suffix or substring), name~regex, or the name alone when it
// need only be present; ! before it when inverted.
func condition(name string, invert bool, sm *matcherv3.StringMatcher, present bool) string {
	s := name
	switch {
	case sm.GetExact() != "":
		s += "=" + sm.GetExact()
	case sm.GetPrefix() != "":
		s += "=" + sm.GetPrefix() + "*"
	case sm.GetSuffix() != "":
		s += "=*" + sm.GetSuffix()
	case sm.GetContains() != "":
		s += "=*" + sm.GetContains() + "*"
	case sm.GetSafeRegex() != nil:
		s += "~" + sm.GetSafeRegex().GetRegex()
	case present || sm == nil:
	default:
		s += "=" // an exact match of the empty value
	}
	if invert {
		return "!" + s
	}
	return s
}

func endpointRows(e *endpointv3.ClusterLoadAssignment, f Filters) [][]string {
	if f.Name != "" && e.GetClusterName() != f.Name {
		return nil
	}
	var rows [][]string
	for _, loc := range e.GetEndpoints() {
		for _, lb := range loc.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			if (f.Port != 0 && int(sa.GetPortValue()) != f.Port) || (f.Address != "" && sa.GetAddress() != f.Address) {
				continue
			}
			health := lb.GetHealthStatus()
			if health == corev3.HealthStatus_UNKNOWN {
				health = corev3.HealthStatus_HEALTHY // Envoy routes to UNKNOWN as to HEALTHY
			}
			rows = append(rows, []string{sa.GetAddress() + ":" + strconv.Itoa(int(sa.GetPortValue())), health.String(), "-", e.GetClusterName()})
		}
	}
	return rows
}

// hostRows are a cluster's hosts as Envoy holds them, as istioctl's
// PrintEndpointsSummary shows them (retrieveEndpointAddress: a pipe as
// unix://, an internal listener as envoy://).
func hostRows(c *adminv3.ClusterStatus, f Filters) [][]string {
	if f.Name != "" && c.GetName() != f.Name {
		return nil
	}
	var rows [][]string
	for _, h := range c.GetHostStatuses() {
		addr, port := "unknown", uint32(0)
		switch {
		case h.GetAddress().GetSocketAddress() != nil:
			addr, port = h.GetAddress().GetSocketAddress().GetAddress(), h.GetAddress().GetSocketAddress().GetPortValue()
		case h.GetAddress().GetPipe() != nil:
			addr = "unix://" + h.GetAddress().GetPipe().GetPath()
		case h.GetAddress().GetEnvoyInternalAddress() != nil:
			in := h.GetAddress().GetEnvoyInternalAddress()
			addr = "envoy://" + in.GetServerListenerName() + "/" + in.GetEndpointId()
		}
		if (f.Port != 0 && int(port) != f.Port) || (f.Address != "" && !strings.EqualFold(addr, f.Address)) {
			continue
		}
		endpoint := addr
		if port != 0 {
			endpoint += ":" + strconv.Itoa(int(port))
		}
		outlier := "OK"
		if h.GetHealthStatus().GetFailedOutlierCheck() {
			outlier = "FAILED"
		}
		rows = append(rows, []string{endpoint, h.GetHealthStatus().GetEdsHealthStatus().String(), outlier, c.GetName()})
	}
	return rows
}

// secretRow is a served certificate's serial, validity and identity
// (its SPIFFE URI or DNS names); never its key, which discovery's dump
// has redacted anyway.
func secretRow(s *tlsv3.Secret, now time.Time) []string {
	if ctx := s.GetValidationContext(); ctx != nil {
		return certRow(s.GetName(), "ROOTCA", ctx.GetTrustedCa().GetInlineBytes(), now)
	}
	if tc := s.GetTlsCertificate(); tc != nil {
		return certRow(s.GetName(), "Cert Chain", tc.GetCertificateChain().GetInlineBytes(), now)
	}
	return []string{s.GetName(), "Generic", "-", "-", "-", "-", "-", "-"}
}

func certRow(name, typ string, chain []byte, now time.Time) []string {
	block, _ := pem.Decode(chain)
	if block == nil {
		return []string{name, typ, "NOT PEM", "false", "-", "-", "-", "-"}
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return []string{name, typ, "UNREADABLE", "false", "-", "-", "-", "-"}
	}
	valid := now.After(c.NotBefore) && now.Before(c.NotAfter)
	var ids []string
	for _, u := range c.URIs {
		ids = append(ids, u.String())
	}
	ids = append(ids, c.DNSNames...)
	return []string{
		name, typ, "ACTIVE", strconv.FormatBool(valid), c.SerialNumber.Text(16),
		c.NotAfter.UTC().Format(time.RFC3339), c.NotBefore.UTC().Format(time.RFC3339), cmp.Or(strings.Join(ids, ","), "-"),
	}
}
