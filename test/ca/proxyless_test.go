package ca_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// proxylessPod is an agent in proxyless mode (Istio's grpc-agent
// template): no Envoy, a gRPC xDS bootstrap and certificate files.
type proxylessPod struct {
	agent            *proc.Process
	admin            string
	bootstrap, certs string
}

// startProxylessAgent runs `flotilla-agent proxy sidecar` with
// DISABLE_ENVOY for demo/<name> with service account sa and labels, its
// certificates from c with a short lifetime, the files read again every
// second.
func startProxylessAgent(tb testing.TB, c *ca, s *proc.Signer, secureXDS, name, sa, labels string) *proxylessPod {
	tb.Helper()
	dir, tokenFile := podDir(tb, s, "demo", sa)
	p := &proxylessPod{admin: proc.FreeAddr(tb), bootstrap: filepath.Join(dir, "grpc-bootstrap.json"), certs: filepath.Join(dir, "certs")}
	for k, v := range map[string]string{
		"POD_NAME": name, "POD_NAMESPACE": "demo", "INSTANCE_IP": "127.0.0.1", "SERVICE_ACCOUNT": sa,
		"TRUST_DOMAIN": "cluster.local", "CLUSTER_ID": "Kubernetes", "DISCOVERY_ADDRESS": secureXDS, "CA_ADDRESS": c.addr,
		"ISTIO_METAJSON_LABELS": labels, "DISABLE_ENVOY": "true", "GRPC_XDS_BOOTSTRAP": p.bootstrap, "OUTPUT_CERTS": p.certs,
	} {
		tb.Setenv(k, v)
	}
	p.agent = proc.Start(tb, "agent-"+name, filepath.Join(binDir, "flotilla-agent"),
		"proxy", "sidecar",
		"--admin-address", p.admin, "--ca-roots-file", filepath.Join(c.state, "roots.pem"), "--token-file", tokenFile,
		"--discovery-server-name", "flotilla-discovery.istio-system.svc",
		"--certs-dir", filepath.Join(dir, "no-certs"), "--xds-socket", filepath.Join(dir, "XDS"),
		"--cert-ttl", "10s", "--grpc-cert-refresh", "1s")
	proc.WaitReady(tb, "http://"+p.admin+"/healthz/ready")
	return p
}

// serial is the serial number of the certificate in the pod's files.
func (p *proxylessPod) serial(tb testing.TB) string {
	tb.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(p.certs, "cert-chain.pem"), filepath.Join(p.certs, "key.pem"))
	if err != nil {
		tb.Fatal(err)
	}
	return pair.Leaf.SerialNumber.String()
}

// xdsClient is a grpc-go xDS client in the test process with the pod's
// bootstrap and xDS credentials (plaintext where discovery sends no TLS).
func (p *proxylessPod) xdsClient(tb testing.TB, target string) testgrpc.TestServiceClient {
	tb.Helper()
	bootstrap, err := os.ReadFile(p.bootstrap)
	if err != nil {
		tb.Fatal(err)
	}
	r, err := xds.NewXDSResolverWithConfigForTesting(bootstrap)
	if err != nil {
		tb.Fatalf("grpc-go refuses the agent's bootstrap: %v", err)
	}
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		tb.Fatal(err)
	}
	cc, err := grpc.NewClient(target, grpc.WithResolvers(r), grpc.WithTransportCredentials(creds))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	return testgrpc.NewTestServiceClient(cc)
}

// call makes one call and returns the version that answered, the
// caller's identity as the server read it, and the server's identity.
func call(ctx context.Context, c testgrpc.TestServiceClient) (version, caller, server string, err error) {
	var pr peer.Peer
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.UnaryCall(cctx, &testgrpc.SimpleRequest{}, grpc.Peer(&pr), grpc.WaitForReady(true))
	if err != nil {
		return "", "", "", err
	}
	return resp.GetHostname(), resp.GetUsername(), peerID(&pr), nil
}

// peerID is the SPIFFE ID of the peer's certificate, "" without one.
func peerID(p *peer.Peer) string {
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 || len(info.State.PeerCertificates[0].URIs) == 0 {
		return ""
	}
	return info.State.PeerCertificates[0].URIs[0].String()
}

// handshakeSerial makes a TLS handshake with addr presenting the pod's
// certificate files and returns the serial of the server's certificate.
func (p *proxylessPod) handshakeSerial(tb testing.TB, addr string) (string, error) {
	tb.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(p.certs, "cert-chain.pem"), filepath.Join(p.certs, "key.pem"))
	if err != nil {
		return "", err
	}
	conn, err := tls.Dial("tcp", addr, &tls.Config{Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true, NextProtos: []string{"h2"}}) // only the serial is read
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// meshConfig is the greeter's ServiceEntry (one endpoint, a mesh workload
// running as greeter-v1) and the PeerAuthentication of its workloads.
func meshConfig(port, mode string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  endpoints:
  - address: 127.0.0.1
    ports: {grpc: %s}
    labels: {app: greeter, version: v1, security.istio.io/tlsMode: istio}
    serviceAccount: greeter-v1
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: greeter, namespace: demo}
spec:
  selector: {matchLabels: {app: greeter}}
  mtls: {mode: %s}
