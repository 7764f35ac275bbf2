// Command standinenvoy stands in for the Envoy binary that Istio's
// pilot-agent starts (Envoy cannot be installed on these machines): it
// takes whatever arguments pilot-agent gives Envoy, reads the bootstrap
// pilot-agent wrote (-c) for the admin address and serves there what
// pilot-agent asks of Envoy's admin (/ready, POST /drain_listeners,
// /stats); it appends each drain and signal it gets to ./envoy-record, in
// its working directory (pilot-agent's, the pod's), and exits on SIGTERM
// and SIGINT. It speaks no xDS: the test plays Envoy's xDS and SDS
// streams itself, from the same bootstrap.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

func record(what string) {
	f, err := os.OpenFile("envoy-record", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = fmt.Fprintln(f, what)
}

func main() {
	var config string
	for i, a := range os.Args[1:] {
		if a == "-c" && i+2 < len(os.Args) {
			config = os.Args[i+2]
		}
	}
	data, err := os.ReadFile(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "no bootstrap:", err)
		os.Exit(1)
	}
	var bootstrap struct {
		Admin struct {
			Address struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"address"`
		} `json:"admin"`
	}
	if err := json.Unmarshal(data, &bootstrap); err != nil {
		fmt.Fprintln(os.Stderr, "bootstrap:", err)
		os.Exit(1)
	}
	admin := bootstrap.Admin.Address.SocketAddress
	record("started -c " + config)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprint(w, "LIVE") })
	mux.HandleFunc("POST /drain_listeners", func(w http.ResponseWriter, r *http.Request) {
		record("drain " + r.URL.RawQuery)
		_, _ = fmt.Fprint(w, "OK")
	})
	mux.HandleFunc("GET /stats", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /stats/prometheus", func(http.ResponseWriter, *http.Request) {})
	go func() {
		_ = http.ListenAndServe(net.JoinHostPort(admin.Address, strconv.Itoa(admin.PortValue)), mux) //nolint:gosec // a test stand-in
	}()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
	for sig := range sigs {
		record("signal " + sig.String())
		if sig == syscall.SIGTERM || sig == syscall.SIGINT {
			os.Exit(0)
		}
	}
}
