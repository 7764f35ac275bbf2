package app

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

func TestThePodsLabelsComeFromTheInjectedEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want map[string]string
	}{
		{"", nil},
		{`{"app":"cart","version":"v1"}`, map[string]string{"app": "cart", "version": "v1"}},
		{"null", nil},
		{`{"app": 3}`, nil}, // not strings: refused, logged, no labels
		{"not json", nil},
	} {
		t.Setenv("ISTIO_METAJSON_LABELS", tc.env)
		got := labelsFromEnv(slog.New(slog.DiscardHandler))
		if len(got) != len(tc.want) || got["app"] != tc.want["app"] || got["version"] != tc.want["version"] {
			t.Errorf("%q: %v, want %v", tc.env, got, tc.want)
		}
	}
}

func TestEnvoysLogLevelFollowsTheAgents(t *testing.T) {
	for agent, envoy := range map[string]string{"debug": "debug", "info": "info", "warn": "warning", "error": "error", "": "warning"} {
		if got := envoyLogLevel(agent); got != envoy {
			t.Errorf("%q: %q, want %q", agent, got, envoy)
		}
	}
}

func TestWithoutInstanceIPThePodsIPIsItsFirstPrivateAddressIPv4First(t *testing.T) {
	nets := func(cidrs ...string) []net.Addr {
		var out []net.Addr
		for _, c := range cidrs {
			ip, n, err := net.ParseCIDR(c)
			if err != nil {
				t.Fatal(err)
			}
			n.IP = ip
			out = append(out, n)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		addrs []net.Addr
		want  string
	}{
		{"a compose container", nets("127.0.0.1/8", "::1/128", "172.18.0.5/16"), "172.18.0.5"},
		{"IPv4 before IPv6 whatever the order", nets("fd00::5/64", "10.1.2.3/24"), "10.1.2.3"},
		{"an IPv6-only pod", nets("::1/128", "fe80::1/64", "fd00::5/64"), "fd00::5"},
		{"link-local is not the pod's address", nets("169.254.1.1/16", "fe80::1/64"), ""},
		{"only loopback", nets("127.0.0.1/8"), ""},
		{"not an IPNet", []net.Addr{&net.UnixAddr{Name: "x", Net: "unix"}}, ""},
	} {
		if got := privateIP(tc.addrs); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestTheProxyConfigsPortsAreTheAgentsDefaults(t *testing.T) {
	t.Setenv("PROXY_CONFIG", `{"statusPort": 16020, "proxyAdminPort": 16000}`)
	c := proxyDefaults()
	if c.AdminAddress != ":16020" || c.statusPort() != 16020 || c.EnvoyAdmin != "127.0.0.1:16000" {
		t.Errorf("status %q (%d), Envoy admin %q; want the proxy config's ports", c.AdminAddress, c.statusPort(), c.EnvoyAdmin)
	}
	t.Setenv("PROXY_CONFIG", `{"concurrency": 2}`)
	if c := proxyDefaults(); c.AdminAddress != ":15020" || c.EnvoyAdmin != "127.0.0.1:15000" {
		t.Errorf("without ports: status %q, Envoy admin %q; want Istio's", c.AdminAddress, c.EnvoyAdmin)
	}
}

func TestTheApplicationsMetricsURLFollowsItsScrapeSettings(t *testing.T) {
	for settings, want := range map[string]string{
		"":                                 "",
		`{"scrape":"false","port":"8080"}`: "",
		`{"scrape":"true"}`:                "http://localhost:80/metrics",
		`{"port":"9102","path":"prom"}`:    "http://localhost:9102/prom",
	} {
		got, err := appMetricsURL(settings, 15020)
		if err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", settings, got, err, want)
		}
	}
	for settings, want := range map[string]string{
		`{"port":"15020"}`: "would scrape itself",
		`{"port":"http"}`:  "is not a port",
		`{"port":`:         proxycontract.PrometheusScrapeEnv,
	} {
		if _, err := appMetricsURL(settings, 15020); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", settings, err, want)
		}
	}
}

func TestStatsMergeEnvoysTheAgentsAndTheApplicationsMetricsInThatOrder(t *testing.T) {
	serve := func(body string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) }))
		t.Cleanup(s.Close)
		return s
	}
	envoy := serve("envoy_metric 1\n")
	app := serve("app_metric 3\n")
	agent := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "agent_metric 2\n") })
	rec := httptest.NewRecorder()
	mergedStats(strings.TrimPrefix(envoy.URL, "http://"), agent, app.URL+"/metrics").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/stats/prometheus", nil))
	if got := rec.Body.String(); got != "envoy_metric 1\nagent_metric 2\napp_metric 3\n" {
		t.Errorf("merged:\n%s", got)
	}
	// The application down: the rest is still served.
	app.Close()
	rec = httptest.NewRecorder()
	mergedStats(strings.TrimPrefix(envoy.URL, "http://"), agent, app.URL+"/metrics").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/stats/prometheus", nil))
	if got := rec.Body.String(); got != "envoy_metric 1\nagent_metric 2\n" {
		t.Errorf("with the application down:\n%s", got)
	}
}

