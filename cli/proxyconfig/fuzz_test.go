package proxyconfig

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// FuzzEnvoyOutput feeds any bytes to the readers of what a proxy's Envoy
// answers (its config dump, its /clusters, its loggers): they never
// panic, and whatever they read prints.
func FuzzEnvoyOutput(f *testing.F) {
	for _, s := range []string{"testdata/envoy-config-dump.json", "testdata/envoy-clusters.json"} {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump", "static_clusters": [{"cluster": {"@type": "type.googleapis.com/nope"}}]}]}`))
	f.Add([]byte("active loggers:\n  http: debug\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if d, _ := ParseEnvoyDump(data); d != nil {
			if err := Print(io.Discard, d, append(kinds, "endpoint"), Filters{}, "short", time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		if hosts, err := ParseEnvoyClusters(data); err == nil {
			if err := Print(io.Discard, &Dump{HostStatuses: hosts}, []string{"endpoint"}, Filters{}, "json", time.Now()); err != nil {
				t.Fatal(err)
			}
		}
		_, _ = LogChanges(string(data), false, string(data))
	})
}

func TestMalformedEnvoyOutputIsAnErrorThatSaysWhat(t *testing.T) {
	for name, tc := range map[string]struct{ body, says string }{
		"not JSON":               {"<html>502</html>", "Envoy's config dump"},
		"configs not a list":     {`{"configs": {"a": 1}}`, "Envoy's config dump"},
		"a section without type": {`{"configs": [{"static_clusters": []}]}`, "without its @type"},
		"a list that is not one": {`{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump", "static_clusters": {"x": 1}}]}`, "static_clusters"},
		"a cluster of bad shape": {`{"configs": [{"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump", "dynamic_active_clusters": [{"cluster": {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "connect_timeout": "forever"}}]}]}`, "dynamic_active_clusters"},
	} {
		_, err := ParseEnvoyDump([]byte(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.says)
		}
	}
	if _, err := ParseEnvoyClusters([]byte(`{"cluster_statuses": [{"host_statuses": "many"}]}`)); err == nil {
		t.Error("malformed /clusters read without an error")
	}
}
