package kube

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
)

// BenchmarkTokenReview is one authentication of a service account token:
// cached (a review made earlier is reused) and uncached (every call asks
// the real apiserver, which may answer from its own 10 s cache).
func BenchmarkTokenReview(b *testing.B) {
	ctx := context.Background()
	ns, err := env.CreateNamespace(ctx, "ca-bench")
	if err != nil {
		b.Fatal(err)
	}
	if err := env.CreateServiceAccount(ctx, ns, "app"); err != nil {
		b.Fatal(err)
	}
	tok, err := env.CreateToken(ctx, ns, "app", []string{"istio-ca"}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"cached", "uncached"} {
		b.Run(mode, func(b *testing.B) {
			r, err := NewTokenReview(env.Client, "istio-ca", noop.NewMeterProvider().Meter("b"), time.Now)
			if err != nil {
				b.Fatal(err)
			}
			in := withToken(tok)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if mode == "uncached" {
						r.mu.Lock()
						r.cache = map[[32]byte]cached{}
						r.mu.Unlock()
					}
					if _, _, err := r.Authenticate(in); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
