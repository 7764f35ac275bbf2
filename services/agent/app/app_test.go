package app

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/services/agent/capture"
)

func TestIptablesDryRunPrintsTheRulesForTheFlags(t *testing.T) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"iptables", "--dry-run", "--exclude-outbound-ports", "3306,5432", "--exclude-outbound-ip-ranges", "169.254.169.254/32", "--inbound-ports", "8080"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	plan, err := capture.Build(capture.Settings{
		ExcludeOutboundPorts: []uint16{3306, 5432}, ExcludeOutboundIPRanges: []string{"169.254.169.254/32"},
		InboundPorts: []uint16{8080}, IncludeOutboundIPRanges: []string{"*"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != plan.NFTables() {
		t.Fatalf("printed:\n%s\nwant the nft script:\n%s", out.String(), plan.NFTables())
	}
	cmd = NewCommand()
	out.Reset()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"iptables", "--dry-run", "--mode", "iptables", "--exclude-outbound-ports", "3306,5432", "--exclude-outbound-ip-ranges", "169.254.169.254/32", "--inbound-ports", "8080"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if out.String() != plan.IPTables() {
		t.Fatalf("--mode iptables printed:\n%s\nwant:\n%s", out.String(), plan.IPTables())
	}
}

func TestIptablesRefusesBadFlags(t *testing.T) {
	for want, args := range map[string][]string{
		"70000 is not a port":       {"iptables", "--dry-run", "--exclude-outbound-ports", "70000"},
		`"nope" is not an IP range`: {"iptables", "--dry-run", "--exclude-outbound-ip-ranges", "nope"},
		"0 is not a port":           {"iptables", "--dry-run", "--inbound-ports", "0"},
		`--inbound-ports "80,x"`:    {"iptables", "--dry-run", "--inbound-ports", "80,x"},
		`interface "bad name"`:      {"iptables", "--dry-run", "--exclude-interfaces", "bad name"},
		"70001 is not a port":       {"iptables", "--dry-run", "--include-outbound-ports", "70001"},
		`--mode "legacy"`:           {"iptables", "--dry-run", "--mode", "legacy"},
	} {
		cmd := NewCommand()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(args)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %v, want an error saying %q", args, err, want)
		}
	}
}

// TestTheInjectedInitContainerArgsDriveTheRules runs the agent with the
// arguments the injection template gives flotilla-init: the contract
// between injector and agent. includeOutboundIPRanges "" captures no
// outbound traffic, as in Istio; "*" captures all.
func TestTheInjectedInitContainerArgsDriveTheRules(t *testing.T) {
	tmpl, err := inject.ParseTemplate(inject.DefaultTemplate)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		annotations map[string]string
		want        capture.Settings
	}{
		{nil, capture.Settings{IncludeOutboundIPRanges: []string{"*"}}},
		{map[string]string{inject.AnnotationIncludeOutbound: ""}, capture.Settings{}},
		{
			map[string]string{
				inject.AnnotationIncludeOutbound: "10.96.0.0/12", inject.AnnotationExcludeOutboundPt: "3306",
				inject.AnnotationExcludeInbound: "9000,9001", inject.AnnotationExcludeOutbound: "169.254.169.254/32",
			},
			capture.Settings{
				IncludeOutboundIPRanges: []string{"10.96.0.0/12"}, ExcludeOutboundPorts: []uint16{3306},
				ExcludeInboundPorts: []uint16{9000, 9001}, ExcludeOutboundIPRanges: []string{"169.254.169.254/32"},
			},
		},
		{
			map[string]string{
				inject.AnnotationIncludeInbound: "8080,9090", inject.AnnotationIncludeOutboundPt: "6379",
				inject.AnnotationExcludeIfaces: "eth1", inject.AnnotationKubevirtIfaces: "net1", inject.AnnotationRerouteIfaces: "vm0,vm1",
			},
			capture.Settings{
				IncludeOutboundIPRanges: []string{"*"}, InboundPorts: []uint16{8080, 9090}, IncludeOutboundPorts: []uint16{6379},
				ExcludeInterfaces: []string{"eth1"}, RerouteInterfaces: []string{"vm0", "vm1"},
			},
		},
		{map[string]string{inject.AnnotationIncludeInbound: ""}, capture.Settings{IncludeOutboundIPRanges: []string{"*"}, NoInbound: true}},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: tc.annotations}}
		sc, _, err := tmpl.Render(pod, inject.DefaultValues())
		if err != nil {
			t.Fatal(err)
		}
		cmd := NewCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append(slices.Clone(sc.InitContainers[0].Args), "--dry-run"))
		if err := cmd.Execute(); err != nil {
			t.Fatalf("%v: %v", tc.annotations, err)
		}
		plan, err := capture.Build(tc.want)
		if err != nil {
			t.Fatal(err)
		}
		if want := plan.NFTables(); out.String() != want {
			t.Errorf("%v: printed:\n%s\nwant:\n%s", tc.annotations, out.String(), want)
		}
	}
}
