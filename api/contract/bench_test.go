package contract_test

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
)

// endpointSet builds a set of n endpoints shaped like real pods.
func endpointSet(n int) *registryv1.EndpointSet {
	es := &registryv1.EndpointSet{ServiceHostname: "reviews.bookinfo.svc.cluster.local", ServiceNamespace: "bookinfo", Shard: "reviews-abcde"}
	for i := range n {
		ep := fullEndpointSet().GetEndpoints()[0]
		ep.Address = fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		ep.WorkloadName = fmt.Sprintf("reviews-v2-7d9f-%05d", i)
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}

// BenchmarkEncodeOnEndpointChange measures what galley encodes (and hashes,
// and sends) when one endpoint of a 5,000-endpoint service changes: the one
// 100-endpoint shard holding it, against the whole list it would be without
// sharding.
func BenchmarkEncodeOnEndpointChange(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
	}{{"shard-of-100", 100}, {"whole-service-of-5000", 5000}} {
		es := endpointSet(c.n)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var size int
			for b.Loop() {
				out, err := proto.MarshalOptions{Deterministic: true}.Marshal(es)
				if err != nil {
					b.Fatal(err)
				}
				size = len(out)
			}
			b.ReportMetric(float64(size), "bytes/update")
		})
	}
}
