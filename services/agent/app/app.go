// Package app is the flotilla-agent command and its subcommands: proxy
// (the pod's runtime next to Envoy), wait (the proxy container's postStart
// hook) and iptables (the init container's traffic capture).
package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/platform/buildinfo"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/services/agent/capture"
	"github.com/flotilla-mesh/flotilla/services/agent/dns"
)

// NewCommand returns the flotilla-agent command.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "flotilla-agent",
		Short: "Flotilla's in-pod agent",
		Long: "agent is the pod's half of the mesh (Istio's pilot-agent): `proxy sidecar|router` runs next to Envoy, " +
			"`wait` waits for it to be ready, `iptables` installs the pod's traffic capture.",
		Version:       buildinfo.Get().String(),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.SetVersionTemplate("flotilla-agent {{.Version}}\n")
	cmd.AddCommand(proxyCommand(), waitCommand(), iptablesCommand())
	return cmd
}

// waitCommand is the postStart hook of the proxy container: it returns
// once the agent says the proxy is ready, so the application's containers
// start with the mesh in place (holdApplicationUntilProxyStarts).
func waitCommand() *cobra.Command {
	var url string
	var timeout, period time.Duration
	cmd := &cobra.Command{
		Use:   "wait",
		Short: "Wait until the proxy is ready (the agent's /healthz/ready answers 200)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			client := &http.Client{Timeout: period + time.Second}
			var last string
			for {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				if err != nil {
					return fmt.Errorf("--url: %w", err)
				}
				if resp, err := client.Do(req); err != nil {
					last = err.Error()
				} else {
					body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						return nil
					}
					last = resp.Status + ": " + string(body)
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("the proxy was not ready within %s (%s)", timeout, last)
				case <-time.After(period):
				}
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "url", "http://127.0.0.1:15020/healthz/ready", "readiness URL")
	f.DurationVar(&timeout, "timeout", time.Minute, "how long to wait")
	f.DurationVar(&period, "period", 500*time.Millisecond, "how often to ask")
	return cmd
}