func TestOnAVMTheProxyConfigIsTheMeshFilesDefaultConfigUnlessOneIsGiven(t *testing.T) {
	dir := t.TempDir()
	mesh := filepath.Join(dir, "mesh")
	if err := os.WriteFile(mesh, []byte(`defaultConfig:
  discoveryAddress: flotilla-discovery.istio-system.svc:15012
  proxyMetadata: {ISTIO_META_AUTO_REGISTER_GROUP: legacy}
  readinessProbe: {periodSeconds: 5, tcpSocket: {port: 8080}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	pc, err := Config{MeshConfigFile: mesh}.proxyConfig()
	if err != nil || pc.GetReadinessProbe().GetTcpSocket().GetPort() != 8080 || pc.GetProxyMetadata()["ISTIO_META_AUTO_REGISTER_GROUP"] != "legacy" {
		t.Fatalf("from the mesh file: %v, %v", pc, err)
	}
	if pc, err := (Config{MeshConfigFile: mesh, ProxyConfig: `{"concurrency": 2}`}).proxyConfig(); err != nil || pc.GetReadinessProbe() != nil || pc.GetConcurrency().GetValue() != 2 {
		t.Errorf("a proxy config given wins: %v, %v", pc, err)
	}
	if pc, err := (Config{MeshConfigFile: filepath.Join(dir, "absent")}).proxyConfig(); err != nil || pc != nil {
		t.Errorf("a missing mesh file is none: %v, %v", pc, err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("defaultConfig: {readinessProbe: {periodSeconds: 5}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := proxyDefaults()
	c.PodName, c.PodNamespace, c.ServiceAccount, c.DiscoveryAddress, c.CA.Address, c.MeshConfigFile = "vm", "vm", "legacy", "d:15012", "c:15013", bad
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "readinessProbe has no method") {
		t.Errorf("a probe without a method: %v", err)
	}
	if err := os.WriteFile(bad, []byte("defaultConfig: {notAField: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "meshConfigFile") {
		t.Errorf("a mesh file that does not parse: %v", err)
	}
}

func TestOnAVMThePodIsNamedAfterTheHostAndAddressedByISTIO_SVC_IP(t *testing.T) {
	t.Setenv("POD_NAME", "")
	t.Setenv("INSTANCE_IP", "")
	t.Setenv("ISTIO_SVC_IP", "10.9.0.5")
	c := proxyDefaults()
	if h, _ := os.Hostname(); c.PodName != h || c.InstanceIP != "10.9.0.5" {
		t.Errorf("pod %q at %q; want the host's name %q at ISTIO_SVC_IP", c.PodName, c.InstanceIP, h)
	}
}
