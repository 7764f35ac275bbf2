package dashboards

import "fmt"

// All is every dashboard Flotilla ships.
func All() []Dashboard { return []Dashboard{ControlPlane()} }

// services selects the control-plane services' target_info series (each
// scrape target has one, naming the service it is).
const services = `target_info{service_name=~"flotilla-(galley|discovery|ca|injector)"}`

// perService labels a per-target series with the service it comes from.
func perService(expr string) string {
	return expr + " * on (job, instance) group_left (service_name) " + services
}

// rate is a counter's per-second rate over Grafana's rate interval.
func rate(counter string) string { return fmt.Sprintf("rate(%s[%s])", counter, RateInterval) }

// quantile is the q quantile of a histogram, grouped by the given labels
// (le is added).
func quantile(q float64, histogram, by string) string {
	if by != "" {
		by = ", " + by
	}
	return fmt.Sprintf("histogram_quantile(%g, sum by (le%s) (%s))", q, by, rate(histogram+"_bucket"))
}

// ControlPlane is the control-plane dashboard: every service per replica,
// then discovery's pushes and proxies, galley's validation and fan-out,
// ca's certificates and the injector's injections.
func ControlPlane() Dashboard {
	return Dashboard{
		UID: "flotilla-control-plane", Title: "Flotilla Control Plane",
		Description: "galley, discovery, ca and injector, per service and per replica (docs/metrics.md lists every series).",
		Rows: []Row{
			{Title: "Services", Panels: []Panel{
				{
					Title: "Replicas", Stat: true, Unit: "short",
					Description: "Replicas of each service Prometheus scrapes.",
					Queries:     []Query{{`count by (service_name) (` + services + `)`, "{{service_name}}"}},
				},
				{
					Title: "Versions", Stat: true, Unit: "short",
					Description: "Replicas of each service by the version they run: more than one version of a service is a rollout in progress (or stuck).",
					Queries:     []Query{{`count by (service_name, service_version) (` + services + `)`, "{{service_name}} {{service_version}}"}},
				},
				{
					Title: "Memory (resident)", Unit: "bytes",
					Queries: []Query{{perService(`process_resident_memory_bytes`), "{{service_name}} {{instance}}"}},
				},
				{
					Title: "CPU", Unit: "short",
					Description: "Cores used by each replica.",
					Queries:     []Query{{perService(rate(`process_cpu_seconds_total`)), "{{service_name}} {{instance}}"}},
				},
				{
					Title: "Goroutines", Unit: "short",
					Queries: []Query{{perService(`go_goroutines`), "{{service_name}} {{instance}}"}},
				},
				{
					Title: "Go heap in use", Unit: "bytes",
					Queries: []Query{{perService(`go_memstats_heap_inuse_bytes`), "{{service_name}} {{instance}}"}},
				},
			}},
			{Title: "discovery", Panels: []Panel{
				{
					Title: "Proxies connected, per replica", Unit: "short",
					Description: "xDS streams each discovery replica serves (Envoy sidecars, gateways, proxyless gRPC clients).",
					Queries:     []Query{{`sum by (instance) (pilot_xds)`, "{{instance}}"}},
				},
				{
					Title: "Proxies by version", Unit: "short",
					Description: "Connected proxies by the ISTIO_VERSION they report (the first 32 versions seen; later ones count as other).",
					Queries:     []Query{{`sum by (version) (pilot_xds)`, "{{version}}"}},
				},
				{
					Title: "Pushes by type", Unit: "reqps",
					Description: "xDS responses sent; <type>_senderr is a response that could not be sent.",
					Queries:     []Query{{`sum by (type) (` + rate(`pilot_xds_pushes`) + `)`, "{{type}}"}},
				},
				{
					Title: "Pushes per replica", Unit: "reqps",
					Queries: []Query{{`sum by (instance) (` + rate(`pilot_xds_pushes`) + `)`, "{{instance}}"}},
				},
				{
					Title: "Push triggers", Unit: "reqps",
					Description: "Why pushes happened: each reason a debounced push merged.",
					Queries:     []Query{{`sum by (type) (` + rate(`pilot_push_triggers`) + `)`, "{{type}}"}},
				},
				{
					Title: "Updates from galley", Unit: "reqps",
					Queries: []Query{{`sum by (type) (` + rate(`pilot_inbound_updates`) + `)`, "{{type}}"}},
				},
				{
					Title: "Proxy convergence (to send)", Unit: "s",
					Description: "From a change being seen to its push sent to a proxy, once per proxy the change reached (Istio's pilot_proxy_convergence_time).",
					Queries: []Query{
						{quantile(0.5, `pilot_proxy_convergence_time`, ""), "p50"},
						{quantile(0.99, `pilot_proxy_convergence_time`, ""), "p99"},
					},
				},
				{
					Title: "Proxy convergence p99, per replica", Unit: "s",
					Queries: []Query{{quantile(0.99, `pilot_proxy_convergence_time`, "instance"), "{{instance}}"}},
				},
				{
					Title: "Convergence to ACK, by type", Unit: "s",
					Description: "From a change being seen to the proxy acknowledging the response carrying it: what Istio's convergence time does not include.",
					Queries: []Query{
						{quantile(0.5, `flotilla_discovery_convergence_seconds`, "type"), "p50 {{type}}"},
						{quantile(0.99, `flotilla_discovery_convergence_seconds`, "type"), "p99 {{type}}"},
					},
				},
				{
					Title: "Push time p99, by type", Unit: "s",
					Queries: []Query{{quantile(0.99, `pilot_xds_push_time`, "type"), "{{type}}"}},
				},
				{
					Title: "Debounce and push context", Unit: "s",
					Queries: []Query{
						{quantile(0.99, `pilot_debounce_time`, ""), "debounce p99"},
						{quantile(0.99, `pilot_pushcontext_init_seconds`, ""), "push context p99"},
					},
				},
				{
					Title: "Configuration size p99, by type", Unit: "bytes",
					Queries: []Query{{quantile(0.99, `pilot_xds_config_size_bytes`, "type"), "{{type}}"}},
				},
				{
					Title: "Rejected configuration (NACKs)", Unit: "reqps",
					Description: "Responses proxies rejected; the proxy keeps its previous configuration. `flotilla proxy-status` names the proxies.",
					Queries:     []Query{{`sum by (type) (` + rate(`pilot_total_xds_rejects`) + `)`, "{{type}}"}},
				},
				{
					Title: "Slow proxies", Unit: "short",
					Description: "Proxies not reading their responses (a second or more), and streams closed because a proxy took nothing within the send timeout.",
					Queries: []Query{
						{`sum by (instance) (flotilla_discovery_proxies_behind)`, "behind {{instance}}"},
						{`sum by (instance) (increase(pilot_xds_write_timeout[` + RateInterval + `]))`, "write timeouts {{instance}}"},
					},
				},
				{
					Title: "Services and VirtualServices", Unit: "short",
					Queries: []Query{
						{`max by (instance) (pilot_services)`, "services {{instance}}"},
						{`max by (instance) (pilot_virt_services)`, "virtual services {{instance}}"},
					},
				},
			}},
			{Title: "galley", Panels: []Panel{
				{
					Title: "Validation", Unit: "reqps",
					Description: "Validating webhook decisions by kind; failures by reason.",
					Queries: []Query{
						{`sum by (resource) (` + rate(`galley_validation_passed`) + `)`, "passed {{resource}}"},
						{`sum by (resource, reason) (` + rate(`galley_validation_failed`) + `)`, "failed {{resource}}: {{reason}}"},
					},
				},
				{
					Title: "Validation webhook latency", Unit: "s",
					Queries: []Query{
						{quantile(0.5, `flotilla_galley_webhook_duration_seconds`, ""), "p50"},
						{quantile(0.99, `flotilla_galley_webhook_duration_seconds`, ""), "p99"},
					},
				},
				{
					Title: "MCP subscribers, per galley replica", Unit: "short",
					Description: "Discovery replicas and injectors subscribed to each galley replica.",
					Queries:     []Query{{`sum by (instance) (flotilla_mcp_server_subscribers)`, "{{instance}}"}},
				},
				{
					Title: "Subscribed to galley", Unit: "short",
					Description: "1 while each discovery replica's and injector's subscription is open and answered; 0 while it reconnects (the replica serves what it last got).",
					Queries:     []Query{{`max by (instance) (flotilla_mcp_client_subscribed)`, "{{instance}}"}},
				},
				{
					Title: "Lag to each subscriber", Unit: "s",
					Description: "From galley publishing a change to each discovery replica and injector having applied it, per subscriber (across hosts, clock skew adds to it).",
					Queries: []Query{
						{quantile(0.5, `flotilla_mcp_client_lag_seconds`, "instance"), "p50 {{instance}}"},
						{quantile(0.99, `flotilla_mcp_client_lag_seconds`, "instance"), "p99 {{instance}}"},
					},
				},
				{
					Title: "Fan-out to subscribers", Unit: "short",
					Description: "Resources and responses galley sent its subscribers, per second.",
					Queries: []Query{
						{`sum by (instance) (` + rate(`flotilla_mcp_server_resources_sent_total`) + `)`, "resources {{instance}}"},
						{`sum by (instance) (` + rate(`flotilla_mcp_server_responses_total`) + `)`, "responses {{instance}}"},
					},
				},
			}},
			{Title: "ca", Panels: []Panel{
				{
					Title: "Certificate requests", Unit: "reqps",
					Queries: []Query{
						{`sum(` + rate(`citadel_server_csr_count`) + `)`, "CSRs"},
						{`sum(` + rate(`citadel_server_success_cert_issuance_count`) + `)`, "issued"},
					},
				},
				{
					Title: "Certificate failures", Unit: "reqps",
					Description: "Callers without a valid credential, or asking for an identity not theirs; signing errors by Istio's codes.",
					Queries: []Query{
						{`sum(` + rate(`citadel_server_authentication_failure_count`) + `)`, "authentication"},
						{`sum by (error) (` + rate(`citadel_server_csr_sign_err_count`) + `)`, "{{error}}"},
					},
				},
				{
					Title: "Time to expiry", Unit: "s",
					Description: "Of the earliest root in the trust bundle, and of the certificate ca signs with.",
					Queries: []Query{
						{`min(citadel_server_root_cert_expiry_seconds)`, "root"},
						{`min by (instance) (flotilla_ca_signer_expiry_seconds)`, "signer {{instance}}"},
					},
				},
				{
					Title: "Signing latency", Unit: "s",
					Queries: []Query{
						{quantile(0.5, `flotilla_ca_signing_duration_seconds`, ""), "p50"},
						{quantile(0.99, `flotilla_ca_signing_duration_seconds`, ""), "p99"},
					},
				},
			}},
			{Title: "injector", Panels: []Panel{
				{
					Title: "Injections", Unit: "reqps",
					Queries: []Query{
						{`sum(` + rate(`sidecar_injection_success_total`) + `)`, "injected"},
						{`sum(` + rate(`sidecar_injection_skip_total`) + `)`, "skipped"},
						{`sum(` + rate(`sidecar_injection_failure_total`) + `)`, "failed"},
					},
				},
				{
					Title: "Injection latency", Unit: "s",
					Queries: []Query{
						{quantile(0.5, `sidecar_injection_time_seconds`, ""), "p50"},
						{quantile(0.99, `sidecar_injection_time_seconds`, ""), "p99"},
					},
				},
			}},
		},
	}
}
