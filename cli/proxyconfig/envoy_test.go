package proxyconfig

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestEnvoysOwnConfigDumpShowsItsStaticAndActiveResourcesAndNamesWhatItCannotRead(t *testing.T) {
	body, err := os.ReadFile("testdata/envoy-config-dump.json")
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseEnvoyDump(body)
	// The cluster with an extension this CLI does not know is left out,
	// said so; the others are read.
	if err == nil || !strings.Contains(err.Error(), "acme.mesh.v1.ProtocolOptions") {
		t.Errorf("the unknown extension is not named: %v", err)
	}
	if d == nil {
		t.Fatal("nothing read")
	}
	var clusters, listeners []string
	for _, c := range d.Clusters {
		clusters = append(clusters, c.GetName())
	}
	for _, l := range d.Listeners {
		listeners = append(listeners, l.GetName())
	}
	// Static (the bootstrap's) and active, never warming.
	if want := []string{"xds-grpc", "outbound|9080||reviews.default.svc.cluster.local", "inbound|9080||"}; !slices.Equal(clusters, want) {
		t.Errorf("clusters %q, want %q", clusters, want)
	}
	if want := []string{"0.0.0.0_9080"}; !slices.Equal(listeners, want) {
		t.Errorf("listeners %q, want %q", listeners, want)
	}
	if len(d.Routes) != 1 || d.Routes[0].GetName() != "9080" || len(d.Endpoints) != 1 || len(d.Secrets) != 1 {
		t.Errorf("routes %d, endpoints %d, secrets %d", len(d.Routes), len(d.Endpoints), len(d.Secrets))
	}

	var out bytes.Buffer
	if err := Print(&out, d, []string{"cluster", "endpoint"}, Filters{}, "short", time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"xds-grpc                              -        -          -             STATIC ",
		"reviews.default.svc.cluster.local     9080     -          outbound      EDS ",
		"10.0.0.8:9080     DRAINING     -                 outbound|9080||reviews.default.svc.cluster.local",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
}

func TestEnvoysClustersShowEachHostsHealthAndOutlierCheckAsIstioctl(t *testing.T) {
	body, err := os.ReadFile("testdata/envoy-clusters.json")
	if err != nil {
		t.Fatal(err)
	}
	hosts, err := ParseEnvoyClusters(body)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Print(&out, &Dump{HostStatuses: hosts}, []string{"endpoint"}, Filters{}, "short", time.Now()); err != nil {
		t.Fatal(err)
	}
	want := `ENDPOINT                       STATUS      OUTLIER CHECK     CLUSTER
10.0.0.7:9080                  HEALTHY     OK                outbound|9080||reviews.default.svc.cluster.local
10.0.0.8:9080                  HEALTHY     FAILED            outbound|9080||reviews.default.svc.cluster.local
unix://./var/run/istio/XDS     HEALTHY     OK                xds-grpc
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	if err := Print(&out, &Dump{HostStatuses: hosts}, []string{"endpoint"}, Filters{Port: 9080, Address: "10.0.0.8"}, "short", time.Now()); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "10.0.0.8:9080") {
		t.Errorf("filtered to 10.0.0.8:9080:\n%s", out.String())
	}
	if _, err := ParseEnvoyClusters([]byte(`{"cluster_statuses": "no"}`)); err == nil {
		t.Error("a malformed answer is read")
	}
}

func TestLogLevelsAreChangedAsIstioctlChangesThem(t *testing.T) {
	known := "active loggers:\n  admin: warning\n  http: warning\n  router: warning\n"
	for _, tc := range []struct {
		levels string
		reset  bool
		want   []string
		err    string
	}{
		{levels: "", want: nil},
		{levels: "debug", want: []string{"level=debug"}},
		{levels: "warn", want: []string{"level=warning"}},
		{levels: "http:debug,router=trace,info", want: []string{"level=info", "http=debug", "router=trace"}},
		{levels: "envoy::http:debug", want: []string{"http=debug"}},
		{levels: "level:error", want: []string{"level=error"}},
		{reset: true, want: []string{"level=warning"}},
		{levels: "loud", err: "unrecognized logging level: loud"},
		{levels: "http:loud", err: "unrecognized logging level: loud"},
		{levels: "htt:debug", err: "unrecognized logger name: htt"},
		{levels: "debug", reset: true, err: "cannot be combined"},
	} {
		got, err := LogChanges(tc.levels, tc.reset, known)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q reset=%v: %v, want an error with %q", tc.levels, tc.reset, err, tc.err)
		case tc.err == "" && (err != nil || !slices.Equal(got, tc.want)):
			t.Errorf("%q reset=%v: %q %v, want %q", tc.levels, tc.reset, got, err, tc.want)
		}
	}
}
