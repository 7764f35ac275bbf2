package cli_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// TestDescribePodSaysWhatGalleysConfigurationAppliesToAWorkload: galley
// (file mode) as a process serving a ServiceEntry whose workloads are
// WorkloadEntries, a DestinationRule with two subsets, a VirtualService
// splitting between them and a STRICT PeerAuthentication;
// `flotilla x describe pod` reads it over MCP and says, for the v1
// workload, which subset selects it, which route reaches it and its mTLS
// mode. A workload galley does not have is an error that says so.
func TestDescribePodSaysWhatGalleysConfigurationAppliesToAWorkload(t *testing.T) {
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "greeter.yaml", `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  location: MESH_INTERNAL
  workloadSelector: {labels: {app: greeter}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: greeter-v1, namespace: demo}
spec: {address: 127.0.0.1, labels: {app: greeter, version: v1}, serviceAccount: greeter}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: greeter-v2, namespace: demo}
spec: {address: 127.0.0.2, labels: {app: greeter, version: v2}, serviceAccount: greeter}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: demo}
spec:
  host: greeter.demo.svc.cluster.local
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  http:
  - route:
    - {destination: {host: greeter.demo.svc.cluster.local, subset: v1}, weight: 90}
    - {destination: {host: greeter.demo.svc.cluster.local, subset: v2}, weight: 10}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: demo}
spec: {mtls: {mode: STRICT}}
`)
	mcp, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"), "--config-dir", dir, "--mcp-address", mcp, "--admin-address", admin)
	proc.WaitReady(t, "http://"+admin+"/readyz")

	code, out, stderr := flotilla(t, "", "x", "describe", "pod", "greeter-v1.demo", "--galley-address", mcp, "--plaintext")
	if code != 0 {
		t.Fatalf("describe: exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"Pod: greeter-v1.demo\n   Identity: spiffe://cluster.local/ns/demo/sa/greeter\n   Address: 127.0.0.1\n",
		"ServiceEntry host: greeter.demo.svc.cluster.local\n   Port: grpc 50051/GRPC targets pod port 50051\n",
		"DestinationRule: demo/greeter for \"greeter.demo.svc.cluster.local\"\n   Matching subsets: v1\n      (Non-matching subsets v2)\n",
		"VirtualService: demo/greeter\n   Reaches the pod: HTTP route #0: subset v1, weight 90\n   Not to the pod: HTTP route #0: non-matching subset v2\n",
		"Effective PeerAuthentication:\n   Workload mTLS mode: STRICT\nApplied PeerAuthentication:\n   demo/default\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no\n%s\nin\n%s", want, out)
		}
	}
	if code, _, stderr := flotilla(t, "", "x", "describe", "pod", "greeter-v9.demo", "--galley-address", mcp, "--plaintext"); code != 1 || !strings.Contains(stderr, "pod greeter-v9.demo is not among galley's endpoints") {
		t.Errorf("a workload galley does not have: exit %d: %s", code, stderr)
	}
	if code, _, stderr := flotilla(t, "", "x", "describe", "pod", "greeter-v1", "--galley-address", mcp, "--plaintext"); code != 1 || !strings.Contains(stderr, "want the pod as POD.NAMESPACE") {
		t.Errorf("a pod without its namespace: exit %d: %s", code, stderr)
	}
}
