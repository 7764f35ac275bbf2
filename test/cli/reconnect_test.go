package cli_test

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/xdstest"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// A proxy that reconnects holding the current configuration is answered
// with nothing (discovery leaves a request whose version matches
// unanswered) and still counts as holding it: after its replica was
// paused and resumed (SIGSTOP, SIGCONT) and its connection then reached
// its maximum age, and after the replica was killed and started again,
// proxy-status shows it SYNCED and wait returns, with no change made.
func TestAProxyReconnectingToAPausedOrRestartedReplicaIsSyncedAndWaitReturns(t *testing.T) {
	_, galley, _, _ := mesh(t)
	xds := proc.FreeAddr(t)
	age := []string{"--revision", "default", "--xds-max-connection-age", "3s"}
	r := startReplica(t, galley, "r3", xds, age...)
	ctxFile := filepath.Join(t.TempDir(), "context.yaml")
	if err := debugapi.WriteContext(ctxFile, debugapi.Context{DiscoveryAddresses: []string{xds}, GalleyAddress: galley, Plaintext: true}); err != nil {
		t.Fatal(err)
	}
	c := xdstest.Client(t, proxylessID, xdstest.Target, xds)
	if got := xdstest.Count(t, c, 10); got["v1"]+got["v2"] != 10 {
		t.Fatalf("proxyless calls: %v", got)
	}
	synced := func(what string) {
		t.Helper()
		var out string
		xdstest.Eventually(t, what+": the proxy SYNCED", func() bool {
			_, o, _ := flotilla(t, ctxFile, "proxy-status")
			out = o
			return strings.Count(line(out, "client-1.default"), "SYNCED") == 4
		})
		code, o, errOut := flotilla(t, ctxFile, "wait", "--timeout", "20s", "virtualservice", "backend-vs")
		if code != 0 || !strings.Contains(o, "held by 1 of 1 proxies") {
			t.Fatalf("%s: wait: exit %d\n%s%s", what, code, o, errOut)
		}
		if got := xdstest.Count(t, c, 10); got["v1"]+got["v2"] != 10 {
			t.Fatalf("%s: proxyless calls: %v", what, got)
		}
	}
	synced("connected")

	// Paused past the connection's age: resumed, the replica ends the
	// stream and the client comes back with the version it holds.
	connects := r.p.Out.Count("proxy connected")
	if err := syscall.Kill(r.p.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	if err := syscall.Kill(r.p.Pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	r.p.Out.WaitForCount(t, "proxy connected", connects+1)
	synced("paused and resumed")

	// Killed and started again on its address, as compose restarts a
	// container: a new replica, to which the client resumes.
	r.p.Kill(t)
	r = startReplica(t, galley, "r3", xds, age...)
	r.p.Out.WaitFor(t, "proxy connected")
	synced("killed and restarted")
}
