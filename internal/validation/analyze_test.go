package validation_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// world is a Kubernetes Service "web" in namespace app (selector app=web,
// port 8080 "http") with one workload (app=web, version=v1), plus objs.
func world(t *testing.T, yaml string) validation.Input {
	t.Helper()
	var objs []*istio.Object
	for _, d := range istio.Decode("test.yaml", []byte(yaml), "app") {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
		objs = append(objs, d.Object)
	}
	return validation.Input{
		Objects: objs,
		Services: []*registryv1.Service{{
			Hostname: "web.app.svc.cluster.local", Name: "web", Namespace: "app", Selector: map[string]string{"app": "web"},
			SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE, Location: registryv1.Location_LOCATION_MESH_INTERNAL,
			Ports: []*registryv1.ServicePort{{Name: "http", Number: 8080, TargetPort: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP}},
		}},
		Workloads:    []validation.Workload{{Kind: "Pod", Namespace: "app", Name: "web-0", Labels: map[string]string{"app": "web", "version": "v1"}}},
		HaveServices: true, HaveWorkloads: true,
	}
}

func messages(in validation.Input) []string {
	var out []string
	for _, m := range validation.Analyze(in) {
		out = append(out, fmt.Sprintf("%s %s %s", m.Code, m.Object, m.Path))
	}
	return out
}

