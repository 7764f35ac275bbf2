package istiod

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kiali"
)

// Kiali reads a replica's sync state as istiod's: each proxy as
// pod.namespace in its cluster, and each type judged as the replica
// judged it.
func TestKialiReadsTheSyncStateAsIstiodsAndJudgesItAsTheReplicaDoes(t *testing.T) {
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	proxies := []debugapi.ProxySync{{
		ID: "sidecar~10.0.0.8~app-1.default~default.svc.cluster.local", ProxyType: "sidecar", IstioVersion: "1.32.0", ClusterID: "Kubernetes",
		Types: []debugapi.TypeSync{
			{TypeURL: resourcev3.ClusterType, Status: debugapi.Synced, SentVersion: "7", AckedVersion: "7", SentAt: at},
			{TypeURL: resourcev3.ListenerType, Status: debugapi.Synced, AckedVersion: "5"}, // resumed: nothing sent
			{TypeURL: resourcev3.RouteType, Status: debugapi.Stale, SentVersion: "9", AckedVersion: "8"},
			{TypeURL: resourcev3.EndpointType, Status: debugapi.NotSent},
			{TypeURL: resourcev3.ExtensionConfigType, Status: debugapi.Nacked, SentVersion: "3", AckedVersion: "3", Nack: "bad wasm"},
		},
	}, {
		ID: "router~10.0.0.9~gw-1.istio-system~istio-system.svc.cluster.local", ProxyType: "router", ClusterID: "Kubernetes",
		Types: []debugapi.TypeSync{{TypeURL: resourcev3.ClusterType, Status: debugapi.Stale, SentVersion: "1"}},
	}}
	body, err := json.Marshal(Syncz(proxies))
	if err != nil {
		t.Fatal(err)
	}
	var got []*kiali.ProxyStatus
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("Kiali's decoding: %v\n%s", err, body)
	}
	if len(got) != 2 {
		t.Fatalf("%d proxies: %s", len(got), body)
	}
	app := got[0]
	// Kiali keeps a proxy whose name splits in two on "." (cache/proxy_status.go).
	if parts := strings.Split(app.ProxyID, "."); len(parts) != 2 || parts[0] != "app-1" || parts[1] != "default" || app.ClusterID != "Kubernetes" || app.IstioVersion != "1.32.0" {
		t.Fatalf("the proxy as Kiali names it: %+v", app)
	}
	for what, c := range map[string][3]string{
		"CDS": {app.ClusterSent, app.ClusterAcked, "Synced"},
		"LDS": {app.ListenerSent, app.ListenerAcked, "Synced"},
		"RDS": {app.RouteSent, app.RouteAcked, "Stale"},
		"EDS": {app.EndpointSent, app.EndpointAcked, "NOT_SENT"},
		"gw":  {got[1].ClusterSent, got[1].ClusterAcked, "Stale (Never Acknowledged)"},
	} {
		if s := kiali.XDSStatus(c[0], c[1]); s != c[2] {
			t.Errorf("%s: sent %q acked %q: Kiali says %s, want %s", what, c[0], c[1], s, c[2])
		}
	}
	// Istio's own fields beside: ECDS, and every type with its time and
	// error.
	var full []SyncStatus
	if err := json.Unmarshal(body, &full); err != nil {
		t.Fatal(err)
	}
	if e := full[0].Resources[resourcev3.ExtensionConfigType]; e.LastError != "bad wasm" || kiali.XDSStatus(full[0].ExtensionConfigSent, full[0].ExtensionConfigAcked) == "Synced" {
		t.Errorf("a NACKED type: %+v", full[0])
	}
	if !full[0].Resources[resourcev3.ClusterType].SentTime.Equal(at) || full[0].ProxyType != "sidecar" {
		t.Errorf("resources: %+v", full[0].Resources)
	}
}

// Kiali (up to 2.22) reads a replica's registry as istiod's: each
// service's host, name, namespace, labels, selector, visibility, ports
// by Istio's protocol names, and its addresses in its cluster.
func TestKialiReadsTheRegistryAsIstiods(t *testing.T) {
	services := []*registryv1.Service{
		{
			Hostname: "reviews.bookinfo.svc.cluster.local", Name: "reviews", Namespace: "bookinfo", Addresses: []string{"10.96.0.7"},
			Labels: map[string]string{"app": "reviews"}, Selector: map[string]string{"app": "reviews"}, ExportTo: []string{"*"},
			SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE,
			Ports:      []*registryv1.ServicePort{{Name: "http", Number: 9080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}, {Name: "db", Number: 27017, Protocol: registryv1.Protocol_PROTOCOL_MONGO}},
		},
		{
			Hostname: "api.example.com", Name: "api.example.com", Namespace: "shop", Location: registryv1.Location_LOCATION_MESH_EXTERNAL,
			SourceKind: registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY, ExportTo: []string{"."},
			Ports:                  []*registryv1.ServicePort{{Name: "tls", Number: 443, Protocol: registryv1.Protocol_PROTOCOL_TLS}},
			AutoAllocatedAddresses: []string{"240.240.0.1", "2001:2::1"},
		},
	}
	body, err := json.Marshal(Registryz(services, "Kubernetes"))
	if err != nil {
		t.Fatal(err)
	}
	var got []*kiali.RegistryService
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("Kiali's decoding: %v\n%s", err, body)
	}
	if len(got) != 2 {
		t.Fatalf("%s", body)
	}
	r, se := got[0], got[1]
	a := r.Attributes
	if r.Hostname != "reviews.bookinfo.svc.cluster.local" || a.ServiceRegistry != "Kubernetes" || a.Name != "reviews" || a.Namespace != "bookinfo" ||
		a.Labels["app"] != "reviews" || a.LabelSelectors["app"] != "reviews" || len(a.ExportTo) != 1 || len(r.Ports) != 2 ||
		r.Ports[0].Port != 9080 || r.Ports[0].Protocol != "HTTP" || r.Ports[1].Protocol != "Mongo" {
		t.Errorf("the Kubernetes service: %+v", r)
	}
	if !kiali.KeptForCluster(r, "Kubernetes") || kiali.KeptForCluster(r, "east") || r.ClusterVIPs12.Addresses["Kubernetes"][0] != "10.96.0.7" {
		t.Errorf("its addresses: %+v", r.ClusterVIPs12)
	}
	if se.Attributes.ServiceRegistry != "External" || se.Ports[0].Protocol != "TLS" || !kiali.KeptForCluster(se, "east") {
		t.Errorf("the ServiceEntry: %+v", se)
	}
	// Istio's own fields for the addresses allocated to a ServiceEntry.
	var raw []map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if raw[1]["autoAllocatedIPv4Address"] != "240.240.0.1" || raw[1]["autoAllocatedIPv6Address"] != "2001:2::1" || raw[0]["autoAllocatedIPv4Address"] != nil {
		t.Errorf("allocated addresses: %v and %v", raw[0], raw[1])
	}
	if _, ok := se.Attributes.ExportTo["."]; !ok {
		t.Errorf("the ServiceEntry's visibility: %v", se.Attributes.ExportTo)
	}
}
