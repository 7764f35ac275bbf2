//go:build tools

// Package istio pins Istio's own agent, pilot-agent (the agent of Istio's
// proxyv2 sidecar image), which test/istioagent runs against Flotilla's
// control plane. It is its own module so istio.io/istio and its large
// dependency graph stay out of every Flotilla module: the product never
// imports istio.io/istio.
package istio

import (
	_ "istio.io/istio/pilot/cmd/pilot-agent"
)