func TestAnalyzeFollowsIstiosResolutionOfNamesAndScopes(t *testing.T) {
	for name, c := range map[string]struct {
		yaml     string
		exportTo []string // the Service's
		want     []string
	}{
		"a Service exported to its own namespace only is hidden from the others": {
			yaml: `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: other}
spec: {hosts: [x], http: [{route: [{destination: {host: web.app.svc.cluster.local}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: app}
spec: {hosts: [x], http: [{route: [{destination: {host: web.app.svc.cluster.local}}]}]}
`,
			exportTo: []string{"."},
			want:     []string{"FLT0201 VirtualService other/vs spec.http[0].route[0].destination.host"},
		},
		"gateways named ns/name, by a name in the own namespace and as name.ns.svc.<suffix> all resolve": {
			yaml: `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: app}
spec: {selector: {app: web}, servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["*"]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: app}
spec: {hosts: [web], gateways: [mesh, gw, app/gw, gw.app.svc.cluster.local, other/gw], http: [{route: [{destination: {host: web}}]}]}
`,
			want: []string{"FLT0202 VirtualService app/vs spec.gateways[4]"},
		},
		"a short host is the VirtualService's namespace's": {
			yaml: `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: other}
spec: {hosts: [x], http: [{match: [{uri: {prefix: /a}}], route: [{destination: {host: web}}]}, {route: [{destination: {host: web.app.svc.cluster.local}}]}]}
`,
			want: []string{"FLT0201 VirtualService other/vs spec.http[0].route[0].destination.host"},
		},
		"a ServiceEntry's wildcard host covers the names under it": {
			yaml: `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: app}
spec: {hosts: ["*.example.com"], ports: [{number: 443, name: tls, protocol: TLS}], resolution: NONE, location: MESH_EXTERNAL}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: app}
spec: {hosts: [api.example.com], tls: [{match: [{sniHosts: [api.example.com]}], route: [{destination: {host: api.example.com}}]}]}
`,
		},
		"a policy of the root namespace selects workloads of every namespace": {
			yaml: `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: root, namespace: istio-system}
spec: {selector: {matchLabels: {app: web}}, action: DENY, rules: [{to: [{operation: {paths: ["/admin"]}}]}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: elsewhere, namespace: other}
spec: {selector: {matchLabels: {app: web}}, action: DENY, rules: [{to: [{operation: {paths: ["/admin"]}}]}]}
`,
			want: []string{"FLT0210 AuthorizationPolicy other/elsewhere spec.selector.matchLabels"},
		},
		"a PeerAuthentication of the root namespace selects only there": {
			yaml: `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: web, namespace: istio-system}
spec: {selector: {matchLabels: {app: web}}, mtls: {mode: STRICT}}
`,
			want: []string{"FLT0210 PeerAuthentication istio-system/web spec.selector.matchLabels"},
		},
		"a workload's PERMISSIVE PeerAuthentication beats its namespace's STRICT; ISTIO_MUTUAL never conflicts": {
			yaml: `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: app}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: web, namespace: app}
spec: {selector: {matchLabels: {app: web}}, mtls: {mode: PERMISSIVE}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: web, namespace: app}
spec: {host: web, trafficPolicy: {tls: {mode: DISABLE}}}
`,
		},
		"UNSET inherits the namespace's STRICT, and a port-level setting is checked against its port": {
			yaml: `apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: web, namespace: app}
spec: {selector: {matchLabels: {app: web}}, mtls: {mode: UNSET}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: web, namespace: app}
spec: {host: web, trafficPolicy: {tls: {mode: ISTIO_MUTUAL}, portLevelSettings: [{port: {number: 8080}, tls: {mode: SIMPLE}}]}}
`,
			want: []string{"FLT0212 DestinationRule app/web spec.trafficPolicy.portLevelSettings[0].tls", "FLT0206 DestinationRule app/web spec.trafficPolicy.portLevelSettings[0].tls.mode"},
		},
		"Sidecar egress: */*, ~/* and hosts that match something import as meant": {
			yaml: `apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: app}
spec: {egress: [{hosts: ["*/*", "~/*", "./*", "app/web.app.svc.cluster.local", "*/web.app.svc.cluster.local", "other/*"]}]}
`,
			want: []string{"FLT0205 Sidecar app/default spec.egress[0].hosts[5]"},
		},
		"a subset of a Service is its selector and the subset's labels": {
			yaml: `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: web, namespace: app}
spec: {host: web, subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]}
`,
			want: []string{"FLT0203 DestinationRule app/web spec.subsets[1].labels"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := messages(world(t, c.yaml))
			if c.exportTo != nil {
				in := world(t, c.yaml)
				in.Services[0].ExportTo = c.exportTo
				got = messages(in)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("messages\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
			}
		})
	}
}

func TestTheWorkloadsOfAServiceWithoutSelectorAreItsOwnEndpoints(t *testing.T) {
	in := world(t, `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: db, namespace: app}
spec: {host: db, subsets: [{name: v1, labels: {version: v1}}]}
`)
	in.Services = append(in.Services, &registryv1.Service{
		Hostname: "db.app.svc.cluster.local", Name: "db", Namespace: "app",
		SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE, Location: registryv1.Location_LOCATION_MESH_INTERNAL,
		Ports: []*registryv1.ServicePort{{Name: "tcp", Number: 5432, TargetPort: 5432, Protocol: registryv1.Protocol_PROTOCOL_TCP}},
	})
	// web's endpoint (version v1) is in the same namespace: it is not db's.
	in.Endpoints = []*registryv1.EndpointSet{
		{ServiceHostname: "web.app.svc.cluster.local", ServiceNamespace: "app", Shard: "web", Endpoints: []*registryv1.Endpoint{{Address: "10.0.0.1", Labels: map[string]string{"app": "web", "version": "v1"}}}},
		{ServiceHostname: "db.app.svc.cluster.local", ServiceNamespace: "app", Shard: "db", Endpoints: []*registryv1.Endpoint{{Address: "10.0.0.2", Labels: map[string]string{"version": "v0"}}}},
	}
	want := []string{"FLT0203 DestinationRule app/db spec.subsets[0].labels"}
	if got := messages(in); !slices.Equal(got, want) {
		t.Errorf("messages %q, want %q", got, want)
	}
	in.Endpoints[1].Endpoints[0].Labels["version"] = "v1"
	if got := messages(in); len(got) != 0 {
		t.Errorf("with db's own endpoint at v1: messages %q, want none", got)
	}
}

func TestAnalyzeSkipsWhatItCannotKnowAndSaysSo(t *testing.T) {
	in := world(t, `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs, namespace: app}
spec: {hosts: [web], http: [{route: [{destination: {host: nowhere}}]}]}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: web, namespace: app}
spec: {host: web, subsets: [{name: v9, labels: {version: v9}}]}
`)
	in.HaveServices, in.HaveWorkloads = false, false
	got := messages(in)
	want := []string{"FLT0001 Analysis ", "FLT0001 Analysis "}
	if !slices.Equal(got, want) {
		t.Errorf("messages %q, want only the two notes", got)
	}
}

func TestEveryCodeHasANameASeverityAndAMeaning(t *testing.T) {
	seen := map[validation.Code]bool{}
	for _, c := range validation.Codes() {
		if seen[c.Code] || c.Name == "" || c.Meaning == "" || c.Severity < validation.SeverityInfo || c.Severity > validation.SeverityError {
			t.Errorf("%+v: duplicate or incomplete", c)
		}
		seen[c.Code] = true
		if s, err := validation.ParseSeverity(strings.ToUpper(c.Severity.String())); err != nil || s != c.Severity {
			t.Errorf("ParseSeverity(%s) = %v, %v", c.Severity, s, err)
		}
	}
	if validation.Code("FLT9999").Severity() != validation.SeverityError {
		t.Error("an unknown code is not an error")
	}
}

// Galley's internal annotations are refused on what a user writes, but
// not on what galley serves already (analyze --live reads its generated
// Gateways, which carry them).
func TestGalleysInternalAnnotationsAreRefusedOnlyOnWhatAUserWrites(t *testing.T) {
	in := world(t, `apiVersion: networking.istio.io/v1
kind: Gateway
metadata:
  name: gw
  annotations: {internal.flotilla.io/granted-credentials: "kubernetes-gateway://certs/shared"}
spec:
  selector: {app: web}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
`)
	want := "FLT0101 Gateway app/gw metadata.annotations"
	if got := messages(in); !slices.Contains(got, want) {
		t.Errorf("written by a user: %q, want %q", got, want)
	}
	in.Admitted = map[istio.ID]bool{in.Objects[0].ID(): true}
	if got := messages(in); slices.Contains(got, want) {
		t.Errorf("served by galley: %q, want no %q", got, want)
	}
}

// The shipped demo (examples/greeter.yaml and mesh-policy.yaml, what
// make run serves) analyzes clean, as analyze --live sees it: its
// workloads are the ServiceEntry's inline endpoints, whose labels the
// AuthorizationPolicy's selector matches.
func TestTheShippedDemoAnalyzesClean(t *testing.T) {
	var objs []*istio.Object
	for _, f := range []string{"../../examples/greeter.yaml", "../../examples/mesh-policy.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range istio.Decode(f, data, "default") {
			if d.Err != nil {
				t.Fatal(d.Err)
			}
			objs = append(objs, d.Object)
		}
	}
	if got := messages(validation.Input{Objects: objs, HaveServices: true, HaveWorkloads: true}); len(got) != 0 {
		t.Fatalf("the demo analyzes with %q", got)
	}
}

