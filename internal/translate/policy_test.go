package translate

import (
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
)

// TestEffectivePolicyFollowsIstiosMergeRules: Istio's
// MergeSubsetTrafficPolicy — a port-level entry replaces the level above
// whole (what it leaves out takes its default), a subset's top level
// overrides field by field.
func TestEffectivePolicyFollowsIstiosMergeRules(t *testing.T) {
	simple := func(s networking.LoadBalancerSettings_SimpleLB) *networking.LoadBalancerSettings {
		return &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: s}}
	}
	pool := func(max int32) *networking.ConnectionPoolSettings {
		return &networking.ConnectionPoolSettings{Tcp: &networking.ConnectionPoolSettings_TCPSettings{MaxConnections: max}}
	}
	outlier := func(errs uint32) *networking.OutlierDetection {
		return &networking.OutlierDetection{Consecutive_5XxErrors: wrapperspb.UInt32(errs)}
	}
	tls := func(m networking.ClientTLSSettings_TLSmode) *networking.ClientTLSSettings {
		return &networking.ClientTLSSettings{Mode: m}
	}
	port := func(n uint32, lb *networking.LoadBalancerSettings, tl *networking.ClientTLSSettings) *networking.TrafficPolicy_PortTrafficPolicy {
		return &networking.TrafficPolicy_PortTrafficPolicy{Port: &networking.PortSelector{Number: n}, LoadBalancer: lb, Tls: tl}
	}
	dr := &networking.DestinationRule{
		Host: "reviews",
		TrafficPolicy: &networking.TrafficPolicy{
			LoadBalancer: simple(networking.LoadBalancerSettings_RANDOM), ConnectionPool: pool(10), OutlierDetection: outlier(5),
			Tls:               tls(networking.ClientTLSSettings_ISTIO_MUTUAL),
			PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{port(9080, simple(networking.LoadBalancerSettings_LEAST_REQUEST), nil)},
		},
		Subsets: []*networking.Subset{
			{Name: "v1", Labels: map[string]string{"version": "v1"}},
			{Name: "v2", Labels: map[string]string{"version": "v2"}, TrafficPolicy: &networking.TrafficPolicy{
				ConnectionPool:    pool(20),
				PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{port(9080, nil, tls(networking.ClientTLSSettings_DISABLE))},
			}},
		},
	}
	for _, tc := range []struct {
		name   string
		dr     *networking.DestinationRule
		subset string
		port   uint32
		want   ClusterPolicy
	}{
		{name: "no DestinationRule: nothing set", dr: nil, port: 9080},
		{
			name: "the top level, on a port without settings", dr: dr, port: 80,
			want: ClusterPolicy{LoadBalancer: simple(networking.LoadBalancerSettings_RANDOM), ConnectionPool: pool(10), OutlierDetection: outlier(5), TLS: tls(networking.ClientTLSSettings_ISTIO_MUTUAL)},
		},
		{
			// No TLS inherited from the top level: the port level left it out.
			name: "port-level settings replace the top level whole", dr: dr, port: 9080,
			want: ClusterPolicy{LoadBalancer: simple(networking.LoadBalancerSettings_LEAST_REQUEST)},
		},
		{
			name: "a subset without a policy is the service's", dr: dr, subset: "v1", port: 9080,
			want: ClusterPolicy{LoadBalancer: simple(networking.LoadBalancerSettings_LEAST_REQUEST)},
		},
		{
			// The subset's own top-level pool is not used either: its
			// port-level entry stands for the subset on this port.
			name: "a subset's port-level settings replace every field", dr: dr, subset: "v2", port: 9080,
			want: ClusterPolicy{TLS: tls(networking.ClientTLSSettings_DISABLE)},
		},
		{
			name: "a subset's top level overrides what it sets", dr: dr, subset: "v2", port: 80,
			want: ClusterPolicy{LoadBalancer: simple(networking.LoadBalancerSettings_RANDOM), ConnectionPool: pool(20), OutlierDetection: outlier(5), TLS: tls(networking.ClientTLSSettings_ISTIO_MUTUAL)},
		},
		{
			name: "an unknown subset is the service's", dr: dr, subset: "v9", port: 80,
			want: ClusterPolicy{LoadBalancer: simple(networking.LoadBalancerSettings_RANDOM), ConnectionPool: pool(10), OutlierDetection: outlier(5), TLS: tls(networking.ClientTLSSettings_ISTIO_MUTUAL)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := EffectivePolicy(tc.dr, tc.subset, tc.port)
			for _, f := range []struct {
				field     string
				got, want proto.Message
			}{
				{"loadBalancer", got.LoadBalancer, tc.want.LoadBalancer},
				{"connectionPool", got.ConnectionPool, tc.want.ConnectionPool},
				{"outlierDetection", got.OutlierDetection, tc.want.OutlierDetection},
				{"tls", got.TLS, tc.want.TLS},
			} {
				if !proto.Equal(f.got, f.want) {
					t.Errorf("%s = %s, want %s", f.field, prototext.Format(f.got), prototext.Format(f.want))
				}
			}
		})
	}
}
