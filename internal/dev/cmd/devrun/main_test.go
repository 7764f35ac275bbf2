package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
)

func TestPortOffsetMovesEveryControlPlanePortAndTheMeshFileIsPassedOn(t *testing.T) {
	l := local{bin: "bin", configDir: "cfg", meshFile: "elsewhere/mesh.yaml", stateDir: "state", offset: 1000}
	var args []string
	for _, name := range strings.Split(defaultServices, ",") {
		p := process(name, l, nil)
		args = append(append(args, p.Args...), p.Env...)
	}
	all := strings.Join(args, " ")
	for _, port := range []string{"15010", "15012", "15013", "15014", "15015", "15016", "15019", "15022", "15110", "15112", "15114", "15120", "15121", "15122", "15123"} {
		if strings.Contains(all, "127.0.0.1:"+port) {
			t.Errorf("port %s not moved: %s", port, all)
		}
	}
	for _, want := range []string{"--mcp-address=127.0.0.1:16019", "--xds-address=127.0.0.1:16010", "--galley-address=127.0.0.1:16019", "--admin-address=127.0.0.1:16015", "--mesh-config-file=elsewhere/mesh.yaml", "--admin-address=127.0.0.1:16120", "DISCOVERY_ADDRESS=127.0.0.1:16112", "CA_ADDRESS=127.0.0.1:16013"} {
		if !slices.Contains(args, want) {
			t.Errorf("no %s in %s", want, all)
		}
	}
	// The greeters serve what examples/greeter.yaml names.
	if got := process("greeter-v1", l, nil).Args; !slices.Contains(got, "--address="+greeterV1) {
		t.Errorf("greeter-v1 args %v", got)
	}
}

func TestANegativePortOffsetIsAUsageError(t *testing.T) {
	var out, errs bytes.Buffer
	if code := run([]string{"--port-offset=-1"}, &out, &errs); code != 2 || !strings.Contains(errs.String(), "--port-offset -1") {
		t.Fatalf("exit %d, stderr %q", code, errs.String())
	}
}

func TestHelpPrintsTheFlagsAndSucceeds(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		var out, errs bytes.Buffer
		if code := run([]string{arg}, &out, &errs); code != 0 || !strings.Contains(errs.String(), "-port-offset") {
			t.Fatalf("%s: exit %d, stderr %q", arg, code, errs.String())
		}
	}
}

func TestTheDemoNeedsItsAgentsAndTheAgentsNeedCA(t *testing.T) {
	for services, want := range map[string]string{
		"galley,discovery-1,greeter-v1-agent,greeter-v1": "add ca to --services",
		"ca,galley,discovery-1,client":                   "add client-agent to --services",
	} {
		var out, errs bytes.Buffer
		if code := run([]string{"--services=" + services, "--state-dir=" + t.TempDir()}, &out, &errs); code != 2 || !strings.Contains(errs.String(), want) {
			t.Errorf("--services=%s: exit %d, stderr %q; want 2 and %q", services, code, errs.String(), want)
		}
	}
}

func TestTheCLIContextNamesTheReplicasStarted(t *testing.T) {
	dir := t.TempDir()
	l := local{stateDir: dir, offset: 1000}
	if err := writeContext(l, map[string]bool{"discovery-1": true, "discovery-2": true}, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, debugapi.ContextFileName))
	if err != nil {
		t.Fatal(err)
	}
	c, err := debugapi.ParseContext(b)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Plaintext || !slices.Equal(c.DiscoveryAddresses, []string{"127.0.0.1:16010", "127.0.0.1:16110"}) || c.GalleyAddress != "" {
		t.Fatalf("context %+v", c)
	}

	// With ca: mTLS to the replicas and galley, with the operator's token.
	ids, err := newIdentities(filepath.Join(dir, "identity"))
	if err != nil {
		t.Fatal(err)
	}
	if err := writeContext(l, map[string]bool{"galley": true, "discovery-1": true, "client-agent": true}, ids); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(filepath.Join(dir, debugapi.ContextFileName)); err != nil {
		t.Fatal(err)
	}
	if c, err = debugapi.ParseContext(b); err != nil {
		t.Fatal(err)
	}
	if c.Plaintext || !slices.Equal(c.DiscoveryAddresses, []string{"127.0.0.1:16012"}) || c.GalleyAddress != "127.0.0.1:16019" ||
		c.CAAddress != "127.0.0.1:16013" || c.TokenFile != ids.TokenFile("default") || c.SystemNamespace != "istio-system" ||
		len(c.AgentAddresses) != 1 || c.AgentAddresses["client.demo"] != "127.0.0.1:16122" {
		t.Fatalf("context with ca %+v", c)
	}
	if _, err := os.Stat(c.TokenFile); err != nil {
		t.Fatalf("the operator's token: %v", err)
	}
}

// TestAPortInUseIsNamedWithTheWayOut holds one of the ports a stack moved
// by an offset listens on: devrun refuses to start, naming the address,
// the service that needs it and --port-offset. The offsets tried keep
// every port (15010–15123 moved) below the kernel's ephemeral range
// (from 32768), where the other tests' listeners and connections take
// ports at random: there, discovery's could be in use for a moment.
func TestAPortInUseIsNamedWithTheWayOut(t *testing.T) {
	l := local{bin: t.TempDir(), configDir: "cfg", stateDir: t.TempDir()}
	var held net.Listener
	for offset := 5000; held == nil && offset <= 17000; offset += 1000 { // an offset whose galley admin port is free to hold
		l.offset = offset
		held, _ = net.Listen("tcp", l.addr(galleyAdmin))
	}
	if held == nil {
		t.Fatal("no free port to hold")
	}
	defer held.Close()
	var out, errs bytes.Buffer
	code := run([]string{"--services=galley,discovery-1", "--port-offset=" + strconv.Itoa(l.offset), "--bin=" + l.bin, "--state-dir=" + l.stateDir}, &out, &errs)
	want := l.addr(galleyAdmin) + " (galley)"
	if code != 1 || !strings.Contains(errs.String(), want) || !strings.Contains(errs.String(), "--port-offset") {
		t.Fatalf("exit %d, stderr %q; want 1 naming %s and --port-offset", code, errs.String(), want)
	}
	if strings.Contains(errs.String(), "discovery-1)") {
		t.Errorf("a free port named as in use: %q", errs.String())
	}
}
