package bootstrap

import (
	"encoding/json"
	"flag"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/golden"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func cart() Node {
	return Node{
		Type: "sidecar", IP: "10.1.2.3", PodName: "cart-7d9f", Namespace: "shop", DomainSuffix: "cluster.local",
		ServiceAccount: "cart", ClusterID: "Kubernetes", IstioVersion: "1.32.0",
		Labels: map[string]string{"app": "cart", "version": "v1"},
	}
}

func proxyConfig(t *testing.T, yaml string) *meshv1alpha1.ProxyConfig {
	t.Helper()
	pc, err := istio.ParseProxyConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return pc
}

// TestBootstrapGoldens: each case's bootstrap, checked by Build with the
// generated Validate, against testdata/<case>.golden.json (-update).
func TestBootstrapGoldens(t *testing.T) {
	gateway := cart()
	gateway.Type, gateway.PodName, gateway.Namespace, gateway.Labels = "router", "ingress-5c4d", "istio-system", map[string]string{"istio": "ingressgateway"}
	for name, o := range map[string]Options{
		"sidecar-delta": {Node: cart(), Delta: true},
		"sidecar-sotw":  {Node: cart()},
		"router":        {Node: gateway, Delta: true},
		"proxy-config": {Node: cart(), Delta: true, ProxyConfig: proxyConfig(t, `
concurrency: 4
drainDuration: 20s
extraStatTags: [request_id_class, tenant]
tracing: {zipkin: {address: "zipkin.istio-system:9411"}}
proxyStatsMatcher:
  inclusionPrefixes: ["http.{pod_ip}_"]
  inclusionSuffixes: [upstream_rq_timeout]
  inclusionRegexps: ['.*circuit_breakers.*']
runtimeValues:
  envoy.reloadable_features.http_reject_path_with_fragment: "true"
  re2.max_program_size.error_level: ""
  overload.global_downstream_max_connections: "50000"
envoyMetricsService:
  address: metrics-sink.telemetry:9000
  tlsSettings: {mode: ISTIO_MUTUAL, subjectAltNames: ["spiffe://cluster.local/ns/telemetry/sa/sink"]}
  tcpKeepalive: {probes: 3, time: 600s, interval: 75s}
envoyAccessLogService:
  address: als.telemetry:9001
`)},
	} {
		t.Run(name, func(t *testing.T) {
			b, problems, err := Build(o)
			if err != nil {
				t.Fatal(err)
			}
			if len(problems) > 0 {
				t.Fatalf("problems: %v", problems)
			}
			golden.Check(t, filepath.Join("testdata", name+".golden.json"), golden.Indent(t, golden.Raw(t, []*bootstrapv3.Bootstrap{b})[0]), *update)
		})
	}
}

func TestTheAdminAddressIsWhereStatsAreRead(t *testing.T) {
	b, _, err := Build(Options{Node: cart(), Admin: "127.0.0.1:19000"})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.GetAdmin().GetAddress().GetSocketAddress().GetPortValue(); got != 19000 {
		t.Errorf("admin port %d", got)
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == statsClustr {
			if got := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); got != 19000 {
				t.Errorf("the stats cluster reads port %d", got)
			}
		}
	}
}

func TestTheNodeIsWhatDiscoveryReads(t *testing.T) {
	b, _, err := Build(Options{Node: cart()})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.GetNode().GetId(); got != "sidecar~10.1.2.3~cart-7d9f.shop~shop.svc.cluster.local" {
		t.Errorf("node id %s", got)
	}
	if got := b.GetNode().GetCluster(); got != "cart.shop" {
		t.Errorf("node cluster %s, want the app's canonical service", got)
	}
	md := b.GetNode().GetMetadata().AsMap()
	raw, _ := json.Marshal(md)
	for k, want := range map[string]any{"NAMESPACE": "shop", "SERVICE_ACCOUNT": "cart", "CLUSTER_ID": "Kubernetes", "INSTANCE_IPS": "10.1.2.3", "NAME": "cart-7d9f"} {
		if md[k] != want {
			t.Errorf("metadata %s = %v, want %v (all: %s)", k, md[k], want, raw)
		}
	}
	if labels, _ := md["LABELS"].(map[string]any); labels["version"] != "v1" {
		t.Errorf("metadata LABELS = %v", md["LABELS"])
	}
}

