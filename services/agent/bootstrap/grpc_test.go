package bootstrap

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/xds"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/golden"
)

// TestTheGRPCBootstrapIsWhatGRPCGoReads: the golden file, and grpc-go's
// own bootstrap parser (through its xDS resolver) accepts it.
func TestTheGRPCBootstrapIsWhatGRPCGoReads(t *testing.T) {
	n := cart()
	n.Generator = "not kept: the gRPC bootstrap says grpc"
	b, err := BuildGRPC(GRPCOptions{Node: n, CertRefresh: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", "grpc.golden.json"), b, *update)
	if _, err := xds.NewXDSResolverWithConfigForTesting(b); err != nil {
		t.Fatalf("grpc-go refuses the bootstrap: %v", err)
	}
	var got struct {
		Node struct {
			ID       string         `json:"id"`
			Metadata map[string]any `json:"metadata"`
		} `json:"node"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Node.ID != "sidecar~10.1.2.3~cart-7d9f.shop~shop.svc.cluster.local" || got.Node.Metadata["GENERATOR"] != "grpc" || got.Node.Metadata["SERVICE_ACCOUNT"] != "cart" {
		t.Errorf("node %+v: want the sidecar id and GENERATOR grpc", got.Node)
	}
}

func TestABadGRPCBootstrapIsRefusedWithTheReason(t *testing.T) {
	for want, o := range map[string]GRPCOptions{
		"INSTANCE_IP":   {Node: func() Node { n := cart(); n.IP = "x"; return n }()},
		"absolute":      {Node: cart(), CertsDir: "relative/dir"},
		"at least 1s":   {Node: cart(), CertRefresh: time.Millisecond},
		"absolute path": {Node: cart(), XDSSocket: "XDS"},
	} {
		if _, err := BuildGRPC(o); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
}