`, port, mode)
}

// greeterMesh runs galley and discovery (certificates from c) serving the
// greeter's ServiceEntry, its endpoint on a free port, under STRICT; it
// returns discovery's mTLS address, the greeter's address and the
// configuration directory.
func greeterMesh(tb testing.TB, c *ca, s *proc.Signer) (secureXDS, greeterAddr, config string) {
	tb.Helper()
	greeterAddr = proc.FreeAddr(tb)
	_, port, _ := strings.Cut(greeterAddr, ":")
	config = tb.TempDir()
	xdstest.WriteFile(tb, config, "greeter.yaml", meshConfig(port, "STRICT"))
	secureXDS, _ = meshServing(tb, c, s, config)
	return secureXDS, greeterAddr, config
}

// startGreeter runs the demo greeter on addr as an xDS-enabled server with
// pod's bootstrap, and waits until discovery has let it serve.
func startGreeter(tb testing.TB, pod *proxylessPod, addr string) *proc.Process {
	tb.Helper()
	tb.Setenv("GRPC_XDS_BOOTSTRAP", pod.bootstrap)
	g := proc.StartCommand(tb, "greeter", filepath.Join(binDir, "flotilla-demo"), "greeter", "--xds", "--version", "v1", "--address", addr)
	g.Out.WaitFor(tb, "mode=SERVING")
	return g
}

// TestProxylessGRPCTalksMTLSWithSPIFFEIdentitiesEndToEnd runs ca, galley,
// discovery, two agents in proxyless mode and the demo greeter as an
// xDS-enabled gRPC server, all as processes; the client is grpc-go's xDS
// client in the test with the client pod's bootstrap and certificate
// files. Under STRICT, calls are mTLS with both identities checked, a
// plaintext client is refused, and certificate rotations on both sides
// during a stream of calls lose none; under PERMISSIVE the server serves
// plaintext, and the client follows.
func TestProxylessGRPCTalksMTLSWithSPIFFEIdentitiesEndToEnd(t *testing.T) {
	s := proc.NewSigner(t)
	c := startCA(t, t.TempDir(), s)
	secureXDS, greeterAddr, config := greeterMesh(t, c, s)
	_, port, _ := strings.Cut(greeterAddr, ":")
	server := startProxylessAgent(t, c, s, secureXDS, "greeter-v1-1", "greeter-v1", `{"app": "greeter", "version": "v1"}`)
	startGreeter(t, server, greeterAddr)
	client := startProxylessAgent(t, c, s, secureXDS, "client-1", "demo-client", `{"app": "client"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	c1 := client.xdsClient(t, "xds:///greeter.demo.svc.cluster.local:50051")
	version, caller, serverID, err := call(ctx, c1)
	if err != nil || version != "v1" {
		t.Fatalf("the first call: %q, %v", version, err)
	}
	if caller != "spiffe://cluster.local/ns/demo/sa/demo-client" || serverID != "spiffe://cluster.local/ns/demo/sa/greeter-v1" {
		t.Fatalf("over mTLS the server read the caller as %q and the client reached %q", caller, serverID)
	}
	// discovery knows both by their identities, at their agent's version
	// (the bootstrap's ISTIO_VERSION, as pilot-agent sets it).
	for _, p := range debugSyncz(t, c, s, secureXDS, "istio-system", "flotilla-cli") {
		if p.IstioVersion != build.Version || !strings.HasPrefix(p.Identity, "spiffe://cluster.local/ns/demo/sa/") {
			t.Errorf("syncz: %s at version %q as %s", p.ID, p.IstioVersion, p.Identity)
		}
	}

	// STRICT: a client without a certificate is refused.
	plain, err := grpc.NewClient(greeterAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = testgrpc.NewTestServiceClient(plain).UnaryCall(pctx, &testgrpc.SimpleRequest{})
	pcancel()
	if err == nil {
		t.Fatal("a plaintext call was served under STRICT")
	}

	// Calls go on while both certificates rotate (10 s lifetime, renewed
	// at 50-80 %): none is lost, and a new connection meets the
	// server's new certificate.
	serverSerial, clientSerial := server.serial(t), client.serial(t)
	calls := 0
	for server.serial(t) == serverSerial || client.serial(t) == clientSerial {
		if calls > 2000 {
			t.Fatal("no rotation on both sides within 2,000 calls")
		}
		if _, _, _, err := call(ctx, c1); err != nil {
			t.Fatalf("call %d during rotation: %v", calls, err)
		}
		calls++
		time.Sleep(20 * time.Millisecond)
	}
	for range 50 { // past the next file refresh
		if _, _, _, err := call(ctx, c1); err != nil {
			t.Fatalf("a call after rotation: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d calls through both rotations, none lost", calls+50)
	xdstest.Eventually(t, "a new handshake meets the server's rotated certificate", func() bool {
		got, err := client.handshakeSerial(t, greeterAddr)
		return err == nil && got == server.serial(t)
	})

	// PERMISSIVE: the server's listener turns plaintext, and the client's
	// auto mTLS follows (a proxyless server cannot take both).
	xdstest.WriteFile(t, config, "greeter.yaml", meshConfig(port, "PERMISSIVE"))
	xdstest.Eventually(t, "a plaintext call served under PERMISSIVE", func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		resp, err := testgrpc.NewTestServiceClient(plain).UnaryCall(pctx, &testgrpc.SimpleRequest{})
		return err == nil && resp.GetUsername() == ""
	})
	xdstest.Eventually(t, "the xDS client in plaintext too", func() bool {
		v, caller, _, err := call(ctx, c1)
		return err == nil && v == "v1" && caller == ""
	})
}
