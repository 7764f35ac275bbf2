// Package contract_test checks, without building or starting anything,
// that what the agent writes into a proxyless gRPC application's
// bootstrap is what discovery's translation reads: the node, the server
// listener names grpc-go will ask for, and the certificate provider
// discovery's TLS contexts name. Both sides take these from
// internal/proxycontract; this catches one side's code drifting from it.
// test/ca's proxyless test shows the same end to end, over real processes.
package contract_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/internal/translate"
	"github.com/flotilla-mesh/flotilla/services/agent/bootstrap"
)

func TestTheAgentsProxylessBootstrapAsksForWhatDiscoveryServes(t *testing.T) {
	b, err := bootstrap.BuildGRPC(bootstrap.GRPCOptions{Node: bootstrap.Node{
		Type: proxycontract.Sidecar, IP: "10.1.2.3", PodName: "greeter-1", Namespace: "demo", DomainSuffix: "cluster.local",
		ServiceAccount: "greeter", Labels: map[string]string{"app": "greeter"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Node struct {
			ID       string         `json:"id"`
			Metadata map[string]any `json:"metadata"`
		} `json:"node"`
		CertificateProviders               map[string]json.RawMessage `json:"certificate_providers"`
		ServerListenerResourceNameTemplate string                     `json:"server_listener_resource_name_template"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}

	// The node: a sidecar of demo, which discovery serves the proxyless
	// flavour.
	id, ok := proxycontract.ParseNodeID(got.Node.ID)
	if !ok || model.ProxyType(id.Type) != model.SidecarProxy || id.ID != "greeter-1.demo" {
		t.Errorf("node id %q: want a sidecar greeter-1.demo", got.Node.ID)
	}
	p := &model.Proxy{Generator: fmt.Sprint(got.Node.Metadata[proxycontract.MetadataGenerator])}
	if !p.ProxylessGRPC() || got.Node.Metadata[proxycontract.MetadataNamespace] != "demo" {
		t.Errorf("node metadata %v: want a proxyless gRPC node of demo", got.Node.Metadata)
	}

	// grpc-go fills the template with the address its server listens on;
	// translation must read that name back as the listener of that port.
	for addr, want := range map[string]struct {
		host string
		port uint32
	}{"10.1.2.3:50051": {"10.1.2.3", 50051}, "[::]:8080": {"::", 8080}} {
		name := fmt.Sprintf(got.ServerListenerResourceNameTemplate, addr)
		host, port, ok := translate.ParseGRPCInboundName(name)
		if !ok || host != want.host || port != want.port {
			t.Errorf("grpc-go asks for %q; translation reads %q, %d, %v", name, host, port, ok)
		}
	}

	// discovery's TLS contexts name one certificate provider instance; it
	// must be the bootstrap's.
	if _, ok := got.CertificateProviders[translate.GRPCCertProvider]; !ok || len(got.CertificateProviders) != 1 {
		t.Errorf("certificate providers %v: want exactly %q", got.CertificateProviders, translate.GRPCCertProvider)
	}
}
