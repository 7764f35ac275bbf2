package sds

import (
	"crypto/tls"
	"slices"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

// BenchmarkRenewalToSecretOnOpenStream: from a renewed certificate handed
// to the agent's state (as certclient's OnCertificate does) to Envoy's
// open SDS stream (state of the world, over the Unix socket) receiving
// the new default secret, ACKed before the next renewal. Reports p50 and
// p99.
func BenchmarkRenewalToSecretOnOpenStream(b *testing.B) {
	p := newPod(b)
	var certs [2]tls.Certificate
	for i := range certs {
		leaf, err := p.ca.Issue(testpki.Request{CommonName: "w", URIs: []string{"spiffe://cluster.local/ns/shop/sa/cart"}})
		if err != nil {
			b.Fatal(err)
		}
		if certs[i], err = leaf.TLSCertificate(); err != nil {
			b.Fatal(err)
		}
	}
	p.state.SetRoots(p.ca.CertPEM)
	if err := p.state.SetCertificate(&certs[0]); err != nil {
		b.Fatal(err)
	}
	stream, err := secretv3.NewSecretDiscoveryServiceClient(p.conn).StreamSecrets(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	req := &discoveryv3.DiscoveryRequest{Node: node(), TypeUrl: TypeURL, ResourceNames: []string{SecretWorkload, SecretRoot}}
	if err := stream.Send(req); err != nil {
		b.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		b.Fatal(err)
	}
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		if err := stream.Send(&discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, ResourceNames: req.GetResourceNames(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := p.state.SetCertificate(&certs[(i+1)%2]); err != nil {
			b.Fatal(err)
		}
		if resp, err = stream.Recv(); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
}
