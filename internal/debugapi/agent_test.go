package debugapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
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
