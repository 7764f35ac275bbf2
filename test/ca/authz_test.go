package ca_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// greeterPolicies lets demo-client call the greeter when it says it is
// tenant "blue", and (with deny) denies everyone EmptyCall.
func greeterPolicies(deny bool) string {
	out := `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: greeter-callers, namespace: demo}
spec:
  selector: {matchLabels: {app: greeter}}
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/demo/sa/demo-client]}}]
    when:
    - {key: "request.headers[x-tenant]", values: [blue]}
`
	if deny {
		out += `---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-empty-calls, namespace: demo}
spec:
  selector: {matchLabels: {app: greeter}}
  action: DENY
  rules:
  - to: [{operation: {paths: [/grpc.testing.TestService/EmptyCall]}}]
`
	}
	return out
}

// rpc makes one call of method ("unary" or "empty") as tenant (none when
// empty) and returns its status code.
func rpc(ctx context.Context, c testgrpc.TestServiceClient, method, tenant string) codes.Code {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if tenant != "" {
		cctx = metadata.AppendToOutgoingContext(cctx, "x-tenant", tenant)
	}
	var err error
	if method == "empty" {
		_, err = c.EmptyCall(cctx, &testgrpc.Empty{}, grpc.WaitForReady(true))
	} else {
		_, err = c.UnaryCall(cctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
	}
	return status.Code(err)
}

// TestProxylessGRPCServersEnforceAuthorizationPolicyEndToEnd runs ca,
// galley, discovery, three agents in proxyless mode and the demo greeter
// as an xDS-enabled gRPC server under STRICT, all as processes; the
// clients are grpc-go's xDS clients with the client pods' files. grpc-go's
// own RBAC enforces what discovery sends: the ALLOW policy lets one SPIFFE
// principal in and only with the header it names; another principal is
// denied; the DENY policy on a method path denies that method to the
// allowed caller too, and once it is removed the method is served
// (Unimplemented by the greeter, so the call got past RBAC).
func TestProxylessGRPCServersEnforceAuthorizationPolicyEndToEnd(t *testing.T) {
	s := proc.NewSigner(t)
	c := startCA(t, t.TempDir(), s)
	secureXDS, greeterAddr, config := greeterMesh(t, c, s)
	xdstest.WriteFile(t, config, "authz.yaml", greeterPolicies(true))
	server := startProxylessAgent(t, c, s, secureXDS, "greeter-v1-1", "greeter-v1", `{"app": "greeter", "version": "v1"}`)
	startGreeter(t, server, greeterAddr)
	friend := startProxylessAgent(t, c, s, secureXDS, "client-1", "demo-client", `{"app": "client"}`).xdsClient(t, "xds:///greeter.demo.svc.cluster.local:50051")
	intruder := startProxylessAgent(t, c, s, secureXDS, "intruder-1", "intruder", `{"app": "intruder"}`).xdsClient(t, "xds:///greeter.demo.svc.cluster.local:50051")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	for _, tc := range []struct {
		name           string
		client         testgrpc.TestServiceClient
		method, tenant string
		want           codes.Code
	}{
		{"the allowed principal with the header", friend, "unary", "blue", codes.OK},
		{"the allowed principal without the header", friend, "unary", "", codes.PermissionDenied},
		{"the allowed principal with another tenant", friend, "unary", "red", codes.PermissionDenied},
		{"another principal with the header", intruder, "unary", "blue", codes.PermissionDenied},
		{"the allowed principal on the denied path", friend, "empty", "blue", codes.PermissionDenied},
	} {
		if got := rpc(ctx, tc.client, tc.method, tc.tenant); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}

	xdstest.WriteFile(t, config, "authz.yaml", greeterPolicies(false))
	xdstest.Eventually(t, "the method reaches the greeter once the DENY policy is gone", func() bool {
		return rpc(ctx, friend, "empty", "blue") == codes.Unimplemented
	})
	if got := rpc(ctx, intruder, "unary", "blue"); got != codes.PermissionDenied {
		t.Fatalf("after the change, another principal: %v", got)
	}
}
