package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

type analyzeMessage struct {
	Code, Severity, Kind, Object, Path, Origin, Message string
}

func analyzeJSON(t *testing.T, out string) []analyzeMessage {
	t.Helper()
	var msgs []analyzeMessage
	if err := json.Unmarshal([]byte(out), &msgs); err != nil {
		t.Fatalf("analyze -o json: %v\n%s", err, out)
	}
	return msgs
}

// TestAnalyzeLiveReadsGalleyAndOverlaysLocalFiles: galley (file mode) as
// a process serving a ServiceEntry with v1 and v2 endpoints and the
// routing between them; `flotilla analyze --live` reads it over MCP as
// discovery does and finds nothing wrong. A local DestinationRule overlaid
// on it (same name, one more subset) is analyzed instead of galley's, with
// its file and line; a local VirtualService naming a host galley does not
// have is found too. galley itself is unchanged. A galley that is not
// there is an error (exit 1), not a finding.
func TestAnalyzeLiveReadsGalleyAndOverlaysLocalFiles(t *testing.T) {
	dir := t.TempDir()
	xdstest.WriteFile(t, dir, "backend.yaml", xdstest.Backend(xdstest.Endpoint(18080, "v1"), xdstest.Endpoint(18081, "v2")))
	xdstest.WriteFile(t, dir, "routing.yaml", xdstest.Routing(90, 10))
	mcp, admin := proc.FreeAddr(t), proc.FreeAddr(t)
	proc.Start(t, "galley", filepath.Join(binDir, "flotilla-galley"), "--config-dir", dir, "--mcp-address", mcp, "--admin-address", admin)
	proc.WaitReady(t, "http://"+admin+"/readyz")
	live := []string{"analyze", "--live", "--galley-address", mcp, "--plaintext", "-o", "json"}

	code, out, stderr := flotilla(t, "", live...)
	if msgs := analyzeJSON(t, out); code != 0 || len(msgs) != 0 {
		t.Fatalf("galley's own configuration: exit %d, messages %+v (stderr %s): want none", code, msgs, stderr)
	}

	local := t.TempDir()
	xdstest.WriteFile(t, local, "dr.yaml", `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: backend-dr}
spec:
  host: backend-service
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
  - {name: v3, labels: {version: v3}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: elsewhere}
spec:
  hosts: [elsewhere]
  http:
  - route:
    - destination: {host: nowhere.default.svc.cluster.local}
`)
	code, out, _ = flotilla(t, "", append(live, "-f", local)...)
	msgs := analyzeJSON(t, out)
	var got []string
	for _, m := range msgs {
		got = append(got, m.Code+" "+m.Kind+" "+m.Object+" "+filepath.Base(m.Origin))
	}
	want := []string{
		"FLT0203 DestinationRule default/backend-dr dr.yaml:9",
		"FLT0201 VirtualService default/elsewhere dr.yaml:18",
	}
	if code != 79 || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("overlaid: exit %d, messages\n  %s\nwant exit 79 and\n  %s", code, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	// galley still serves its own: the overlay was the CLI's alone.
	if code, out, _ := flotilla(t, "", live...); code != 0 || len(analyzeJSON(t, out)) != 0 {
		t.Errorf("after the overlay, galley's configuration: exit %d, %s", code, out)
	}

	// A file galley refuses: --live lists the object it refuses, and why.
	xdstest.WriteFile(t, dir, "broken.yaml", "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: broken}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}, weight: -5}]}]}\n")
	var refused []string
	for range 50 {
		code, out, _ = flotilla(t, "", live...)
		refused = nil
		for _, m := range analyzeJSON(t, out) {
			if strings.Contains(m.Message, "galley refuses") {
				refused = append(refused, m.Code+" "+m.Kind+" "+m.Object)
			}
		}
		if len(refused) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code != 79 || strings.Join(refused, "\n") != "FLT0101 VirtualService default/broken" {
		t.Errorf("a refused file: exit %d, refusals %q", code, refused)
	}

	code, _, stderr = flotilla(t, "", "analyze", "--live", "--galley-address", proc.FreeAddr(t), "--plaintext", "--timeout", "2s")
	if code != 1 || !strings.Contains(stderr, "galley answered 0 of") {
		t.Errorf("no galley: exit %d, stderr %q: want 1 and the reason", code, stderr)
	}
}
