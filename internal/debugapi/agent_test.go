package debugapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
)

func TestTheBootstrapIsServedInsideThePodOnly(t *testing.T) {
	h := BootstrapHandler(AgentBootstrap{Type: BootstrapGRPC, Bootstrap: json.RawMessage(`{"xds_servers":[]}`)})
	for addr, want := range map[string]int{"127.0.0.1:40000": 200, "[::1]:40000": 200, "10.0.0.7:40000": 403, "garbage": 403} {
		r := httptest.NewRequest(http.MethodGet, AgentBootstrapPath, nil)
		r.RemoteAddr = addr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("from %s: %d, want %d", addr, w.Code, want)
		}
		if want == 200 {
			var got AgentBootstrap
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || got.Type != BootstrapGRPC || string(got.Bootstrap) != `{"xds_servers":[]}` {
				t.Errorf("from %s: %s (%v)", addr, w.Body.String(), err)
			}
		}
	}
}

func TestTheWorkloadSecretsAreServedInsideThePodOnlyAsEnvoysConfigDump(t *testing.T) {
	h := SecretsHandler(func() []*tlsv3.Secret {
		return []*tlsv3.Secret{{Name: "ROOTCA", Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{}}}}
	})
	for addr, want := range map[string]int{"127.0.0.1:40000": 200, "10.0.0.7:40000": 403} {
		r := httptest.NewRequest(http.MethodGet, AgentSecretsPath, nil)
		r.RemoteAddr = addr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Fatalf("from %s: %d, want %d", addr, w.Code, want)
		}
		if want != 200 {
			continue
		}
		var dump adminv3.SecretsConfigDump
		if err := protojson.Unmarshal(w.Body.Bytes(), &dump); err != nil || len(dump.GetDynamicActiveSecrets()) != 1 || dump.GetDynamicActiveSecrets()[0].GetName() != "ROOTCA" {
			t.Fatalf("from %s: %s (%v)", addr, w.Body.String(), err)
		}
	}
}

func TestTheNameTableIsServedInsideThePodOnlyAndNotFoundWithoutOne(t *testing.T) {
	table := &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{"pg.example.com": {Ips: []string{"240.240.0.1"}, Registry: "External"}}}
	for _, tc := range []struct {
		current  proto.Message
		addr     string
		want     int
		wantBody bool
	}{
		{table, "127.0.0.1:40000", 200, true},
		{table, "10.0.0.7:40000", 403, false},
		{nil, "127.0.0.1:40000", 404, false},
	} {
		h := NameTableHandler(func() proto.Message { return tc.current })
		r := httptest.NewRequest(http.MethodGet, AgentNameTablePath, nil)
		r.RemoteAddr = tc.addr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("from %s: %d, want %d", tc.addr, w.Code, tc.want)
		}
		var got ndsv1.NameTable
		switch {
		case tc.wantBody:
			if err := protojson.Unmarshal(w.Body.Bytes(), &got); err != nil || !proto.Equal(&got, table) {
				t.Errorf("from %s: %s (%v)", tc.addr, w.Body.String(), err)
			}
		case tc.want == 404 && w.Body.String() != "{}":
			t.Errorf("without a table: %q, want {} as Istio's agent", w.Body.String())
		}
	}
}
