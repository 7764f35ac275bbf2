package app

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
)

// envoyStandIn answers every admin request with what it was asked, and
// records it.
type envoyStandIn struct {
	mu   sync.Mutex
	seen []string
}

func (e *envoyStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.seen = append(e.seen, r.Method+" "+r.URL.RequestURI())
	e.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTeapot) // a status of Envoy's own is passed on
	_, _ = io.WriteString(w, `{"asked":"`+r.Method+" "+r.URL.RequestURI()+`"}`)
}

func (e *envoyStandIn) requests() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.seen...)
}

func relayCall(h http.Handler, method, target, remote string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = remote
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestTheRelayPassesEnvoysReadEndpointsAndLoggingToLoopbackClientsAndNothingElse(t *testing.T) {
	envoy := &envoyStandIn{}
	srv := httptest.NewServer(envoy)
	defer srv.Close()
	mux := http.NewServeMux()
	handleEnvoyAdmin(mux.Handle, strings.TrimPrefix(srv.URL, "http://"))
	const local = "127.0.0.1:40000"

	for _, tc := range []struct {
		method, target string
		want           string // what Envoy is asked; "" for nothing
		code           int
	}{
		{http.MethodGet, debugapi.AgentEnvoyPath + "config_dump?include_eds=true", "GET /config_dump?include_eds=true", http.StatusTeapot},
		{http.MethodGet, debugapi.AgentEnvoyPath + "clusters?format=json", "GET /clusters?format=json", http.StatusTeapot},
		{http.MethodGet, debugapi.AgentEnvoyPath + "stats?format=json&filter=cluster", "GET /stats?format=json&filter=cluster", http.StatusTeapot},
		{http.MethodGet, debugapi.AgentEnvoyPath + "stats/prometheus", "GET /stats/prometheus", http.StatusTeapot},
		{http.MethodGet, debugapi.AgentEnvoyPath + "server_info", "GET /server_info", http.StatusTeapot},
		{http.MethodPost, debugapi.AgentEnvoyPath + "logging?http=debug", "POST /logging?http=debug", http.StatusTeapot},
		// Envoy's mutations other than logging levels, and the wrong
		// method, never reach it.
		{http.MethodPost, debugapi.AgentEnvoyPath + "quitquitquit", "", http.StatusNotFound},
		{http.MethodPost, debugapi.AgentEnvoyPath + "drain_listeners", "", http.StatusNotFound},
		{http.MethodPost, debugapi.AgentEnvoyPath + "config_dump", "", http.StatusMethodNotAllowed},
		{http.MethodGet, debugapi.AgentEnvoyPath + "logging", "", http.StatusMethodNotAllowed},
		// A path climbing out is cleaned and redirected away (to
		// /debug/quitquitquit, which is nothing), never relayed.
		{http.MethodGet, debugapi.AgentEnvoyPath + "../quitquitquit", "", http.StatusTemporaryRedirect},
	} {
		before := len(envoy.requests())
		rec := relayCall(mux, tc.method, tc.target, local)
		if rec.Code != tc.code {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.target, rec.Code, rec.Body, tc.code)
			continue
		}
		got := envoy.requests()[before:]
		switch {
		case tc.want == "" && len(got) != 0:
			t.Errorf("%s %s reached Envoy: %q", tc.method, tc.target, got)
		case tc.want != "" && (len(got) != 1 || got[0] != tc.want):
			t.Errorf("%s %s: Envoy was asked %q, want %q", tc.method, tc.target, got, tc.want)
		case tc.want != "" && (rec.Body.String() != `{"asked":"`+tc.want+`"}` || rec.Header().Get("Content-Type") != "application/json"):
			t.Errorf("%s %s: the answer is not Envoy's: %s %q", tc.method, tc.target, rec.Body, rec.Header())
		}
	}

	// From outside the pod (the kubelet, Prometheus): refused, Envoy not
	// asked.
	before := len(envoy.requests())
	if rec := relayCall(mux, http.MethodPost, debugapi.AgentEnvoyPath+"logging?level=trace", "10.0.0.7:5000"); rec.Code != http.StatusForbidden {
		t.Errorf("a client off the pod: %d %s, want 403", rec.Code, rec.Body)
	}
	if got := envoy.requests()[before:]; len(got) != 0 {
		t.Errorf("a client off the pod reached Envoy: %q", got)
	}
}

func TestTheRelaySaysWhenEnvoyDoesNotAnswerOrThePodRunsNone(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := lis.Addr().String()
	_ = lis.Close()
	mux := http.NewServeMux()
	handleEnvoyAdmin(mux.Handle, gone)
	if rec := relayCall(mux, http.MethodGet, debugapi.AgentEnvoyPath+"config_dump", "127.0.0.1:1"); rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), "does not answer") {
		t.Errorf("Envoy away: %d %s", rec.Code, rec.Body)
	}
	proxyless := http.NewServeMux()
	handleEnvoyAdmin(proxyless.Handle, "")
	if rec := relayCall(proxyless, http.MethodGet, debugapi.AgentEnvoyPath+"config_dump", "127.0.0.1:1"); rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "runs no Envoy") {
		t.Errorf("a proxyless pod: %d %s", rec.Code, rec.Body)
	}
}
