package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestPortOffsetMovesEveryControlPlanePortAndTheMeshFileIsPassedOn(t *testing.T) {
	l := local{bin: "bin", configDir: "cfg", meshFile: "elsewhere/mesh.yaml", stateDir: "state", offset: 1000}
	var args []string
	for _, name := range strings.Split(defaultServices, ",") {
		args = append(args, process(name, l, nil).Args...)
	}
	all := strings.Join(args, " ")
	for _, port := range []string{"15010", "15013", "15014", "15015", "15016", "15019", "15022", "15110", "15114"} {
		if strings.Contains(all, "127.0.0.1:"+port) {
			t.Errorf("port %s not moved: %s", port, all)
		}
	}
	for _, want := range []string{"--mcp-address=127.0.0.1:16019", "--xds-address=127.0.0.1:16010", "--galley-address=127.0.0.1:16019", "--admin-address=127.0.0.1:16015", "--mesh-config-file=elsewhere/mesh.yaml", "--discovery=127.0.0.1:16010,127.0.0.1:16110"} {
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