func TestTheEnvironmentsIstioMetaVariablesAreNodeMetadataButNotTheAgentsOwn(t *testing.T) {
	n := cart()
	n.Metadata = MetadataFromEnv(
		map[string]string{"ISTIO_META_AUTO_REGISTER_GROUP": "from-proxy-config", "ISTIO_META_NETWORK": "net-1", "OTHER": "x"},
		[]string{"ISTIO_META_AUTO_REGISTER_GROUP=vm-group", "ISTIO_META_NAME=spoofed", "ISTIO_META_DNS_CAPTURE=true", "ISTIO_META_=empty", "ISTIO_METAJSON_LABELS={}", "PATH=/bin", "ISTIO_META_BROKEN"},
	)
	b, _, err := Build(Options{Node: n})
	if err != nil {
		t.Fatal(err)
	}
	md := b.GetNode().GetMetadata().AsMap()
	raw, _ := json.Marshal(md)
	for k, want := range map[string]any{
		"AUTO_REGISTER_GROUP": "vm-group", // the environment over proxyMetadata, as Istio's
		"NETWORK":             "net-1",
		"NAME":                "cart-7d9f", // the agent's own keys are not overridden
	} {
		if md[k] != want {
			t.Errorf("metadata %s = %v, want %v (all: %s)", k, md[k], want, raw)
		}
	}
	for _, k := range []string{"DNS_CAPTURE", "OTHER", "", "METAJSON_LABELS", "BROKEN", "PATH"} {
		if v, ok := md[k]; ok {
			t.Errorf("metadata %s = %v: not the agent's to send (all: %s)", k, v, raw)
		}
	}
	// DNS_CAPTURE says what the agent does.
	n.DNSCapture = true
	b, _, err = Build(Options{Node: n})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.GetNode().GetMetadata().AsMap()["DNS_CAPTURE"]; got != "true" {
		t.Errorf("DNS_CAPTURE with the DNS proxy running: %v", got)
	}
}

