// Package traces_test follows one configuration change across the
// services, as an operator does in a trace backend: galley (a directory)
// and two discovery replicas export their spans over OTLP/gRPC to a
// receiver on loopback (the OTLP TraceService from the protocol's own
// protos, as a collector serves it), and proxyless gRPC clients on both
// replicas take the change.
package traces_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

var binDir string

func TestMain(m *testing.M) {
	os.Exit(build.Main(m, &binDir, nil, "flotilla-galley", "flotilla-discovery"))
}

// span is what the test reads of an exported span.
type span struct {
	service, name     string
	trace, id, parent string
	attrs             map[string]string
	links             int
	start, end        time.Time
	statusError       string
}

// receiver is an OTLP trace receiver on loopback.
type receiver struct {
	coltrace.UnimplementedTraceServiceServer
	addr  string
	mu    sync.Mutex
	spans []span
}

func (r *receiver) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := span{
					service: service, name: s.GetName(), trace: hex.EncodeToString(s.GetTraceId()), id: hex.EncodeToString(s.GetSpanId()),
					parent: hex.EncodeToString(s.GetParentSpanId()), attrs: map[string]string{}, links: len(s.GetLinks()),
					start: time.Unix(0, int64(s.GetStartTimeUnixNano())), end: time.Unix(0, int64(s.GetEndTimeUnixNano())),
				}
				for _, a := range s.GetAttributes() {
					switch v := a.GetValue().GetValue().(type) {
					case *commonpb.AnyValue_StringValue:
						sp.attrs[a.GetKey()] = v.StringValue
					case *commonpb.AnyValue_IntValue:
						sp.attrs[a.GetKey()] = fmt.Sprint(v.IntValue)
					case *commonpb.AnyValue_BoolValue:
						sp.attrs[a.GetKey()] = fmt.Sprint(v.BoolValue)
					}
				}
				if s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
					// a NACK's, or a refused change's
					sp.statusError = s.GetStatus().GetMessage()
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

func (r *receiver) all() []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

func startReceiver(t *testing.T) *receiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	r := &receiver{addr: lis.Addr().String()}
	coltrace.RegisterTraceServiceServer(srv, r)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return r
}

// TestOneChangeIsOneTraceFromGalleyToEveryProxysAck edits a
// VirtualService in galley's directory and finds, in what the services
// exported, one trace holding: galley's change (validate, publish), each
// replica's push (debounce, push context), each proxy's part of its
// replica's push, and each proxy's acknowledgement of what it was sent.
func TestOneChangeIsOneTraceFromGalleyToEveryProxysAck(t *testing.T) {
	rec := startReceiver(t)
	dir := t.TempDir()
	v1, v2 := xdstest.StartBackend(t, "v1"), xdstest.StartBackend(t, "v2")
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(v1, "v1"), xdstest.Endpoint(v2, "v2")))
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(100, 0))
	mcp, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"), "--config-dir", dir, "--mcp-address", mcp, "--admin-address", admin,
		"--otlp-endpoint", rec.addr)
	proc.WaitReady(t, "http://"+admin+"/readyz")
	var replicas []string
	for _, name := range []string{"r1", "r2"} {
		xds, admin := proc.FreeAddr(t), proc.FreeAddr(t)
		proc.Start(t, name, filepath.Join(binDir, "flotilla-discovery"), "--galley-address", mcp, "--xds-address", xds,
			"--admin-address", admin, "--replica-name", name, "--otlp-endpoint", rec.addr)
		proc.WaitReady(t, "http://"+admin+"/readyz")
		replicas = append(replicas, xds)
	}
	// Two proxyless clients on each replica.
	proxies := map[string]testgrpc.TestServiceClient{}
	for i := range 4 {
		id := fmt.Sprintf("sidecar~127.0.0.%d~client-%d.default~default.svc.cluster.local", i+2, i)
		proxies[id] = xdstest.Client(t, id, xdstest.Target, replicas[i%2])
	}
	for _, c := range proxies {
		xdstest.Eventually(t, "all calls to v1", func() bool { return xdstest.Count(t, c, 10)["v1"] == 10 })
	}

	edited := time.Now()
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(0, 100))
	for _, c := range proxies {
		xdstest.Eventually(t, "all calls to v2", func() bool { return xdstest.Count(t, c, 10)["v2"] == 10 })
	}

	// The spans come in batches (every few seconds from each service).
	var trace []span
	var missing []string
	deadline := time.Now().Add(45 * time.Second)
	for {
		trace, missing = changeTrace(rec.all(), edited, proxies)
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the change's trace lacks:\n  %s\nit holds:\n%s", strings.Join(missing, "\n  "), describe(trace))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("one change, one trace of %d spans:\n%s", len(trace), describe(trace))
}

