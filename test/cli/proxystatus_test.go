// Package cli_test runs the flotilla CLI as a process against the control
// plane as processes (galley on a directory, two discovery replicas) and
// real xDS clients: grpc-go's proxyless client and raw ADS clients that
// ACK, NACK or hold their ACK back.
package cli_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var binDir string

// backendPorts are the last mesh's backends' ports, v1 and v2.
var backendPorts [2]int

func TestMain(m *testing.M) {
	os.Exit(build.Main(m, &binDir, nil, "flotilla-galley", "flotilla-discovery", "flotilla"))
}

type replica struct {
	p                *proc.Process
	name, xds, admin string
}

// mesh is galley on a directory with the seed example (at galley, its
// MCP address) and two discovery replicas subscribed to it, named r1 and
// r2.
func mesh(t *testing.T) (dir, galley string, r1, r2 *replica) {
	t.Helper()
	dir = t.TempDir()
	v1, v2 := xdstest.StartBackend(t, "v1"), xdstest.StartBackend(t, "v2")
	backendPorts = [2]int{v1, v2}
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(90, 10))
	mcp, galleyAdmin := proc.FreeAddr(t), proc.FreeAddr(t)
	proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"), "--config-dir", dir, "--mcp-address", mcp, "--admin-address", galleyAdmin)
	proc.WaitReady(t, "http://"+galleyAdmin+"/readyz")
	// r2 is a canary revision's replica, as during a canary upgrade.
	return dir, mcp, startReplica(t, mcp, "r1", proc.FreeAddr(t), "--revision", "default"), startReplica(t, mcp, "r2", proc.FreeAddr(t), "--revision", "canary")
}

// startReplica starts a discovery replica of galley's named name serving
// xDS at xds, with more flags, and waits for it to be ready.
func startReplica(t *testing.T, galley, name, xds string, flags ...string) *replica {
	t.Helper()
	r := &replica{name: name, xds: xds, admin: proc.FreeAddr(t)}
	r.p = proc.Start(t, name, filepath.Join(binDir, "flotilla-discovery"), append([]string{
		"--galley-address", galley,
		"--xds-address", r.xds, "--admin-address", r.admin, "--debounce-quiet", "20ms", "--replica-name", name,
	}, flags...)...)
	proc.WaitReady(t, "http://"+r.admin+"/readyz")
	return r
}

// flotilla runs the CLI with a context file naming both replicas (as make
// run's does) and returns its exit code and output.
func flotilla(t *testing.T, context string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "flotilla"), args...)
	cmd.Env = append(os.Environ(), "FLOTILLA_CONTEXT="+context)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok { //nolint:errorlint // the command's own exit
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

func writeContext(t *testing.T, addrs ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "context.yaml")
	if err := debugapi.WriteContext(path, debugapi.Context{DiscoveryAddresses: addrs, Plaintext: true}); err != nil {
		t.Fatal(err)
	}
	return path
}

// rawClient is a sidecar's ADS stream asking for clusters; ack says what
// it does with each response: ACK, NACK, or nothing (it holds the ACK
// back, as a proxy stuck applying it would).
type rawClient struct {
	st  discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	got chan *discoveryv3.DiscoveryResponse
}

// askClusters opens a sidecar's ADS stream to addr and asks for its
// clusters.
func askClusters(t *testing.T, addr, id string) discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"ISTIO_VERSION": "1.27.3"})
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: id, Metadata: md}, TypeUrl: resourcev3.ClusterType}); err != nil {
		t.Fatal(err)
	}
	return st
}

func newRawClient(t *testing.T, addr, id, ack string) *rawClient {
	t.Helper()
	st := askClusters(t, addr, id)
	c := &rawClient{st: st, got: make(chan *discoveryv3.DiscoveryResponse, 16)}
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			req := &discoveryv3.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()}
			switch ack {
			case "ack":
				_ = st.Send(req)
			case "nack":
				req.VersionInfo = ""
				req.ErrorDetail = &rpcstatus.Status{Code: 3, Message: "cluster outbound|80||backend: not to this proxy's liking"}
				_ = st.Send(req)
			}
			c.got <- r
		}
	}()
	select {
	case <-c.got:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s got no clusters", id)
	}
	return c
}

const (
	proxylessID = "sidecar~10.0.0.9~client-1.default~default.svc.cluster.local"
	sidecarID   = "sidecar~10.0.0.8~app-1.default~default.svc.cluster.local"
	nackerID    = "sidecar~10.0.0.7~picky-1.default~default.svc.cluster.local"
	stalledID   = "sidecar~10.0.0.6~stuck-1.default~default.svc.cluster.local"
)

// line is the proxy-status table's line for a proxy.
func line(out, name string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, name+" ") {
			return l
		}
	}
	return ""
}

// meshWithClients is mesh with a proxyless client (that has called) on r1
// and a sidecar that ACKs on r2, and a context file naming both replicas.
func meshWithClients(t *testing.T) (ctxFile string, r1, r2 *replica) {
	t.Helper()
	_, _, r1, r2 = mesh(t)
	ctxFile = writeContext(t, r1.xds, r2.xds)
	c := xdstest.Client(t, proxylessID, xdstest.Target, r1.xds)
	if got := xdstest.Count(t, c, 10); got["v1"]+got["v2"] != 10 {
		t.Fatalf("proxyless calls: %v", got)
	}
	newRawClient(t, r2.xds, sidecarID, "ack")
	return ctxFile, r1, r2
}

