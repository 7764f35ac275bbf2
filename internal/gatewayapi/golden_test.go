package gatewayapi_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi/gatewayapitest"
	"github.com/flotilla-mesh/flotilla/internal/textdiff"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// now is when the conversion runs in the goldens.
var now = metav1.NewTime(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))

// TestGolden converts each testdata/<case>.yaml (Gateway API objects and
// the cluster around them) and compares the Istio objects with
// <case>.golden.yaml and the status with <case>.status.golden.yaml. Each
// case names, in its first comment, the Istio 1.32 function whose
// behaviour it pins.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cases []string
	for _, f := range files {
		if !strings.HasSuffix(f, ".golden.yaml") {
			cases = append(cases, strings.TrimSuffix(f, ".yaml"))
		}
	}
	if len(cases) == 0 {
		t.Fatal("no cases in testdata")
	}
	for _, c := range cases {
		t.Run(filepath.Base(c), func(t *testing.T) {
			data, err := os.ReadFile(c + ".yaml")
			if err != nil {
				t.Fatal(err)
			}
			in := decodeInput(t, data)
			out := gatewayapi.Convert(in)
			golden(t, c+".golden.yaml", objectsYAML(t, out))
			golden(t, c+".status.golden.yaml", statusYAML(t, out))
		})
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o600); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run with -update to rewrite it):\n%s", path, textdiff.Diff(string(want), string(got)))
	}
}

func decodeInput(t *testing.T, data []byte) gatewayapi.Input {
	t.Helper()
	cl := gatewayapitest.NewCluster("cluster.local")
	in := gatewayapitest.Input(cl)
	in.Now = now
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatal(err)
		}
		into := func(v any) {
			if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
				t.Fatalf("%s: %v", tm.Kind, err)
			}
		}
		if ok, err := in.AddYAML([]byte(doc)); err != nil {
			t.Fatal(err)
		} else if ok {
			continue
		}
		switch tm.Kind {
		case "":
		case "Namespace":
			var o corev1.Namespace
			into(&o)
			cl.NamespaceSet[o.Name] = o.Labels
		case "Service":
			var o corev1.Service
			into(&o)
			s := &gatewayapi.Service{
				Labels: o.Labels, LoadBalancer: o.Spec.Type == corev1.ServiceTypeLoadBalancer,
				ReadyPorts: map[int32]bool{}, TargetPorts: map[int32][]int32{}, PortNames: map[string]int32{},
			}
			if o.Spec.ClusterIP != "" {
				s.ClusterIPs = []string{o.Spec.ClusterIP}
			}
			for _, in := range o.Status.LoadBalancer.Ingress {
				s.External = append(s.External, in.IP+in.Hostname)
			}
			for _, p := range o.Spec.Ports {
				s.Ports = append(s.Ports, p.Port)
				s.PortNames[p.Name] = p.Port
				s.ReadyPorts[p.Port] = true
				tp := p.Port
				if p.TargetPort.IntVal != 0 {
					tp = p.TargetPort.IntVal
				}
				s.TargetPorts[p.Port] = []int32{tp}
			}
			cl.Services[o.Namespace+"/"+o.Name] = s
		case "ServiceEntry":
			var o struct {
				metav1.TypeMeta `json:",inline"`
				Metadata        metav1.ObjectMeta `json:"metadata"`
				Spec            struct {
					Hosts []string `json:"hosts"`
					Ports []struct {
						Name   string `json:"name"`
						Number uint32 `json:"number"`
					} `json:"ports"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
				t.Fatal(err)
			}
			key := o.Metadata.Namespace + "/" + o.Metadata.Name
			cl.Entries[key] = o.Spec.Hosts
			cl.EntryPorts[key] = map[string]uint32{}
			for _, p := range o.Spec.Ports {
				cl.EntryPorts[key][p.Name] = p.Number
			}
		case "Secret":
			var o corev1.Secret
			into(&o)
			d := o.Data
			if d == nil {
				d = map[string][]byte{}
			}
			for k, v := range o.StringData {
				d[k] = []byte(v)
			}
			cl.Secrets[o.Namespace+"/"+o.Name] = d
		case "ConfigMap":
			var o corev1.ConfigMap
			into(&o)
			cl.ConfigMaps[o.Namespace+"/"+o.Name] = o.Data
		default:
			t.Fatalf("unknown kind %q", tm.Kind)
		}
	}
	return in
}

func objectsYAML(t *testing.T, out *gatewayapi.Output) []byte {
	t.Helper()
	var b bytes.Buffer
	for i, o := range out.Objects {
		spec, err := protojson.Marshal(o.Spec)
		if err != nil {
			t.Fatal(err)
		}
		doc := map[string]any{
			"apiVersion": o.Kind.APIVersion(), "kind": o.Kind.Kind,
			"metadata": map[string]any{"name": o.Meta.Name, "namespace": o.Meta.Namespace, "annotations": o.Meta.Annotations},
			"spec":     jsonRaw(spec),
		}
		y, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
	// The ConfigMap CA certificates galley publishes beside them.
	if len(out.ConfigMapCAs) > 0 {
		cas := map[string]string{}
		for k, v := range out.ConfigMapCAs {
			cas[k] = string(v)
		}
		y, err := yaml.Marshal(map[string]any{"configMapCAs": cas})
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.Bytes()
}

type jsonRaw []byte

func (j jsonRaw) MarshalJSON() ([]byte, error) { return j, nil }

func statusYAML(t *testing.T, out *gatewayapi.Output) []byte {
	t.Helper()
	type entry struct {
		Kind      string `json:"kind"`
		Namespace string `json:"namespace,omitempty"`
		Name      string `json:"name"`
		Status    any    `json:"status"`
	}
	var entries []entry
	for name, st := range out.GatewayClasses {
		entries = append(entries, entry{Kind: gatewayapi.KindGatewayClass, Name: name, Status: st})
	}
	for ref, st := range out.Gateways {
		entries = append(entries, entry{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name, Status: st})
	}
	for ref, st := range out.Routes {
		entries = append(entries, entry{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name, Status: st})
	}
	for ref, st := range out.Policies {
		entries = append(entries, entry{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name, Status: st})
	}
	for ref, st := range out.ListenerSets {
		entries = append(entries, entry{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name, Status: st})
	}
	slices.SortFunc(entries, func(a, b entry) int {
		return strings.Compare(a.Kind+"/"+a.Namespace+"/"+a.Name, b.Kind+"/"+b.Namespace+"/"+b.Name)
	})
	var b bytes.Buffer
	for i, e := range entries {
		y, err := yaml.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
	return b.Bytes()
}
