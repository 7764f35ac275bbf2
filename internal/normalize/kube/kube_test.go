package kube

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/golden"
)

var update = flag.Bool("update", false, "rewrite golden files")

// kubeObjects decodes a multi-document file of core Kubernetes objects.
func kubeObjects(t *testing.T, path string) (svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice, pods map[string]*corev1.Pod) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pods = map[string]*corev1.Pod{}
	dec := scheme.Codecs.UniversalDeserializer()
	for _, doc := range strings.Split(string(data), "\n---\n") {
		obj, _, err := dec.Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch o := obj.(type) {
		case *corev1.Service:
			svcs = append(svcs, o)
		case *discoveryv1.EndpointSlice:
			slices = append(slices, o)
		case *corev1.Pod:
			pods[o.Namespace+"/"+o.Name] = o
		default:
			t.Fatalf("unexpected %T", obj)
		}
	}
	return svcs, slices, pods
}

func TestKubernetesGoldens(t *testing.T) {
	cases, err := filepath.Glob("testdata/kubernetes-*/input.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range cases {
		dir := filepath.Dir(in)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			svcs, slices, pods := kubeObjects(t, in)
			lookup := func(ns, name string) *corev1.Pod { return pods[ns+"/"+name] }
			var got []proto.Message
			for _, s := range svcs {
				got = append(got, Service(s, "cluster.local", "Kubernetes"))
				if s.Spec.Type == corev1.ServiceTypeExternalName {
					got = append(got, ExternalNameEndpoints(s, "cluster.local"))
				}
			}
			for _, sl := range slices {
				set, svc, ok := EndpointSlice(sl, lookup, "cluster.local")
				if !ok {
					continue
				}
				if svc == "" {
					t.Fatal("no service name")
				}
				got = append(got, set)
			}
			golden.Check(t, filepath.Join(dir, "want.golden.json"), golden.JSON(t, got), *update)
		})
	}
}