func TestProxyStatusShowsEveryProxyOnEveryReplicaAndWhatItTook(t *testing.T) {
	ctxFile, r1, r2 := meshWithClients(t)
	newRawClient(t, r1.xds, nackerID, "nack")
	newRawClient(t, r2.xds, stalledID, "hold")

	var out string
	xdstest.Eventually(t, "every proxy as it is", func() bool {
		code, o, errOut := flotilla(t, ctxFile, "proxy-status")
		if code != 0 {
			t.Fatalf("proxy-status: exit %d: %s", code, errOut)
		}
		out = o
		pl := line(out, "client-1.default")
		return strings.Count(pl, "SYNCED") == 4 && strings.Contains(line(out, "app-1.default"), "SYNCED") &&
			strings.Contains(line(out, "picky-1.default"), "NACKED") && strings.Contains(line(out, "stuck-1.default"), "STALE")
	})
	t.Logf("flotilla proxy-status:\n%s", out)
	if h := strings.Fields(strings.Split(out, "\n")[0]); strings.Join(h, " ") != "NAME CDS LDS EDS RDS REPLICA REVISION VERSION" {
		t.Fatalf("header %q", h)
	}
	for name, want := range map[string][]string{
		"client-1.default": {"SYNCED (", " r1 ", " default "},
		"app-1.default":    {"SYNCED (", "IGNORED", " r2 ", " canary ", "1.27.3"},
		"picky-1.default":  {"NACKED", "IGNORED", " r1 ", " default "},
		"stuck-1.default":  {"STALE", "IGNORED", " r2 ", " canary "},
	} {
		l := line(out, name) + " "
		for _, w := range want {
			if !strings.Contains(l, w) {
				t.Errorf("%s: %q lacks %q", name, l, w)
			}
		}
	}

	// One proxy: the NACK's message, and nothing acknowledged to compare.
	code, detail, errOut := flotilla(t, ctxFile, "proxy-status", "picky-1.default")
	if code != 0 {
		t.Fatalf("proxy-status picky-1.default: %d %s", code, errOut)
	}
	for _, w := range []string{"Replica:  r1 (" + r1.xds + ")", "Revision: default", "not to this proxy's liking", "Clusters: nothing acknowledged yet"} {
		if !strings.Contains(detail, w) {
			t.Errorf("picky's detail lacks %q:\n%s", w, detail)
		}
	}
	if f := strings.Fields(line(detail, "CDS")); len(f) != 5 || f[1] != "NACKED" || f[2] != "-" || f[4] != "6" {
		t.Errorf("picky's CDS line %q", f)
	}
	if strings.Contains(detail, "Listeners") {
		t.Errorf("a type picky does not watch is compared:\n%s", detail)
	}
	// A proxy in sync holds what its replica would send now.
	code, detail, errOut = flotilla(t, ctxFile, "proxy-status", sidecarID)
	if code != 0 || !strings.Contains(detail, "Clusters Match") || !strings.Contains(detail, "Replica:  r2") {
		t.Fatalf("proxy-status of a synced sidecar: %d %s\n%s", code, errOut, detail)
	}
	code, detail, _ = flotilla(t, ctxFile, "proxy-status", proxylessID)
	for _, w := range []string{"proxyless gRPC", "Listeners Match", "Routes Match", "Clusters Match", "Endpoints Match"} {
		if code != 0 || !strings.Contains(detail, w) {
			t.Errorf("the proxyless client's detail lacks %q:\n%s", w, detail)
		}
	}

	// Machine-readable: every proxy with its replica.
	code, js, _ := flotilla(t, ctxFile, "proxy-status", "-o", "json")
	var rows []struct {
		Replica  string             `json:"replica"`
		Revision string             `json:"revision"`
		Proxy    debugapi.ProxySync `json:"proxy"`
	}
	if err := json.Unmarshal([]byte(js), &rows); code != 0 || err != nil || len(rows) != 4 {
		t.Fatalf("-o json: %d %v: %s", code, err, js)
	}
	for _, r := range rows {
		if want := map[string]string{"r1": "default", "r2": "canary"}[r.Replica]; r.Revision != want {
			t.Errorf("-o json: %s on %s is on revision %q, want %q", r.Proxy.ID, r.Replica, r.Revision, want)
		}
	}

	// Shell completion offers the proxies of every replica.
	for _, args := range [][]string{{"__complete", "proxy-status", ""}, {"__complete", "proxy-config", "cluster", ""}} {
		code, out, _ := flotilla(t, ctxFile, args...)
		for _, name := range []string{"client-1.default", "app-1.default", "picky-1.default", "stuck-1.default"} {
			if code != 0 || !strings.Contains(out, name+"\n") {
				t.Errorf("completion %v lacks %s: %d %q", args[1:], name, code, out)
			}
		}
	}
	if code, out, _ := flotilla(t, ctxFile, "__complete", "proxy-config", ""); code != 0 || !strings.Contains(out, "cluster\n") || !strings.Contains(out, "all\n") {
		t.Errorf("completion of proxy-config's kind: %d %q", code, out)
	}

	// A proxy that is nowhere, and a replica that is down: the other's
	// proxies are still listed, and the exit says which replica failed.
	if code, _, errOut := flotilla(t, ctxFile, "proxy-status", "nobody.default"); code != 1 || !strings.Contains(errOut, `no replica serves a proxy "nobody.default"`) {
		t.Fatalf("an unknown proxy: %d %s", code, errOut)
	}
	r2.p.Kill(t)
	code, out, errOut = flotilla(t, ctxFile, "proxy-status", "--timeout", "5s")
	if code != 1 || !strings.Contains(errOut, "discovery "+r2.xds) || line(out, "client-1.default") == "" {
		t.Fatalf("with r2 down: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	if code, out, _ := flotilla(t, ctxFile, "version"); code != 1 || !strings.Contains(out, "discovery version: "+build.Version+" (replica r1 of revision default at "+r1.xds+")") || !strings.Contains(out, "proxies at 1.27.3: ") {
		t.Fatalf("version with r2 down: %d %s", code, out)
	}
}
