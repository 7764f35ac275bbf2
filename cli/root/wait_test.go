package root

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

// debugReplica is a discovery replica's debug stream on loopback: it
// answers every request with d, or, hung (a paused process), never.
type debugReplica struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	d    *debugapi.ObjectDistribution
	hung bool
}

func (r *debugReplica) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		req, err := s.Recv()
		if err != nil {
			return nil //nolint:nilerr // the client went
		}
		if r.hung {
			<-s.Context().Done()
			return nil
		}
		st, err := r.d.Struct()
		if err != nil {
			return err
		}
		a, err := anypb.New(st)
		if err != nil {
			return err
		}
		if err := s.Send(&discoveryv3.DiscoveryResponse{TypeUrl: req.GetTypeUrl(), Resources: []*anypb.Any{a}}); err != nil {
			return err
		}
	}
}

func serveDebug(t *testing.T, r *debugReplica, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// A replica that hangs (paused, say) does not hide the others' answers:
// the wait names it, and counts the proxies of those that answered —
// not "held by 0 of 0 proxies" with nothing behind.
func TestWaitNamesAHungReplicaAndCountsTheOthersProxies(t *testing.T) {
	good := serveDebug(t, &debugReplica{d: &debugapi.ObjectDistribution{
		Object: "VirtualService/default/reviews", Push: 3,
		History: []debugapi.ObjectVersion{{Version: "2", Push: 2}},
		Proxies: []debugapi.ProxyPush{{ID: "sidecar~10.0.0.1~a.default~default.svc.cluster.local", Namespace: "default", Push: 3}},
	}})
	hung := serveDebug(t, &debugReplica{hung: true})
	code, _, errOut := run("wait", "VirtualService", "reviews.default", "--resource-version", "2",
		"--context-file", "", "--discovery-address", good+","+hung, "--plaintext", "--timeout", "8s")
	if code == 0 {
		t.Fatal("the wait succeeded with a replica that never answered")
	}
	for _, want := range []string{"is held by 1 of 1 proxies; behind:", "replica " + hung + ": it did not answer"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the wait says\n%s\nwithout %q", errOut, want)
		}
	}
}

// A replica that hangs uses up check's --timeout waiting for its answer;
// the one that answered still has its certificate checked, with time of
// its own, rather than fail for want of it.
func TestCheckWithAHungReplicaStillChecksTheHealthyOnesCertificate(t *testing.T) {
	ca, err := testpki.NewCA("mesh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	server, err := ca.Issue(testpki.Request{CommonName: "discovery", DNSNames: []string{"flotilla-discovery.istio-system.svc"}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(testpki.Request{CommonName: "cli"})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := server.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	creds := grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	good := serveDebug(t, &debugReplica{d: &debugapi.ObjectDistribution{}}, creds)
	hung := serveDebug(t, &debugReplica{hung: true}, creds)
	_, out, _ := run("check", "--context-file", "", "--discovery-address", good+","+hung, "--timeout", "3s",
		"--cacert", write("roots.pem", ca.CertPEM), "--cert", write("cert.pem", client.CertPEM), "--key", write("key.pem", client.KeyPEM))
	if !strings.Contains(out, "'s certificate valid until") || strings.Contains(out, "the replica answered a moment ago") {
		t.Fatalf("check with a hung replica:\n%s", out)
	}
}
