package contract_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// The registry contract is spoken between separately deployed services of
// different versions during a rolling upgrade, so its wire encoding must not
// change by accident: renumbering a field or changing its type would make an
// old discovery misread a new galley. These goldens pin the binary and JSON
// encodings of fully populated messages; a deliberate change updates them
// with -update and says so in review.

func fullService() *registryv1.Service {
	return &registryv1.Service{
		Hostname:  "reviews.bookinfo.svc.cluster.local",
		Name:      "reviews",
		Namespace: "bookinfo",
		Ports: []*registryv1.ServicePort{
			{Name: "http", Number: 9080, Protocol: registryv1.Protocol_PROTOCOL_HTTP, TargetPort: 9080},
			{Name: "grpc-admin", Number: 9090, Protocol: registryv1.Protocol_PROTOCOL_GRPC, TargetPort: 19090},
		},
		Addresses:       []string{"10.96.0.12", "fd00::12"},
		Labels:          map[string]string{"app": "reviews"},
		ExportTo:        []string{"*"},
		Resolution:      registryv1.Resolution_RESOLUTION_STATIC,
		SourceKind:      registryv1.SourceKind_SOURCE_KIND_KUBERNETES_SERVICE,
		Selector:        map[string]string{"app": "reviews"},
		Location:        registryv1.Location_LOCATION_MESH_INTERNAL,
		ClusterId:       "Kubernetes",
		SubjectAltNames: []string{"spiffe://cluster.local/ns/bookinfo/sa/reviews"},
	}
}

func fullEndpointSet() *registryv1.EndpointSet {
	return &registryv1.EndpointSet{
		ServiceHostname:  "reviews.bookinfo.svc.cluster.local",
		ServiceNamespace: "bookinfo",
		Shard:            "reviews-abcde",
		Endpoints: []*registryv1.Endpoint{{
			Address:           "10.1.1.7",
			Ports:             []*registryv1.EndpointPort{{ServicePortName: "http", Number: 9080}},
			Labels:            map[string]string{"app": "reviews", "version": "v2"},
			ServiceAccount:    "bookinfo-reviews",
			Locality:          &registryv1.Locality{Region: "us-east1", Zone: "us-east1-b", Subzone: "rack7"},
			Network:           "network-1",
			Health:            registryv1.HealthStatus_HEALTH_STATUS_HEALTHY,
			Weight:            2,
			WorkloadName:      "reviews-v2-7d9f-abcde",
			WorkloadNamespace: "bookinfo",
			NodeName:          "node-3",
			TlsMode:           registryv1.TLSMode_TLS_MODE_ISTIO,
		}},
	}
}

func TestWireEncodingOfTheRegistryContractIsStable(t *testing.T) {
	for name, msg := range map[string]proto.Message{"service": fullService(), "endpointset": fullEndpointSet()} {
		t.Run(name, func(t *testing.T) {
			bin, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			js, err := protojson.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			var ind bytes.Buffer
			if err := json.Indent(&ind, js, "", "  "); err != nil {
				t.Fatal(err)
			}
			got := hex.EncodeToString(bin) + "\n" + ind.String() + "\n"
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if got != string(want) {
				t.Fatalf("encoding of %s changed; if deliberate, rerun with -update.\ngot:\n%s\nwant:\n%s", name, got, want)
			}

			back := msg.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(bin, back); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(msg, back) {
				t.Fatal("round trip changed the message")
			}
		})
	}
}

func FuzzDecodeEndpointSet(f *testing.F) {
	seed, err := proto.Marshal(fullEndpointSet())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		var es registryv1.EndpointSet
		if err := proto.Unmarshal(data, &es); err != nil {
			return
		}
		// Whatever decodes must re-encode and decode to an equal message.
		again, err := proto.Marshal(&es)
		if err != nil {
			t.Fatal(err)
		}
		var es2 registryv1.EndpointSet
		if err := proto.Unmarshal(again, &es2); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&es, &es2) {
			t.Fatal("re-encoding changed the message")
		}
	})
}
