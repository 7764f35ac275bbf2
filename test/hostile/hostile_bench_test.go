// Package hostile measures what one hostile peer costs each control-plane
// service (flotilla-discovery, flotilla-galley, flotilla-ca, each its own
// process on 127.0.0.1): the peak resident set over the service's idle
// one, and the CPU seconds it spends, under each pattern of attack that
// once cost hundreds of mebibytes or seconds of CPU. Results:
// BENCHMARKS.md, "One hostile peer".
package hostile

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/dev/devjwt"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

const sidecar = "sidecar~10.0.0.1~attacker-1.default~default.svc.cluster.local"

func startDiscovery(b *testing.B, bin string) (*proc.Process, string) {
	b.Helper()
	addr, admin := proc.FreeAddr(b), proc.FreeAddr(b)
	p := proc.Start(b, "discovery", filepath.Join(bin, "flotilla-discovery"), "--config-dir", b.TempDir(),
		"--xds-address", addr, "--admin-address", admin)
	proc.WaitReady(b, "http://"+admin+"/readyz")
	return p, addr
}

func startGalley(b *testing.B, bin string) (*proc.Process, string) {
	b.Helper()
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vs.yaml"), []byte(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter, namespace: default}
spec:
  hosts: [greeter]
  http: [{route: [{destination: {host: greeter}}]}]
`), 0o600); err != nil {
		b.Fatal(err)
	}
	addr, admin := proc.FreeAddr(b), proc.FreeAddr(b)
	p := proc.Start(b, "galley", filepath.Join(bin, "flotilla-galley"), "--config-dir", dir, "--mcp-address", addr, "--admin-address", admin)
	proc.WaitReady(b, "http://"+admin+"/readyz")
	return p, addr
}

func startCA(b *testing.B, bin string) (*proc.Process, string) {
	b.Helper()
	iss, err := devjwt.New("https://flotilla.test")
	if err != nil {
		b.Fatal(err)
	}
	d := &devjwt.Dir{Path: b.TempDir(), Issuer: iss}
	if err := d.Write(time.Now()); err != nil {
		b.Fatal(err)
	}
	addr, admin := proc.FreeAddr(b), proc.FreeAddr(b)
	p := proc.Start(b, "ca", filepath.Join(bin, "flotilla-ca"), "--address", addr, "--admin-address", admin,
		"--state-dir", b.TempDir(), "--jwks-file", d.JWKSFile(), "--jwt-issuer", "https://flotilla.test")
	proc.WaitReady(b, "http://"+admin+"/readyz")
	return p, addr
}

func dial(b *testing.B, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	b.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return cc
}

func names(prefix string, from, n, size int) []string {
	out := make([]string, n)
	for i := range out {
		name := fmt.Sprintf("%s-%07d", prefix, from+i)
		out[i] = name + strings.Repeat("x", max(0, size-len(name)))
	}
	return out
}

// deltaFlood sends reqs on one delta stream (as fast as the server takes
// them, for at most d) and drains what comes back.
func deltaFlood(b *testing.B, addr string, d time.Duration, reqs func(i int) *discoveryv3.DeltaDiscoveryRequest) {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), d)
	defer cancel()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dial(b, addr, nil)).DeltaAggregatedResources(ctx)
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				cancel()
				return
			}
		}
	}()
	for i := 0; ctx.Err() == nil; i++ {
		r := reqs(i)
		if r == nil || st.Send(r) != nil {
			break
		}
	}
	<-ctx.Done()
}

// idleConnections holds 100 TCP connections that never handshake for 20 s.
func idleConnections(b *testing.B, addr string) {
	b.Helper()
	var conns []net.Conn
	for range 100 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	time.Sleep(20 * time.Second)
	for _, c := range conns {
		c.Close()
	}
}

var patterns = map[string][]struct {
	name   string
	attack func(b *testing.B, addr string)
}{
	"discovery": {
		{"99,000 names of 1 KB on one delta stream", func(b *testing.B, addr string) {
			b.Helper()
			deltaFlood(b, addr, 30*time.Second, func(i int) *discoveryv3.DeltaDiscoveryRequest {
				if i >= 50 {
					return nil
				}
				return &discoveryv3.DeltaDiscoveryRequest{
					Node: &corev3.Node{Id: sidecar}, TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster",
					ResourceNamesSubscribe: names("outbound|80||svc", i*2_000, 2_000, 1_000),
				}
			})
		}},
		{"200 requests each unsubscribing an unknown name", func(b *testing.B, addr string) {
			b.Helper()
			deltaFlood(b, addr, 30*time.Second, func(i int) *discoveryv3.DeltaDiscoveryRequest {
				switch {
				case i == 0:
					return &discoveryv3.DeltaDiscoveryRequest{
						Node: &corev3.Node{Id: sidecar}, TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster",
						ResourceNamesSubscribe: names("outbound|80||svc", 0, 4_000, 1_000),
					}
				case i > 200:
					return nil
				}
				return &discoveryv3.DeltaDiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", ResourceNamesUnsubscribe: []string{fmt.Sprintf("unknown-%d", i)}}
			})
		}},
		{"100 connections that never handshake", idleConnections},
	},
	"galley": {
		{"NACKs with a fresh nonce each, for 10 s", func(b *testing.B, addr string) {
			b.Helper()
			deltaFlood(b, addr, 10*time.Second, func(i int) *discoveryv3.DeltaDiscoveryRequest {
				if i == 0 {
					return &discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "nacker"}, TypeUrl: "networking.istio.io/v1/VirtualService"}
				}
				return &discoveryv3.DeltaDiscoveryRequest{
					TypeUrl: "networking.istio.io/v1/VirtualService", ResponseNonce: fmt.Sprintf("made-up-%d", i),
					ErrorDetail: &status.Status{Code: 3, Message: strings.Repeat("not to my liking ", 60)},
				}
			})
		}},
		{"2,000 names subscribed and 2,000 unknown unsubscribed per request", func(b *testing.B, addr string) {
			b.Helper()
			deltaFlood(b, addr, 30*time.Second, func(i int) *discoveryv3.DeltaDiscoveryRequest {
				if i >= 100 {
					return nil
				}
				return &discoveryv3.DeltaDiscoveryRequest{
					Node: &corev3.Node{Id: "credit"}, TypeUrl: "networking.istio.io/v1/VirtualService",
					ResourceNamesSubscribe: names("default/vs", i*2_000, 2_000, 0), ResourceNamesUnsubscribe: names("default/unknown", i*2_000, 2_000, 0),
				}
			})
		}},
	},
	"ca": {
		{"24 requests of a 15 MiB CSR at once", func(b *testing.B, addr string) {
			b.Helper()
			cc := dial(b, addr, credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))
			var wg sync.WaitGroup
			huge := &securityv1alpha1.IstioCertificateRequest{Csr: strings.Repeat("A", 15<<20)}
			for range 24 {
				wg.Go(func() {
					_, _ = securityv1alpha1.NewIstioCertificateServiceClient(cc).CreateCertificate(b.Context(), huge)
				})
			}
			wg.Wait()
		}},
		{"300 bad tokens from one address", func(b *testing.B, addr string) {
			b.Helper()
			cc := dial(b, addr, credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))
			ctx := metadata.AppendToOutgoingContext(b.Context(), "authorization", "Bearer not.a.token")
			for range 300 {
				_, _ = securityv1alpha1.NewIstioCertificateServiceClient(cc).CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: "x"})
			}
		}},
		{"100 connections that never handshake", idleConnections},
	},
}

// BenchmarkHostilePeers runs each pattern once against a fresh process of
// its service and reports the service's peak RSS over its idle RSS
// (peak-MiB) and the CPU seconds it spent (cpu-s) while under attack.
// Run it with -benchtime=1x; it builds the binaries itself.
func BenchmarkHostilePeers(b *testing.B) {
	bin := b.TempDir()
	if err := build.Binaries(bin, "flotilla-discovery", "flotilla-galley", "flotilla-ca"); err != nil {
		b.Fatal(err)
	}
	starts := map[string]func(*testing.B, string) (*proc.Process, string){"discovery": startDiscovery, "galley": startGalley, "ca": startCA}
	for _, svc := range []string{"discovery", "galley", "ca"} {
		b.Run(svc+"/idle", func(b *testing.B) {
			measure(b, bin, starts[svc], func(*testing.B, string) { time.Sleep(10 * time.Second) })
		})
		for _, pat := range patterns[svc] {
			b.Run(svc+"/"+pat.name, func(b *testing.B) { measure(b, bin, starts[svc], pat.attack) })
		}
	}
}

func measure(b *testing.B, bin string, start func(*testing.B, string) (*proc.Process, string), attack func(*testing.B, string)) {
	b.Helper()
	for b.Loop() {
		p, addr := start(b, bin)
		time.Sleep(time.Second) // settled
		pid := p.Pid()
		idle, err := proc.RSSMiB(pid)
		if err != nil {
			b.Fatal(err)
		}
		if err := proc.ResetPeakRSS(pid); err != nil {
			b.Fatal(err)
		}
		cpu0, _ := proc.CPUSeconds(pid)
		attack(b, addr)
		time.Sleep(time.Second) // what the attack left running
		peak, err := proc.PeakRSSMiB(pid)
		if err != nil {
			b.Fatal(err)
		}
		cpu1, _ := proc.CPUSeconds(pid)
		b.ReportMetric(peak-idle, "peak-MiB")
		b.ReportMetric(cpu1-cpu0, "cpu-s")
		b.ReportMetric(idle, "idle-MiB")
		p.Kill(b)
	}
}