// changeTrace finds the trace of galley's change made after edited and
// says what it lacks of: galley's change, validation and publishing; each
// replica's push with its debounce, push context and fan-out (ending after
// every proxy's push); each proxy's push under its replica's and its
// acknowledgement under that.
func changeTrace(all []span, edited time.Time, proxies map[string]testgrpc.TestServiceClient) ([]span, []string) {
	var root *span
	for i, s := range all {
		if s.service == "flotilla-galley" && s.name == "files.change" && !s.start.Before(edited.Add(-time.Second)) {
			root = &all[i]
		}
	}
	if root == nil {
		return nil, []string{"galley's span of the change (files.change)"}
	}
	var trace []span
	byID := map[string]span{}
	for _, s := range all {
		if s.trace == root.trace {
			trace = append(trace, s)
			byID[s.id] = s
		}
	}
	var missing []string
	childOf := func(parent span, service, name string) []span {
		var out []span
		for _, s := range trace {
			if s.parent == parent.id && s.service == service && s.name == name {
				out = append(out, s)
			}
		}
		return out
	}
	for _, name := range []string{"validate", "publish"} {
		if len(childOf(*root, "flotilla-galley", name)) != 1 {
			missing = append(missing, "galley's "+name+" under its change")
		}
	}
	publish := childOf(*root, "flotilla-galley", "publish")
	if len(publish) != 1 {
		return trace, missing
	}
	pushes := childOf(publish[0], "flotilla-discovery", "discovery.push")
	if len(pushes) != 2 {
		missing = append(missing, fmt.Sprintf("a discovery.push under galley's publish from each replica (have %d)", len(pushes)))
	}
	acked := map[string]bool{}
	pushed := map[string]bool{}
	for _, p := range pushes {
		for _, name := range []string{"debounce", "pushcontext"} {
			if len(childOf(p, "flotilla-discovery", name)) != 1 {
				missing = append(missing, name+" under a replica's push")
			}
		}
		fanout := childOf(p, "flotilla-discovery", "fanout")
		if len(fanout) != 1 {
			missing = append(missing, "fanout under a replica's push")
		}
		for _, pp := range childOf(p, "flotilla-discovery", "proxy.push") {
			if len(fanout) == 1 && fanout[0].end.Before(pp.end) {
				missing = append(missing, "a fanout that ends after "+pp.attrs["proxy"]+"'s proxy.push")
			}
			pushed[pp.attrs["proxy"]] = true
			for _, a := range childOf(pp, "flotilla-discovery", "proxy.ack") {
				if a.statusError == "" && a.attrs["proxy"] == pp.attrs["proxy"] && !a.end.Before(a.start) {
					acked[pp.attrs["proxy"]] = true
				}
			}
		}
	}
	for id := range proxies {
		if !pushed[id] {
			missing = append(missing, "proxy.push of "+id)
		}
		if !acked[id] {
			missing = append(missing, "proxy.ack of "+id)
		}
	}
	for _, s := range trace {
		if s.id != root.id {
			if _, ok := byID[s.parent]; !ok {
				missing = append(missing, fmt.Sprintf("the parent of %s's %s (a span outside the trace)", s.service, s.name))
			}
		}
	}
	slices.Sort(missing)
	return trace, missing
}

// describe lists spans as a tree's lines: service, name, attributes.
func describe(spans []span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s %s %s parent=%s %v %s\n", s.service, s.name, s.id, s.parent, s.attrs, s.end.Sub(s.start).Round(time.Microsecond))
	}
	return b.String()
}
