package describe

import (
	"strings"
	"testing"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

const bookinfo = `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo}
spec:
  host: reviews
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews]
  http:
  - match: [{headers: {end-user: {exact: jason}}}]
    route: [{destination: {host: reviews, subset: v2}}]
  - route: [{destination: {host: reviews, subset: v1}}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: bookinfo}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: PERMISSIVE}}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: reviews-viewer, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: reviews}}
  action: ALLOW
  rules: [{to: [{operation: {methods: [GET]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ratings-only, namespace: bookinfo}
spec:
  selector: {matchLabels: {app: ratings}}
  action: DENY
  rules: [{to: [{operation: {methods: [POST]}}]}]
`

func push(t *testing.T) *model.PushContext {
	t.Helper()
	st := model.NewStore()
	for _, d := range istio.Decode("bookinfo.yaml", []byte(bookinfo), "bookinfo") {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
		st.PutObject(d.Object)
	}
	st.PutService(&registryv1.Service{
		Hostname: "reviews.bookinfo.svc.cluster.local", Name: "reviews", Namespace: "bookinfo", Selector: map[string]string{"app": "reviews"},
		SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE, Location: registryv1.Location_LOCATION_MESH_INTERNAL,
		Ports: []*registryv1.ServicePort{{Name: "http", Number: 9080, TargetPort: 9080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
	})
	ep := func(name, version, ip string) *registryv1.Endpoint {
		return &registryv1.Endpoint{
			Address: ip, Ports: []*registryv1.EndpointPort{{ServicePortName: "http", Number: 9080}}, Labels: map[string]string{"app": "reviews", "version": version},
			ServiceAccount: "bookinfo-reviews", WorkloadName: name, WorkloadNamespace: "bookinfo",
		}
	}
	st.PutEndpointSet(&registryv1.EndpointSet{
		ServiceHostname: "reviews.bookinfo.svc.cluster.local", ServiceNamespace: "bookinfo",
		Endpoints: []*registryv1.Endpoint{ep("reviews-v1-abc", "v1", "10.0.0.5"), ep("reviews-v3-xyz", "v3", "10.0.0.7")},
	})
	pc, _ := st.Build(model.BuildOptions{}, nil, 1)
	return pc
}

func TestAPodIsDescribedWithWhatAppliesToItAndWhy(t *testing.T) {
	pc := push(t)
	w, ok := FindWorkload(pc, "reviews-v1-abc", "bookinfo")
	if !ok {
		t.Fatal("the pod is not found among the endpoints")
	}
	var b strings.Builder
	if err := Describe(&b, pc, w); err != nil {
		t.Fatal(err)
	}
	want := `Pod: reviews-v1-abc.bookinfo
   Identity: spiffe://cluster.local/ns/bookinfo/sa/bookinfo-reviews
   Address: 10.0.0.5
   Labels: app=reviews,version=v1
--------------------
Service: reviews.bookinfo.svc.cluster.local
   Port: http 9080/HTTP targets pod port 9080
DestinationRule: bookinfo/reviews for "reviews.bookinfo.svc.cluster.local"
   Matching subsets: v1
      (Non-matching subsets v2)
   Traffic Policy TLS Mode: ISTIO_MUTUAL
VirtualService: bookinfo/reviews
   Reaches the pod: HTTP route #1: subset v1, weight 100
   Not to the pod: HTTP route #0 for header end-user: non-matching subset v2
--------------------
Effective PeerAuthentication:
   Workload mTLS mode: STRICT
Applied PeerAuthentication:
   bookinfo/default, istio-system/default
Applied AuthorizationPolicies:
   bookinfo/reviews-viewer (ALLOW)
Sidecar: none (the sidecar sees every service exported to its namespace)
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestAPodNoRouteReachesIsWarnedAbout(t *testing.T) {
	pc := push(t)
	w, ok := FindWorkload(pc, "reviews-v3-xyz", "bookinfo")
	if !ok {
		t.Fatal("the pod is not found among the endpoints")
	}
	var b strings.Builder
	if err := Describe(&b, pc, w); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"   No matching subsets (the DestinationRule has v1,v2)\n",
		"   WARNING: No destinations match pod subsets (checked 2 HTTP/TCP routes)\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in\n%s", want, b.String())
		}
	}
	if _, ok := FindWorkload(pc, "nobody", "bookinfo"); ok {
		t.Error("a pod that is no endpoint is found")
	}
}
