package analyze_test

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/cli/analyze"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// mesh writes n services' worth of configuration, five objects each: a
// Kubernetes Service and its Deployment, a VirtualService splitting
// between two subsets, their DestinationRule and an AuthorizationPolicy;
// every tenth namespace has a STRICT PeerAuthentication and a Sidecar.
func mesh(n int) []byte {
	var b strings.Builder
	for i := range n {
		ns := fmt.Sprintf("ns-%d", i/10)
		fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata: {name: svc-%[1]d, namespace: %[2]s}
spec: {selector: {app: svc-%[1]d}, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: svc-%[1]d, namespace: %[2]s}
spec: {selector: {matchLabels: {app: svc-%[1]d}}, template: {metadata: {labels: {app: svc-%[1]d, version: v1}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: svc-%[1]d, namespace: %[2]s}
spec:
  hosts: [svc-%[1]d]
  http:
  - match: [{headers: {x-canary: {exact: "yes"}}}]
    route: [{destination: {host: svc-%[1]d, subset: v2}}]
  - route:
    - {destination: {host: svc-%[1]d, subset: v1}, weight: 90}
    - {destination: {host: svc-%[1]d, subset: v2}, weight: 10}
    timeout: 5s
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: svc-%[1]d, namespace: %[2]s}
spec:
  host: svc-%[1]d
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}, connectionPool: {http: {http2MaxRequests: 100}}}
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: svc-%[1]d, namespace: %[2]s}
spec:
  selector: {matchLabels: {app: svc-%[1]d}}
  rules: [{from: [{source: {principals: ["cluster.local/ns/%[2]s/sa/client"]}}], to: [{operation: {methods: [GET]}}]}]
---
`, i, ns)
		if i%10 == 0 {
			fmt.Fprintf(&b, `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: %[1]s}
spec: {mtls: {mode: STRICT}}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: %[1]s}
spec: {egress: [{hosts: ["./*", "istio-system/*"]}]}
---
`, ns)
		}
	}
	return []byte(b.String())
}

// BenchmarkAnalyze10000Objects is `flotilla analyze -` on 2,000
// services' configuration (10,400 objects): reading, validating, every
// cross-object check, and printing.
func BenchmarkAnalyze10000Objects(b *testing.B) {
	data := mesh(2000)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	var msgs int
	for b.Loop() {
		files, err := analyze.ReadFiles([]string{analyze.Stdin}, false, bytes.NewReader(data), "default", "cluster.local")
		if err != nil {
			b.Fatal(err)
		}
		out := validation.Analyze(analyze.Input(files, "cluster.local"))
		if err := analyze.Print(io.Discard, "log", out, files); err != nil {
			b.Fatal(err)
		}
		msgs = len(out)
	}
	b.ReportMetric(float64(msgs), "messages")
}
