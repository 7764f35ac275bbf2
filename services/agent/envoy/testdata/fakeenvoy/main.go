// Command fakeenvoy stands in for Envoy in the agent's tests (Envoy cannot
// be installed on these machines): it takes Envoy's -c flag, serves the
// admin endpoints the agent uses on the address in FAKE_ENVOY_ADMIN
// (/ready, POST /drain_listeners, /stats/prometheus), appends each signal
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
	"strconv"
	"syscall"
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
	flag.String("log-level", "", "")
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