// Istio's CaCertificateAnalyzer, ProtocolAddressesAnalyzer and
// DefaultSelectorAnalyzer, each case as Istio decides it.
func TestTheCertificateAddressAndTelemetryAnalyzersDecideAsIstios(t *testing.T) {
	for name, c := range map[string]struct {
		yaml string
		want []string
		// only, when set, is the code under test: the others the
		// input gives (a selector matching nothing, say) are left out.
		only string
	}{
		"SIMPLE and MUTUAL without caCertificates, for the host and a port; ISTIO_MUTUAL and a CA are fine": {
			yaml: `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: simple, namespace: app}
spec:
  host: web
  trafficPolicy:
    tls: {mode: SIMPLE}
    portLevelSettings:
    - {port: {number: 8080}, tls: {mode: MUTUAL, clientCertificate: /c.pem, privateKey: /k.pem}}
    - {port: {number: 9090}, tls: {mode: SIMPLE, caCertificates: /ca.pem}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: mesh, namespace: app}
spec: {host: web.app.svc.cluster.local, exportTo: ["."], trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}}
`,
			want: []string{
				"FLT0204 DestinationRule app/simple spec.host",
				"FLT0212 DestinationRule app/simple spec.trafficPolicy.portLevelSettings[0].tls",
				"FLT0212 DestinationRule app/simple spec.trafficPolicy.tls",
			},
		},
		"a credentialName counts only with a workload selector, as Istio's": {
			yaml: `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: gw-origination, namespace: app}
spec: {host: web, workloadSelector: {matchLabels: {app: web}}, trafficPolicy: {tls: {mode: SIMPLE, credentialName: web-ca}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: everywhere, namespace: app}
spec: {host: web, trafficPolicy: {tls: {mode: SIMPLE, credentialName: web-ca}}}
`,
			want: []string{"FLT0212 DestinationRule app/everywhere spec.trafficPolicy.tls"},
		},
		"a ServiceEntry without addresses: its TCP and unset ports, not its HTTP one, nor one with addresses allocated": {
			yaml: `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: app}
spec:
  hosts: [db.example.com]
  resolution: DNS
  ports:
  - {number: 5432, name: pg, protocol: TCP}
  - {number: 80, name: http, protocol: HTTP}
  - {number: 6379, name: redis}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: addressed, namespace: app}
spec: {hosts: [cache.example.com], addresses: [240.0.0.1], resolution: DNS, ports: [{number: 5432, name: pg, protocol: TCP}]}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: allocated, namespace: app}
spec: {hosts: [mq.example.com], resolution: DNS, ports: [{number: 5672, name: amqp, protocol: TCP}]}
status: {addresses: [{host: mq.example.com, value: 240.240.0.1}]}
`,
			want: []string{"FLT0213 ServiceEntry app/db spec.ports[0]", "FLT0213 ServiceEntry app/db spec.ports[2]"},
		},
		"two namespace-wide Telemetries conflict; a selector or targetRefs does not": {
			yaml: `apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: a, namespace: app}
spec: {accessLogging: [{providers: [{name: envoy}]}]}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: b, namespace: app}
spec: {tracing: [{randomSamplingPercentage: 10}]}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: web-only, namespace: app}
spec: {selector: {matchLabels: {app: web}}, tracing: [{randomSamplingPercentage: 50}]}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: a, namespace: other}
spec: {tracing: [{randomSamplingPercentage: 1}]}
`,
			want: []string{"FLT0214 Telemetry app/a ", "FLT0214 Telemetry app/b "},
		},
		"two sidecar VirtualServices for one host conflict; exported apart, or bound to a gateway, they do not": {
			yaml: `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: a, namespace: app}
spec: {hosts: [web], http: [{route: [{destination: {host: web}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: b, namespace: app}
spec: {hosts: [web.app.svc.cluster.local], gateways: [mesh], http: [{route: [{destination: {host: web}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: only-here, namespace: other}
spec: {hosts: [web.app.svc.cluster.local], exportTo: ["."], http: [{route: [{destination: {host: web.app.svc.cluster.local}}]}]}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: app}
spec: {selector: {app: web}, servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["app/web.app.svc.cluster.local"]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: at-gateway, namespace: app}
spec: {hosts: [web.app.svc.cluster.local], gateways: [gw], http: [{route: [{destination: {host: web}}]}]}
`,
			// only-here is exported to other alone, where a and b (exported
			// everywhere) also apply: it conflicts with both, as Istio's.
			want: []string{"FLT0215 VirtualService app/a spec.hosts", "FLT0215 VirtualService app/b spec.hosts", "FLT0215 VirtualService other/only-here spec.hosts"},
		},
		"Gateways on the same workloads, port and host conflict; another bind or selector does not": {
			yaml: `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: one, namespace: app}
spec: {selector: {app: web}, servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["*/shop.example.com"]}]}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: two, namespace: app}
spec: {selector: {app: web, version: v1}, servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["*/shop.example.com"]}]}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: bound, namespace: app}
spec: {selector: {app: web}, servers: [{port: {number: 8080, name: http, protocol: HTTP}, bind: 10.0.0.1, hosts: ["*/shop.example.com"]}]}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: elsewhere, namespace: app}
spec: {selector: {app: api}, servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["*/shop.example.com"]}]}
`,
			want: []string{"FLT0207 Gateway app/elsewhere spec.selector", "FLT0216 Gateway app/one spec.servers[0]", "FLT0216 Gateway app/two spec.servers[0]"},
		},
		"JWT claim routing through a gateway without a RequestAuthentication for its pods": {
			yaml: `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: app}
spec: {selector: {app: web}, servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["*/shop.example.com"]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: claims, namespace: app}
spec: {hosts: [shop.example.com], gateways: [gw], http: [{match: [{headers: {"@request.auth.claims.group": {exact: admin}}}], route: [{destination: {host: web}}]}, {route: [{destination: {host: web}}]}]}
`,
			want: []string{"FLT0218 VirtualService app/claims spec.gateways[0]"},
		},
		"JWT claim routing through a gateway whose pods a RequestAuthentication verifies": {
			yaml: `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: app}
spec: {selector: {app: web}, servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["*/shop.example.com"]}]}
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: tokens, namespace: istio-system}
spec: {jwtRules: [{issuer: https://accounts.example.com}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: claims, namespace: app}
spec: {hosts: [shop.example.com], gateways: [gw], http: [{match: [{headers: {"@request.auth.claims.group": {exact: admin}}}], route: [{destination: {host: web}}]}, {route: [{destination: {host: web}}]}]}
`,
		},
		"two Sidecars for one workload, two without selectors; Telemetries for one workload; access logging without a provider": {
			yaml: `apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: web-a, namespace: app}
spec: {workloadSelector: {labels: {app: web}}, egress: [{hosts: ["./*"]}]}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: web-b, namespace: app}
spec: {workloadSelector: {labels: {version: v1}}, egress: [{hosts: ["./*"]}]}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: app}
spec: {egress: [{hosts: ["./*"]}]}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default-too, namespace: app}
spec: {egress: [{hosts: ["app/*"]}]}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: t1, namespace: app}
spec: {selector: {matchLabels: {app: web}}, tracing: [{randomSamplingPercentage: 10}]}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: t2, namespace: app}
spec: {selector: {matchLabels: {version: v1}}, accessLogging: [{filter: {expression: "response.code >= 400"}}]}
`,
			want: []string{
				"FLT0220 Sidecar app/default ", "FLT0220 Sidecar app/default-too ",
				"FLT0219 Sidecar app/web-a spec", "FLT0219 Sidecar app/web-b spec",
				"FLT0221 Telemetry app/t1 spec", "FLT0221 Telemetry app/t2 spec", "FLT0222 Telemetry app/t2 spec.accessLogging[0]",
			},
		},
		"two ServiceEntries give one host and port two protocols; exported apart they do not": {
			yaml: `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api-http, namespace: app}
spec: {hosts: [api.example.com], location: MESH_EXTERNAL, resolution: DNS, ports: [{number: 443, name: https, protocol: HTTPS}]}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api-tls, namespace: other}
spec: {hosts: [api.example.com], location: MESH_EXTERNAL, resolution: DNS, ports: [{number: 443, name: tls, protocol: TLS}]}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db-a, namespace: app}
spec: {hosts: [db.example.com], exportTo: ["."], addresses: [240.0.0.9], location: MESH_EXTERNAL, resolution: DNS, ports: [{number: 5432, name: pg, protocol: TCP}]}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db-b, namespace: other}
spec: {hosts: [db.example.com], exportTo: ["."], location: MESH_EXTERNAL, resolution: DNS, ports: [{number: 5432, name: pg, protocol: HTTP}]}
`,
			want: []string{"FLT0223 ServiceEntry app/api-http spec.ports", "FLT0223 ServiceEntry other/api-tls spec.ports"},
		},
		"gateways on the same workloads serving one certificate, by credential or by files": {
			yaml: `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: shop, namespace: app}
spec:
  selector: {istio: ingress}
  servers:
  - {port: {number: 443, name: https, protocol: HTTPS}, hosts: [shop.example.com], tls: {mode: SIMPLE, credentialName: wildcard}}
  - {port: {number: 8443, name: https-files, protocol: HTTPS}, hosts: [shop.example.com], tls: {mode: SIMPLE, serverCertificate: /c.pem, privateKey: /k.pem}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: admin, namespace: app}
spec:
  selector: {istio: ingress, zone: a}
  servers:
  - {port: {number: 443, name: https, protocol: HTTPS}, hosts: [admin.example.com], tls: {mode: SIMPLE, credentialName: wildcard}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: files, namespace: app}
spec:
  selector: {istio: ingress}
  servers:
  - {port: {number: 443, name: https, protocol: HTTPS}, hosts: [files.example.com], tls: {mode: SIMPLE, serverCertificate: /c.pem, privateKey: /k.pem}}
  - {port: {number: 15443, name: tls, protocol: TLS}, hosts: ["*"], tls: {mode: ISTIO_MUTUAL}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: elsewhere, namespace: app}
spec:
  selector: {istio: egress}
  servers:
  - {port: {number: 443, name: https, protocol: HTTPS}, hosts: [out.example.com], tls: {mode: SIMPLE, credentialName: wildcard}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: mutual, namespace: app}
spec:
  selector: {istio: ingress}
  servers:
  - {port: {number: 15443, name: tls, protocol: TLS}, hosts: ["*"], tls: {mode: ISTIO_MUTUAL}}
`,
			want: []string{
				// admin's selector includes shop's, not the other way
				// round (Istio's getGatewaysWithSelector); elsewhere
				// selects other workloads; ISTIO_MUTUAL carries no
				// certificate of its own.
				"FLT0236 Gateway app/files spec.servers[0].tls",
				"FLT0236 Gateway app/shop spec.servers[0].tls",
				"FLT0236 Gateway app/shop spec.servers[1].tls",
			},
			only: "FLT0236",
		},
		"a gateway VirtualService routing a host another one routes by subset": {
			yaml: `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: canary, namespace: app}
spec: {hosts: [web], http: [{route: [{destination: {host: web, subset: v1}, weight: 90}, {destination: {host: web, subset: v2}, weight: 10}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ingress, namespace: app}
spec: {hosts: [web.example.com], gateways: [gw], http: [{route: [{destination: {host: web.app.svc.cluster.local}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ingress-v1, namespace: app}
spec: {hosts: [v1.example.com], gateways: [gw], http: [{route: [{destination: {host: web, subset: v1}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: mesh-only, namespace: app}
spec: {hosts: [web2], gateways: [mesh], http: [{route: [{destination: {host: web}}]}]}
`,
			want: []string{
				// ingress-v1 routes by subset itself; canary and
				// ingress-v1 subset web, named in one message.
				"FLT0237 VirtualService app/ingress spec.http[0].route[0].destination.host",
			},
			only: "FLT0237",
		},
		"a VirtualService bound to a Gateway that serves none of its hosts": {
			yaml: `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: gw, namespace: app}
spec: {selector: {app: web}, servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ["./*.example.com", "ops/admin.example.org"]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: served, namespace: app}
spec: {hosts: [shop.example.com], gateways: [gw], http: [{route: [{destination: {host: web}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: other-host, namespace: app}
spec: {hosts: [shop.example.org], gateways: [gw], http: [{route: [{destination: {host: web}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: not-for-app, namespace: app}
spec: {hosts: [admin.example.org], gateways: [app/gw], http: [{route: [{destination: {host: web.app.svc.cluster.local}}]}]}
`,
			want: []string{"FLT0217 VirtualService app/not-for-app spec.gateways[0]", "FLT0217 VirtualService app/other-host spec.gateways[0]"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := slices.DeleteFunc(messages(world(t, c.yaml)), func(m string) bool {
				if c.only != "" {
					return !strings.HasPrefix(m, c.only+" ")
				}
				return strings.HasPrefix(m, "FLT0210") || strings.HasPrefix(m, "FLT0211")
			})
			if !slices.Equal(got, c.want) {
				t.Errorf("messages\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
			}
		})
	}
}

func TestNamespacesInjectionLabelsAreCheckedAsIstiosInjectionAnalyzer(t *testing.T) {
	in := world(t, "")
	in.Workloads = append(in.Workloads,
		validation.Workload{Kind: "Pod", Namespace: "plain", Name: "p-0", Labels: map[string]string{"app": "p"}},
		validation.Workload{Kind: "Pod", Namespace: "kube-system", Name: "dns-0", Labels: map[string]string{"app": "dns"}},
	)
	in.Namespaces = map[string]map[string]string{
		"app":         {"istio-injection": "enabled", "istio.io/rev": "canary"},
		"plain":       {"team": "a"},
		"empty":       {},
		"canary":      {"istio.io/rev": "canary"},
		"kube-system": {},
	}
	if got, want := messages(in), []string{"FLT0224 Namespace app metadata.labels", "FLT0225 Namespace plain metadata.labels"}; !slices.Equal(got, want) {
		t.Errorf("messages\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// Istio's PortNameAnalyzer: an ExternalName Service's port that is
// unnamed for its protocol, or named tcp, is IST0150, not IST0118.
func TestAnExternalNameServicesPortsAreCheckedAsIstiosPortNameAnalyzer(t *testing.T) {
	in := world(t, "")
	in.Services = append(in.Services,
		&registryv1.Service{
			Hostname: "db.app.svc.cluster.local", Name: "db", Namespace: "app", Resolution: registryv1.Resolution_RESOLUTION_DNS,
			SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE, Location: registryv1.Location_LOCATION_MESH_INTERNAL,
			Ports: []*registryv1.ServicePort{
				{Name: "tcp", Number: 5432, Protocol: registryv1.Protocol_PROTOCOL_TCP},
				{Name: "db", Number: 5433},
				{Name: "http-api", Number: 8080, Protocol: registryv1.Protocol_PROTOCOL_HTTP},
				{Name: "tcp-raw", Number: 9000, Protocol: registryv1.Protocol_PROTOCOL_TCP},
			},
		},
		&registryv1.Service{
			Hostname: "plain.app.svc.cluster.local", Name: "plain", Namespace: "app",
			SourceKind: registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE, Location: registryv1.Location_LOCATION_MESH_INTERNAL,
			Ports: []*registryv1.ServicePort{{Name: "tcp", Number: 5432, Protocol: registryv1.Protocol_PROTOCOL_TCP}, {Name: "db", Number: 5433}},
		})
	var got []string
	for _, m := range validation.Analyze(in) {
		if m.Object.Kind == "Service" {
			got = append(got, fmt.Sprintf("%s %s %s", m.Code, m.Object, m.Text))
		}
	}
	want := []string{
		`FLT0209 Service app/plain port 5433 ("db") has no appProtocol and its name has no protocol prefix (http-, grpc-, tcp-, ...)`,
		`FLT0226 Service app/db port 5432 ("tcp") of an ExternalName Service: name it for its protocol (http-, tls-, ..., or set appProtocol): the proxies may not forward TCP traffic to it, or unmatched traffic on it, correctly`,
		`FLT0226 Service app/db port 5433 ("db") of an ExternalName Service: name it for its protocol (http-, tls-, ..., or set appProtocol): the proxies may not forward TCP traffic to it, or unmatched traffic on it, correctly`,
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("messages\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}
