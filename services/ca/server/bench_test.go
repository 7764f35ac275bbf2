package server

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/flotilla-mesh/flotilla/services/ca/authority"
)

func csrs(b *testing.B, n int, rsaKeys bool) []string {
	b.Helper()
	out := make([]string, n)
	for i := range n {
		var key crypto.Signer
		if rsaKeys {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				b.Fatal(err)
			}
			key = k
		} else {
			key = newKey(b)
		}
		out[i] = csr(b, key)
	}
	return out
}

// BenchmarkRawSigning is authority.Issue in-process: the physical limit.
func BenchmarkRawSigning(b *testing.B) {
	for _, kind := range []string{"ECDSA-P256", "RSA-2048"} {
		b.Run(kind, func(b *testing.B) {
			f := newFixture(b, nil)
			pool := csrs(b, 8, kind == "RSA-2048")
			id := authority.Identity{TrustDomain: "cluster.local", Namespace: "default", ServiceAccount: "app"}
			var i atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := i.Add(1)
					if _, err := f.ca.Issue(authority.Request{CSRPEM: []byte(pool[n%int64(len(pool))]), Identity: id}, time.Now()); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
		})
	}
}

// BenchmarkCreateCertificate is the whole call over gRPC/TLS on loopback
// with 50 concurrent clients, each authenticating with a JWT.
func BenchmarkCreateCertificate(b *testing.B) {
	for _, kind := range []string{"ECDSA-P256", "RSA-2048"} {
		b.Run(kind, func(b *testing.B) {
			f := newFixture(b, func(o *Options) { o.RatePerIdentity, o.Burst = 1e9, 1<<30 })
			pool := csrs(b, 8, kind == "RSA-2048")
			tok := f.token(b, claims{sub: "system:serviceaccount:default:app"})
			var mu sync.Mutex
			var lat []time.Duration
			var i atomic.Int64
			b.SetParallelism(25) // × GOMAXPROCS (2) = 50 clients
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				cc := f.dial(b, nil) // each client keeps its connection, as agents do
				defer cc.Close()
				var mine []time.Duration
				for pb.Next() {
					n := i.Add(1)
					start := time.Now()
					if _, err := ask(cc, tok, &securityv1alpha1.IstioCertificateRequest{Csr: pool[n%int64(len(pool))]}); err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, time.Since(start))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "certs/s")
		})
	}
}
