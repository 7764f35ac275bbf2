package cli_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
)

// holdingClient is a sidecar's clusters stream that ACKs every response
// until hold, then keeps the responses unacknowledged (a proxy stuck
// applying them) until release ACKs the last one.
type holdingClient struct {
	st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient

	mu      sync.Mutex
	holding bool
	held    *discoveryv3.DiscoveryResponse
	got     chan struct{}
}

func newHoldingClient(t *testing.T, addr, id string) *holdingClient {
	t.Helper()
	st := askClusters(t, addr, id)
	c := &holdingClient{st: st, got: make(chan struct{}, 16)}
	go func() {
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			c.mu.Lock()
			if c.holding {
				c.held = r
			} else {
				_ = st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()})
			}
			c.mu.Unlock()
			c.got <- struct{}{}
		}
	}()
	select {
	case <-c.got:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s got no clusters", id)
	}
	return c
}

func (c *holdingClient) hold() {
	c.mu.Lock()
	c.holding = true
	c.mu.Unlock()
}

// drain forgets the responses received so far; next waits for one more.
func (c *holdingClient) drain() {
	for {
		select {
		case <-c.got:
		default:
			return
		}
	}
}

func (c *holdingClient) next(t *testing.T) {
	t.Helper()
	select {
	case <-c.got:
	case <-time.After(30 * time.Second):
		t.Fatal("no response within 30s")
	}
}

// release ACKs the response held, and all that follow.
func (c *holdingClient) release(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holding = false
	if r := c.held; r != nil {
		if err := c.st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: r.GetTypeUrl(), ResponseNonce: r.GetNonce(), VersionInfo: r.GetVersionInfo()}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWaitReturnsOnlyAfterTheLastProxyHoldsTheChange: galley (files) and
// two replicas, a sidecar on each. A DestinationRule change (its
// clusters change) is ACKed by the sidecar on r1 and held back by the one
// on r2: wait with a short timeout fails naming the one behind; a wait
// started then prints that it waits for one proxy and returns only once
// that proxy ACKs. The version waited for is galley's, or (with no galley
// address) the one the replicas agree on; a deletion is waited for the
// same way; bad arguments are errors that say what is wanted.
func TestWaitReturnsOnlyAfterTheLastProxyHoldsTheChange(t *testing.T) {
	dir, galley, r1, r2 := mesh(t)
	ctxFile := filepath.Join(t.TempDir(), "context.yaml")
	if err := debugapi.WriteContext(ctxFile, debugapi.Context{DiscoveryAddresses: []string{r1.xds, r2.xds}, GalleyAddress: galley, Plaintext: true}); err != nil {
		t.Fatal(err)
	}
	newHoldingClient(t, r1.xds, sidecarID)
	stuck := newHoldingClient(t, r2.xds, stalledID)

	code, out, stderr := flotilla(t, ctxFile, "wait", "destinationrule", "backend-dr")
	if code != 0 || !strings.Contains(out, "held by 2 of 2 proxies, on 2 replicas") {
		t.Fatalf("the configuration as it is: exit %d\n%s%s", code, out, stderr)
	}

	stuck.hold()
	stuck.drain()
	xdstest.WriteFile(t, dir, "routing.yaml", strings.Replace(xdstest.Routing(90, 10), "maxConnections: 100", "maxConnections: 50", 1))
	// As after kubectl apply, the change is in galley before wait asks
	// it for the version: here, once it has reached a proxy.
	stuck.next(t)
	code, out, stderr = flotilla(t, ctxFile, "wait", "--timeout", "3s", "dr", "backend-dr.default")
	if code == 0 || !strings.Contains(stderr, "timed out after 3s") || !strings.Contains(stderr, "held by 1 of 2 proxies") ||
		!strings.Contains(stderr, "stuck-1.default (on r2): holds push") || strings.Contains(stderr, "app-1.default") {
		t.Fatalf("a proxy holding its ACK back: exit %d\n%s%s", code, out, stderr)
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "flotilla"), "wait", "--timeout", "50s", "DestinationRule", "backend-dr")
	cmd.Env = append(os.Environ(), "FLOTILLA_CONTEXT="+ctxFile)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut strings.Builder
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || !strings.Contains(lines.Text(), "held by 1 of 2 proxies, waiting for 1") {
		t.Fatalf("wait's first line %q, want it waiting for one proxy (stderr %s)", lines.Text(), errOut.String())
	}
	time.Sleep(time.Second) // a few polls: it keeps waiting
	if cmd.ProcessState != nil {
		t.Fatal("wait returned while a proxy held its ACK back")
	}
	stuck.release(t)
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
	}
	if err := cmd.Wait(); err != nil || len(rest) == 0 || !strings.Contains(rest[len(rest)-1], "held by 2 of 2 proxies, on 2 replicas") {
		t.Fatalf("after the ACK: %v, output %q, stderr %s", err, rest, errOut.String())
	}

	// Without galley's address, the version the replicas agree on.
	noGalley := writeContext(t, r1.xds, r2.xds)
	if code, out, stderr := flotilla(t, noGalley, "wait", "vs", "backend-vs"); code != 0 || !strings.Contains(out, "held by 2 of 2 proxies") {
		t.Fatalf("without galley: exit %d\n%s%s", code, out, stderr)
	}

	// An edit galley refuses never reaches a proxy: wait says so, with
	// galley's reason, rather than return for the old version.
	xdstest.WriteFile(t, dir, "routing.yaml", strings.Replace(xdstest.Routing(90, 10), "maxConnections: 100", "maxConnections: -1", 1))
	var refusal string
	for range 50 {
		code, _, stderr := flotilla(t, ctxFile, "wait", "--timeout", "5s", "dr", "backend-dr")
		if code != 0 && strings.Contains(stderr, "galley refuses DestinationRule default/backend-dr") {
			refusal = stderr
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(refusal, "routing.yaml:") || !strings.Contains(refusal, "no proxy gets this change") {
		t.Fatalf("waiting for a refused edit: %q", refusal)
	}

	// A deletion.
	if err := os.Remove(filepath.Join(dir, "routing.yaml")); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := flotilla(t, ctxFile, "wait", "--for=delete", "destinationrule", "backend-dr"); code != 0 || !strings.Contains(out, "held by 2 of 2 proxies") {
		t.Fatalf("deletion: exit %d\n%s%s", code, out, stderr)
	}
	if code, _, stderr := flotilla(t, ctxFile, "wait", "destinationrule", "backend-dr"); code != 1 || !strings.Contains(stderr, "galley has no DestinationRule default/backend-dr") {
		t.Fatalf("waiting for what galley does not have: exit %d, %s", code, stderr)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"wait", "service", "backend"}, `"service" is not an Istio kind`},
		{[]string{"wait", "--for=ready", "vs", "backend-vs"}, `--for "ready": want distribution or delete`},
		{[]string{"wait", "--threshold=2", "vs", "backend-vs"}, "--threshold 2: want a ratio in (0, 1]"},
		{[]string{"wait", "vs", "a.b.c"}, `"a.b.c": want NAME or NAME.NAMESPACE`},
		{[]string{"wait", "--for=delete", "--resource-version=3", "vs", "backend-vs"}, "--resource-version names a version to wait for, not a deletion"},
		{[]string{"wait", "vs"}, "accepts 2 arg(s), received 1"},
	} {
		if code, _, stderr := flotilla(t, ctxFile, tt.args...); code != 1 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, %q; want exit 1 and %q", tt.args, code, stderr, tt.want)
		}
	}
}