// iptablesCommand installs (or with --dry-run prints) the traffic
// capture, as the injected init container runs it. The name is Istio's
// (istio-iptables); the default backend is nftables over netlink, which
// needs no binary in the image.
func iptablesCommand() *cobra.Command {
	var s capture.Settings
	var exclIn, exclOut, inclOut []uint
	var inPorts string
	var dryRun bool
	var mode, netns string
	var dnsServerList []string
	var uid, gid uint32
	var inPort, outPort uint16
	cmd := &cobra.Command{
		Use:   "iptables",
		Short: "Install the pod's traffic capture (nftables over netlink, or iptables-restore), or print it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if mode != modeNFTables && mode != modeIPTables {
				return fmt.Errorf("--mode %q: want %s or %s", mode, modeNFTables, modeIPTables)
			}
			s.ProxyUID, s.ProxyGID, s.InboundPort, s.OutboundPort = uid, gid, inPort, outPort
			var err error
			switch inPorts = strings.TrimSpace(inPorts); inPorts {
			case "*":
			case "":
				s.NoInbound = true
			default:
				var listed []uint
				for _, f := range strings.Split(inPorts, ",") {
					n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 16)
					if err != nil {
						return fmt.Errorf("--inbound-ports %q: want *, nothing, or ports separated by commas", inPorts)
					}
					listed = append(listed, uint(n))
				}
				if s.InboundPorts, err = ports("inbound-ports", listed); err != nil {
					return err
				}
			}
			if s.IncludeOutboundPorts, err = ports("include-outbound-ports", inclOut); err != nil {
				return err
			}
			if s.ExcludeInboundPorts, err = ports("exclude-inbound-ports", exclIn); err != nil {
				return err
			}
			if s.ExcludeOutboundPorts, err = ports("exclude-outbound-ports", exclOut); err != nil {
				return err
			}
			if s.RedirectDNS && !s.CaptureAllDNS {
				if s.DNSServers, err = dnsServers(dnsServerList, dns.ResolvConf); err != nil {
					return err
				}
				if len(s.DNSServers) == 0 {
					// As Istio's istio-iptables.
					cmd.PrintErrln("--redirect-dns is set, but --capture-all-dns is not and there are no DNS servers: DNS is not captured")
				}
			}
			plan, err := capture.Build(s)
			if err != nil {
				return err
			}
			switch {
			case dryRun && mode == modeIPTables:
				_, err = fmt.Fprint(cmd.OutOrStdout(), plan.IPTables()+plan.IP6Tables())
			case dryRun:
				_, err = fmt.Fprint(cmd.OutOrStdout(), plan.NFTables())
			case mode == modeIPTables:
				if err = capture.ApplyIPTables(cmd.Context(), plan.IPTables(), netns); err == nil && plan.IP6Tables() != "" {
					err = capture.ApplyIP6Tables(cmd.Context(), plan.IP6Tables(), netns)
				}
			default:
				err = capture.ApplyNFTables(plan, netns)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&dryRun, "dry-run", false, "print the rules instead of installing them (an nft script, or iptables-restore input)")
	f.StringVar(&mode, "mode", modeNFTables, "nftables: program the table inet istio-proxy-nat over netlink (no binary needed); iptables: the nat table with iptables-restore, which must be on the PATH")
	f.StringVar(&netns, "netns", "", "named network namespace to install them in (/run/netns/<name>); default the current one")
	f.Uint32Var(&uid, "proxy-uid", proxycontract.ProxyUID, "user the proxy runs as: its traffic is not captured")
	f.Uint32Var(&gid, "proxy-gid", proxycontract.ProxyGID, "group the proxy runs as")
	f.Uint16Var(&inPort, "inbound-capture-port", proxycontract.InboundCapturePort, "port of the proxy's inbound listener")
	f.Uint16Var(&outPort, "outbound-capture-port", proxycontract.OutboundCapturePort, "port of the proxy's outbound listener")
	f.StringVar(&inPorts, "inbound-ports", "*", "inbound TCP ports to capture, separated by commas: * for all, empty for none")
	f.UintSliceVar(&exclIn, "exclude-inbound-ports", nil, "inbound TCP ports never captured")
	f.StringSliceVar(&s.IncludeOutboundIPRanges, "include-outbound-ip-ranges", []string{"*"}, "outbound IPv4 ranges to capture: * for all, empty for none")
	f.StringSliceVar(&s.ExcludeOutboundIPRanges, "exclude-outbound-ip-ranges", nil, "outbound IPv4 ranges never captured")
	f.UintSliceVar(&exclOut, "exclude-outbound-ports", nil, "outbound TCP ports never captured")
	f.UintSliceVar(&inclOut, "include-outbound-ports", nil, "outbound TCP ports captured whatever their destination (but the excluded ranges)")
	f.StringSliceVar(&s.ExcludeInterfaces, "exclude-interfaces", nil, "interfaces through which nothing is captured")
	f.StringSliceVar(&s.RerouteInterfaces, "reroute-interfaces", nil, "interfaces whose arriving traffic to the included ranges goes to the proxy's outbound listener (KubeVirt VMs)")
	// Istio's istio-iptables reads the same variables.
	f.BoolVar(&s.RedirectDNS, "redirect-dns", envBool("REDIRECT_DNS") || envBool(proxycontract.DNSCaptureEnv),
		"capture the pod's DNS (UDP and TCP to port 53 of its resolvers, IPv4 and IPv6) to the agent's DNS proxy, not the proxy's own (default $REDIRECT_DNS or $"+proxycontract.DNSCaptureEnv+", which proxyMetadata sets)")
	f.BoolVar(&s.CaptureAllDNS, "capture-all-dns", envBool("CAPTURE_ALL_DNS"), "with --redirect-dns, capture DNS to port 53 of any address, not only the resolvers' (default $CAPTURE_ALL_DNS)")
	f.StringSliceVar(&dnsServerList, "dns-servers", nil, "with --redirect-dns, the resolvers whose DNS is captured (default the nameservers of "+dns.ResolvConf+")")
	f.Uint16Var(&s.DNSPort, "dns-proxy-port", capture.PortDNSProxy, "port of the agent's DNS proxy")
	return cmd
}

// dnsServers are the resolvers whose DNS is captured: those listed, else
// resolv.conf's.
func dnsServers(listed []string, resolvConf string) ([]netip.Addr, error) {
	if len(listed) == 0 {
		upstreams, _, err := dns.ReadResolvConf(resolvConf)
		if err != nil {
			return nil, fmt.Errorf("--redirect-dns: %w", err)
		}
		for _, u := range upstreams {
			host, _, _ := net.SplitHostPort(u)
			listed = append(listed, host)
		}
	}
	out := make([]netip.Addr, 0, len(listed))
	for _, s := range listed {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("--dns-servers: %q is not an IP address", s)
		}
		out = append(out, a)
	}
	return out, nil
}

// The capture backends.
const (
	modeNFTables = "nftables"
	modeIPTables = "iptables"
)

func ports(flag string, in []uint) ([]uint16, error) {
	out := make([]uint16, 0, len(in))
	for _, p := range in {
		if p == 0 || p > 65535 {
			return nil, fmt.Errorf("--%s: %d is not a port", flag, p)
		}
		out = append(out, uint16(p))
	}
	return out, nil
}
