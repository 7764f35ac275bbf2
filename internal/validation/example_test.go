package validation

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// The Telemetry example README points to is valid, and the mesh
// configuration beside it parses.
func TestTheTelemetryExampleIsValid(t *testing.T) {
	dir := filepath.Join("..", "..", "examples", "telemetry")
	data, err := os.ReadFile(filepath.Join(dir, "telemetry.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := istio.Decode("telemetry.yaml", data, "default")
	if len(docs) != 1 {
		t.Fatalf("%d documents, want 1", len(docs))
	}
	if docs[0].Err != nil {
		t.Fatal(docs[0].Err)
	}
	if r := Validate(docs[0].Object, nil); !r.OK() || len(r.Warnings) > 0 {
		t.Fatalf("errors %v, warnings %v", r.Errors, r.Warnings)
	}
	mesh, err := istio.ReadMeshConfig(filepath.Join(dir, "mesh.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if mesh.GetExtensionProviders()[len(mesh.GetExtensionProviders())-1].GetName() != "otel" {
		t.Fatalf("providers %v", mesh.GetExtensionProviders())
	}
}
