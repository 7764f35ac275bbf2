// Command fakeenvoy stands in for Envoy in the agent's tests (Envoy cannot
// be installed on these machines): it takes Envoy's -c flag, serves the
// admin endpoints the agent uses on the address in FAKE_ENVOY_ADMIN
// (/ready, POST /drain_listeners, /stats/prometheus) and those the CLI
// reads through the agent: /config_dump and /clusters?format=json of what
// its bootstrap holds (an Envoy whose xDS has not answered yet holds
// just that), /stats, /server_info and POST /logging, its loggers' levels
// kept as Envoy keeps them (--log-level sets them all). It appends each signal
// and drain it gets to the file FAKE_ENVOY_RECORD, and on SIGTERM exits
// with FAKE_ENVOY_EXIT (default 0). With FAKE_ENVOY_CRASH it exits at
// once with that code.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	// The types the agent's bootstrap holds, to read it.
	_ "github.com/flotilla-mesh/flotilla/services/agent/bootstrap"
)

func record(what string) {
	f, err := os.OpenFile(os.Getenv("FAKE_ENVOY_RECORD"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = fmt.Fprintln(f, what)
}

func main() {
	config := flag.String("c", "", "bootstrap")
	flag.String("drain-time-s", "", "")
	flag.String("drain-strategy", "", "")
	flag.String("local-address-ip-version", "", "")
	flag.String("file-flush-interval-msec", "", "")
	flag.Bool("disable-hot-restart", false, "")
	flag.Bool("allow-unknown-static-fields", false, "")
	logLevel := flag.String("log-level", "info", "")
	flag.String("concurrency", "", "")
	flag.Parse()
	if _, err := os.Stat(*config); err != nil {
		fmt.Fprintln(os.Stderr, "no bootstrap:", err)
		os.Exit(1)
	}
	record("started -c " + *config)
	if code := os.Getenv("FAKE_ENVOY_CRASH"); code != "" {
		n, _ := strconv.Atoi(code)
		os.Exit(n)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprint(w, "LIVE") })
	mux.HandleFunc("POST /drain_listeners", func(w http.ResponseWriter, r *http.Request) {
		record("drain " + r.URL.RawQuery)
		_, _ = fmt.Fprint(w, "OK")
	})
	mux.HandleFunc("GET /stats/prometheus", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprint(w, "# TYPE envoy_server_live gauge\nenvoy_server_live 1\n")
	})
	boot, err := readBootstrap(*config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootstrap:", err)
		os.Exit(1)
	}
	a := &adminState{boot: boot, levels: map[string]string{}}
	for _, l := range loggers {
		a.levels[l] = *logLevel
	}
	mux.HandleFunc("GET /config_dump", a.configDump)
	mux.HandleFunc("GET /clusters", a.clusters)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintf(w, "cluster_manager.cds.update_success: 0\nserver.live: 1\nserver.total_connections: 0\n")
	})
	mux.HandleFunc("GET /server_info", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintf(w, `{"version":"fakeenvoy","state":"LIVE","node":{"id":%q}}`, boot.GetNode().GetId())
	})
	mux.HandleFunc("POST /logging", a.logging)
	go func() { _ = http.ListenAndServe(os.Getenv("FAKE_ENVOY_ADMIN"), mux) }() //nolint:gosec // a test stand-in
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGINT)
	for sig := range sigs {
		record("signal " + sig.String())
		if sig == syscall.SIGTERM {
			n, _ := strconv.Atoi(os.Getenv("FAKE_ENVOY_EXIT"))
			os.Exit(n)
		}
	}
}

// loggers are some of Envoy's (source/common/common/logger.h).
var loggers = []string{"admin", "config", "connection", "grpc", "http", "main", "router", "upstream", "wasm"}

type adminState struct {
	boot   *bootstrapv3.Bootstrap
	mu     sync.Mutex
	levels map[string]string
}

func readBootstrap(path string) (*bootstrapv3.Bootstrap, error) {
	js, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var b bootstrapv3.Bootstrap
	return &b, protojson.Unmarshal(js, &b)
}

// configDump is Envoy's /config_dump of the bootstrap's static resources.
func (a *adminState) configDump(w http.ResponseWriter, _ *http.Request) {
	clusters := &adminv3.ClustersConfigDump{}
	for _, c := range a.boot.GetStaticResources().GetClusters() {
		packed, _ := anypb.New(c)
		clusters.StaticClusters = append(clusters.StaticClusters, &adminv3.ClustersConfigDump_StaticCluster{Cluster: packed})
	}
	listeners := &adminv3.ListenersConfigDump{}
	for _, l := range a.boot.GetStaticResources().GetListeners() {
		packed, _ := anypb.New(l)
		listeners.StaticListeners = append(listeners.StaticListeners, &adminv3.ListenersConfigDump_StaticListener{Listener: packed})
	}
	var dump adminv3.ConfigDump
	for _, m := range []proto.Message{&adminv3.BootstrapConfigDump{Bootstrap: a.boot}, clusters, listeners} {
		packed, err := anypb.New(m)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		dump.Configs = append(dump.Configs, packed)
	}
	js, err := protojson.Marshal(&dump)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(js)
}

// clusters is Envoy's /clusters?format=json: the static clusters' hosts,
// healthy as far as EDS says.
func (a *adminState) clusters(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("format") != "json" {
		http.Error(w, "fakeenvoy answers format=json only", http.StatusBadRequest)
		return
	}
	var out adminv3.Clusters
	for _, c := range a.boot.GetStaticResources().GetClusters() {
		cs := &adminv3.ClusterStatus{Name: c.GetName()}
		for _, loc := range c.GetLoadAssignment().GetEndpoints() {
			for _, lb := range loc.GetLbEndpoints() {
				cs.HostStatuses = append(cs.HostStatuses, &adminv3.HostStatus{
					Address:      lb.GetEndpoint().GetAddress(),
					HealthStatus: &adminv3.HostHealthStatus{EdsHealthStatus: corev3.HealthStatus_HEALTHY},
				})
			}
		}
		out.ClusterStatuses = append(out.ClusterStatuses, cs)
	}
	js, err := protojson.Marshal(&out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(js)
}

// logging is Envoy's POST /logging: ?level=L sets every logger, ?name=L
// one; the answer lists every logger's level.
func (a *adminState) logging(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	levels := []string{"trace", "debug", "info", "warning", "error", "critical", "off"}
	for k, vs := range r.URL.Query() {
		v := vs[0]
		_, known := a.levels[k]
		if !slices.Contains(levels, v) || (k != "level" && !known) {
			http.Error(w, "error: unknown logger name or level\n", http.StatusNotFound)
			return
		}
		for l := range a.levels {
			if k == "level" || k == l {
				a.levels[l] = v
			}
		}
	}
	var b strings.Builder
	b.WriteString("active loggers:\n")
	for _, l := range loggers {
		fmt.Fprintf(&b, "  %s: %s\n", l, a.levels[l])
	}
	_, _ = w.Write([]byte(b.String()))
}