func TestABadNodeOrProxyConfigIsRefusedWithTheReason(t *testing.T) {
	for want, o := range map[string]Options{
		"INSTANCE_IP":         {Node: func() Node { n := cart(); n.IP = ""; return n }()},
		"POD_NAMESPACE":       {Node: func() Node { n := cart(); n.Namespace = ""; return n }()},
		"proxy type":          {Node: func() Node { n := cart(); n.Type = "waypoint"; return n }()},
		"envoy admin address": {Node: cart(), Admin: "no-port"},
		"zipkin":              {Node: cart(), ProxyConfig: &meshv1alpha1.ProxyConfig{Tracing: &meshv1alpha1.Tracing{Tracer: &meshv1alpha1.Tracing_Zipkin_{Zipkin: &meshv1alpha1.Tracing_Zipkin{Address: "no-port"}}}}},
	} {
		if _, _, err := Build(o); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
	_, problems, err := Build(Options{Node: cart(), ProxyConfig: &meshv1alpha1.ProxyConfig{Tracing: &meshv1alpha1.Tracing{Tracer: &meshv1alpha1.Tracing_Datadog_{Datadog: &meshv1alpha1.Tracing_Datadog{Address: "dd:8126"}}}}})
	if err != nil || len(problems) != 1 {
		t.Fatalf("an unsupported tracer: %v, %v; want it reported and the bootstrap written", problems, err)
	}
}

func TestEnvoyArgsFollowTheProxyConfig(t *testing.T) {
	for _, tc := range []struct {
		yaml        string
		concurrency string // "" for no flag
		drain       string
		flush       string
		flushKB     string // "" for no flag
	}{
		{"", "2", "45", "1000", ""},
		{"concurrency: 0", "", "45", "1000", ""},
		{"concurrency: 8\ndrainDuration: 5s", "8", "5", "1000", ""},
		{"fileFlushInterval: 250ms\nfileFlushMinSizeKb: 64", "2", "45", "250", "64"},
	} {
		args := EnvoyArgs(proxyConfig(t, tc.yaml), "/etc/istio/proxy/envoy-rev.json", "")
		flagValue := func(f string) string {
			if i := slices.Index(args, f); i >= 0 && i+1 < len(args) {
				return args[i+1]
			}
			return ""
		}
		if flagValue("--concurrency") != tc.concurrency || flagValue("--drain-time-s") != tc.drain ||
			flagValue("--file-flush-interval-msec") != tc.flush || flagValue("--file-flush-min-size-kb") != tc.flushKB || flagValue("-c") != "/etc/istio/proxy/envoy-rev.json" || flagValue("--log-level") != "warning" {
			t.Errorf("%q: %v", tc.yaml, args)
		}
	}
}

func TestProxyConfigFieldsWithoutEffectAreReportedByName(t *testing.T) {
	_, problems, err := Build(Options{Node: cart(), ProxyConfig: proxyConfig(t, `
concurrency: 2
statNameLength: 189
caCertificatesPem: ["-----BEGIN CERTIFICATE-----"]
privateKeyProvider: {cryptomb: {pollDelay: 10ms}}
interceptionMode: TPROXY
readinessProbe: {httpGet: {path: /ready, port: 8080}}
`)})
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(problems, "\n")
	for _, want := range []string{"caCertificatesPem has no effect", "privateKeyProvider has no effect", "readinessProbe has no effect", "interceptionMode TPROXY"} {
		if !strings.Contains(joined, want) {
			t.Errorf("problems do not say %q:\n%s", want, joined)
		}
	}
	for _, honoured := range []string{"concurrency", "statNameLength"} {
		if strings.Contains(joined, honoured) {
			t.Errorf("%s is reported though it is honoured:\n%s", honoured, joined)
		}
	}
	if len(problems) != 4 {
		t.Errorf("want 4 problems, got %d:\n%s", len(problems), joined)
	}
}

func TestARemoteServiceThatCannotBeWrittenIsReportedAndLeftOut(t *testing.T) {
	for name, yaml := range map[string]string{
		"SIMPLE":    "envoyMetricsService: {address: sink:9000, tlsSettings: {mode: SIMPLE, caCertificates: /etc/certs/ca.pem}}",
		"host:port": "envoyAccessLogService: {address: no-port}",
	} {
		b, problems, err := Build(Options{Node: cart(), ProxyConfig: proxyConfig(t, yaml)})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(problems) != 1 || !strings.Contains(problems[0], name) || !strings.Contains(problems[0], "left out") {
			t.Errorf("%s: problems %v", name, problems)
		}
		for _, c := range b.GetStaticResources().GetClusters() {
			if c.GetName() == MetricsServiceCluster || c.GetName() == AccessLogServiceCluster {
				t.Errorf("%s: cluster %s written", name, c.GetName())
			}
		}
		if len(b.GetStatsSinks()) != 0 {
			t.Errorf("%s: a stats sink to a service left out", name)
		}
	}
}

func TestTheReadinessListenerReadsTheAgentsStatusPort(t *testing.T) {
	b, _, err := Build(Options{Node: cart(), StatusPort: 16020})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		if c.GetName() == agentClustr {
			if got := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); got != 16020 {
				t.Errorf("the agent cluster reads port %d", got)
			}
			return
		}
	}
	t.Fatal("no agent cluster")
}

