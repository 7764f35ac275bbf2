package debugapi_test

import (
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
)

func TestAProxysSyncStateSurvivesItsClientConfigEncoding(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 123, time.UTC)
	for name, p := range map[string]debugapi.ProxySync{
		"a bare proxy": {ID: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", Namespace: "ns", Types: []debugapi.TypeSync{{TypeURL: "t", Status: debugapi.NotSent}}},
		"every field": {
			ID: "router~10.0.0.2~gw.edge~edge.svc.cluster.local", Namespace: "edge", ProxyType: "router", IstioVersion: "1.27.0",
			ClusterID: "Kubernetes", Identity: "spiffe://cluster.local/ns/edge/sa/gw", Generator: "grpc", Delta: true,
			ConnectedAt: at, PushSeenAt: at.Add(-time.Second), PushVersion: "42", Problems: []string{"a dropped", "b degraded"},
			Types: []debugapi.TypeSync{
				{TypeURL: "c", Status: debugapi.Synced, AckedVersion: "v1", SentVersion: "v1", Resources: 3, SentAt: at, AckedAt: at.Add(time.Second)},
				{TypeURL: "l", Status: debugapi.Stale, AckedVersion: "v1", SentVersion: "v2", Resources: 1, SentAt: at},
				{TypeURL: "r", Status: debugapi.Nacked, AckedVersion: "v1", SentVersion: "v3", SentAt: at, Nack: "no", NackRepeats: 7},
			},
		},
	} {
		if diff := cmp.Diff(p, debugapi.FromClientConfig(p.ClientConfig())); diff != "" {
			t.Errorf("%s (-sent +read):\n%s", name, diff)
		}
	}
}

func TestAnIstiodClientConfigReadsWithFlotillasFieldsEmpty(t *testing.T) {
	cc := &statusv3.ClientConfig{
		Node: &corev3.Node{Id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local"},
		GenericXdsConfigs: []*statusv3.ClientConfig_GenericXdsConfig{
			{TypeUrl: "c", ConfigStatus: statusv3.ConfigStatus_SYNCED, VersionInfo: "v"},
			{TypeUrl: "x", ConfigStatus: statusv3.ConfigStatus_UNKNOWN},
		},
	}
	got := debugapi.FromClientConfig(cc)
	if got.ID != cc.GetNode().GetId() || got.Types[0].Status != debugapi.Synced || got.Types[0].AckedVersion != "v" || got.Types[1].Status != "UNKNOWN" {
		t.Fatalf("%+v", got)
	}
}

func TestAReplicaIsNamedAsIstiodNamesItself(t *testing.T) {
	r := debugapi.NewReplica("flotilla-discovery", "discovery-7f9", "1.0.0")
	if got := r.ControlPlane().GetIdentifier(); got != `{"Component":"flotilla-discovery","ID":"discovery-7f9","Info":{"version":"1.0.0"}}` {
		t.Fatalf("identifier %s", got)
	}
	if got := debugapi.ReplicaOf(r.ControlPlane()); got != r {
		t.Fatalf("read back %+v", got)
	}
	if got := debugapi.ReplicaOf(&corev3.ControlPlane{Identifier: "not json"}); got.ID != "not json" {
		t.Fatalf("a plain identifier: %+v", got)
	}
}
