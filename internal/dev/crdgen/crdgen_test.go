package crdgen

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

func TestTheCommittedManifestIsCurrent(t *testing.T) {
	want, err := YAML(All())
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../../deploy/helm/flotilla/crds/istio.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/helm/flotilla/crds/istio.yaml is stale: run `make generate`")
	}
}

// Every valid example survives a round trip through the real apiserver with
// the generated CRDs installed: nothing is pruned, nothing is rejected, and
// every served version reads it back.
func TestTheAPIServerAcceptsAndKeepsEveryFieldOfTheValidExamples(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if err := env.InstallCRDs(ctx, All()...); err != nil {
		t.Fatal(err)
	}
	ns, err := env.CreateNamespace(ctx, "crdgen")
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("../../validation/testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	chunks := strings.Split(string(data), "\n---\n")
	docs := istio.Decode("valid.yaml", data, ns)
	if len(docs) != len(chunks) {
		t.Fatalf("%d documents for %d chunks", len(docs), len(chunks))
	}
	for i, d := range docs {
		if d.Err != nil {
			t.Fatal(d.Err)
		}
		want := d.Object
		t.Run(want.Kind.Kind+"/"+want.Meta.Name, func(t *testing.T) {
			var u unstructured.Unstructured
			if err := sigsyaml.Unmarshal([]byte(chunks[i]), &u.Object); err != nil {
				t.Fatal(err)
			}
			u.SetNamespace(ns)
			for _, version := range want.Kind.Versions {
				gvr := schema.GroupVersionResource{Group: want.Kind.Group, Version: version, Resource: want.Kind.Plural}
				u.SetAPIVersion(want.Kind.Group + "/" + version)
				u.SetName(want.Meta.Name + "-" + version)
				if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, &u, metav1.CreateOptions{}); err != nil {
					t.Fatalf("create as %s: %v", version, err)
				}
				got, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, u.GetName(), metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				raw, err := json.Marshal(got.Object)
				if err != nil {
					t.Fatal(err)
				}
				back := istio.Decode("apiserver.json", raw, ns)
				if len(back) != 1 || back[0].Err != nil {
					t.Fatalf("read back as %s: %+v", version, back)
				}
				if d := cmp.Diff(want.Spec, back[0].Object.Spec, protocmp.Transform()); d != "" {
					t.Fatalf("the apiserver changed the spec stored as %s (-sent +read):\n%s", version, d)
				}
			}
		})
	}
}