func TestThePodsStatsAnnotationsShapeEnvoysStatsAsInIstio(t *testing.T) {
	pc := proxyConfig(t, `
extraStatTags: [tenant]
proxyStatsMatcher: {inclusionPrefixes: [from-config], inclusionSuffixes: [kept_suffix]}
statsCompression: false
`)
	b, problems, err := Build(Options{Node: cart(), ProxyConfig: pc, Annotations: map[string]string{
		"sidecar.istio.io/statsInclusionPrefixes": "cluster.outbound,http.{pod_ip}_",
		"sidecar.istio.io/extraStatTags":          "tenant,region",
		"sidecar.istio.io/statsFlushInterval":     "10s",
		"sidecar.istio.io/statsEvictionInterval":  "60s",
		"sidecar.istio.io/statsHistogramBuckets":  `{"http.inbound": [1, 5, 10], "cluster.outbound": [0.5]}`,
	}})
	if err != nil || len(problems) > 0 {
		t.Fatalf("%v %v", err, problems)
	}
	var prefixes, suffixes []string
	for _, p := range b.GetStatsConfig().GetStatsMatcher().GetInclusionList().GetPatterns() {
		if p.GetPrefix() != "" {
			prefixes = append(prefixes, p.GetPrefix())
		}
		if p.GetSuffix() != "" {
			suffixes = append(suffixes, p.GetSuffix())
		}
	}
	// The annotation's prefixes replace the proxy config's; its suffixes,
	// with no annotation, stay.
	if !slices.Contains(prefixes, "http.10.1.2.3_") || !slices.Contains(prefixes, "cluster.outbound") || slices.Contains(prefixes, "from-config") {
		t.Errorf("prefixes %v", prefixes)
	}
	if !slices.Contains(suffixes, "kept_suffix") {
		t.Errorf("suffixes %v", suffixes)
	}
	var tags []string
	for _, tag := range b.GetStatsConfig().GetStatsTags() {
		tags = append(tags, tag.GetTagName())
	}
	if !slices.Equal(tags, []string{"tenant", "region"}) {
		t.Errorf("tags %v, want tenant once and region", tags)
	}
	if b.GetStatsFlushInterval().AsDuration() != 10*time.Second || b.GetStatsEvictionInterval().AsDuration() != time.Minute {
		t.Errorf("flush %v, eviction %v", b.GetStatsFlushInterval(), b.GetStatsEvictionInterval())
	}
	hb := b.GetStatsConfig().GetHistogramBucketSettings()
	if len(hb) != 2 || hb[0].GetMatch().GetPrefix() != "cluster.outbound" || !slices.Equal(hb[1].GetBuckets(), []float64{1, 5, 10}) {
		t.Errorf("histogram buckets %v", hb)
	}
	for _, l := range b.GetStaticResources().GetListeners() {
		if l.GetName() == "prometheus" && strings.Contains(l.String(), "compressor") {
			t.Errorf("statsCompression false, and the Prometheus listener compresses")
		}
	}
}

func TestStatsAnnotationsThatDoNotParseAreReportedAndLeftOut(t *testing.T) {
	b, problems, err := Build(Options{Node: cart(), Annotations: map[string]string{
		"sidecar.istio.io/statsFlushInterval":    "10m",
		"sidecar.istio.io/statsEvictionInterval": "7s",
		"sidecar.istio.io/statsHistogramBuckets": `[1, 2]`,
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 3 {
		t.Fatalf("problems %v; want one per annotation", problems)
	}
	if b.GetStatsFlushInterval() != nil || b.GetStatsEvictionInterval() != nil || len(b.GetStatsConfig().GetHistogramBucketSettings()) != 0 {
		t.Errorf("a bad annotation was written: %v %v %v", b.GetStatsFlushInterval(), b.GetStatsEvictionInterval(), b.GetStatsConfig().GetHistogramBucketSettings())
	}
}
