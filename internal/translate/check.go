package translate

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// checkListeners repairs and validates listeners, sorted by name: one
// that fails, or has no filter chain left, or repeats a name, is dropped
// and reported.
func (g *gen) checkListeners(in []*listenerv3.Listener, packErrsBefore int) []*listenerv3.Listener {
	sortByName(in)
	out := []*listenerv3.Listener{}
	seen := map[string]bool{}
	for _, l := range in {
		err := g.repairListener(l, packErrsBefore)
		if err == nil {
			// The filter chains were validated one by one; validate the rest.
			chains := l.FilterChains
			l.FilterChains = nil
			err = g.valid(l, packErrsBefore)
			l.FilterChains = chains
		}
		if err == nil && seen[l.GetName()] {
			err = errors.New("duplicate name")
		}
		if err != nil {
			g.problem("listener %s dropped: %v", l.GetName(), err)
			continue
		}
		seen[l.GetName()] = true
		out = append(out, l)
	}
	return out
}

// repairRoutes keeps a bad part from taking the rest down: a virtual
// host that fails validation is dropped, a route that names a cluster the
// output lacks answers 503 instead, and a domain already claimed by an
// earlier virtual host is dropped from the later one.
func (g *gen) repairRoutes(rc *routev3.RouteConfiguration, packErrsBefore int) {
	n := 0
	for _, vh := range rc.GetVirtualHosts() {
		n += len(vh.GetDomains())
	}
	domains := make(map[string]bool, n)
	vhs := rc.VirtualHosts[:0]
	for _, vh := range rc.GetVirtualHosts() {
		if err := g.validVirtualHost(vh, packErrsBefore); err != nil {
			g.problem("route configuration %s: virtual host %s dropped: %v", rc.GetName(), vh.GetName(), err)
			continue
		}
		kept := vh.Domains[:0]
		for _, d := range vh.GetDomains() {
			if domains[d] {
				g.problem("route configuration %s: domain %q of %s is in an earlier virtual host; dropped", rc.GetName(), d, vh.GetName())
				continue
			}
			domains[d] = true
			kept = append(kept, d)
		}
		vh.Domains = kept
		if len(kept) == 0 {
			continue
		}
		for _, r := range vh.GetRoutes() {
			if err := g.routeClusters(r.GetRoute()); err != nil {
				g.problem("route configuration %s: virtual host %s route %s %v; answering 503", rc.GetName(), vh.GetName(), r.GetName(), err)
				r.Action = &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 503}}
			}
		}
		vhs = append(vhs, vh)
	}
	rc.VirtualHosts = vhs
}

// validVirtualHost validates a virtual host, each of its routes once per
// generator: virtual hosts share routes (a gateway's hosts of one
// VirtualService), which need not be validated again.
//
// go-control-plane checks each domain against ^[^\x00\n\r]*$ with a
// regular expression, which took a quarter of a gateway's RDS time: the
// same rule is checked here without one, and only when some domain
// breaks it (or there is none) does the generated validation see the
// domains, so the error is still the generated one.
func (g *gen) validVirtualHost(vh *routev3.VirtualHost, packErrsBefore int) error {
	routes, domains := vh.Routes, vh.Domains
	vh.Routes = nil
	if len(domains) > 0 && !slices.ContainsFunc(domains, func(d string) bool { return strings.ContainsAny(d, "\x00\n\r") }) {
		if g.validDomains == nil {
			g.validDomains = []string{"*"}
		}
		vh.Domains = g.validDomains // stands in for domains known to pass
	}
	err := g.valid(vh, packErrsBefore)
	vh.Routes, vh.Domains = routes, domains
	if err != nil {
		return err
	}
	if g.routeChecks == nil {
		g.routeChecks = map[*routev3.Route]error{}
	}
	for i, r := range routes {
		err, ok := g.routeChecks[r]
		if !ok {
			err = g.valid(r, packErrsBefore)
			g.routeChecks[r] = err
		}
		if err != nil {
			return fmt.Errorf("invalid VirtualHost.Routes[%d]: embedded message failed validation | caused by: %w", i, err)
		}
	}
	return nil
}

func (g *gen) routeClusters(ra *routev3.RouteAction) error {
	if ra == nil {
		return nil
	}
	check := func(name string) error {
		if !g.clusterOK(name) {
			return fmt.Errorf("names unknown cluster %q", name)
		}
		return nil
	}
	// A route that answers 500 for a cluster that is not there (the
	// Gateway API's missing backends) may name one; its mirrors may not.
	if ra.GetClusterNotFoundResponseCode() != routev3.RouteAction_INTERNAL_SERVER_ERROR {
		if c := ra.GetCluster(); c != "" {
			if err := check(c); err != nil {
				return err
			}
		}
		for _, w := range ra.GetWeightedClusters().GetClusters() {
			if err := check(w.GetName()); err != nil {
				return err
			}
		}
	}
	for _, m := range ra.GetRequestMirrorPolicies() {
		if err := check(m.GetCluster()); err != nil {
			return err
		}
	}
	return nil
}

// repairListener drops the filter chains that fail validation or name a
// cluster or route configuration the output lacks, or repeat an earlier
// chain's match, or its name where Envoy needs names unique (a listener
// with a filter chain matcher: Envoy accepts repeated names otherwise,
// and Istio's virtualInbound repeats "virtualInbound"); a listener left
// without chains is an error.
func (g *gen) repairListener(l *listenerv3.Listener, packErrsBefore int) error {
	if api := l.GetApiListener().GetApiListener(); api != nil {
		hcm := &hcmv3.HttpConnectionManager{}
		if err := api.UnmarshalTo(hcm); err != nil {
			return fmt.Errorf("api listener: %w", err)
		}
		return g.checkHCM(hcm)
	}
	var names map[string]bool
	if l.GetFilterChainMatcher() != nil {
		names = make(map[string]bool, len(l.GetFilterChains()))
	}
	matches := make(map[string]bool, len(l.GetFilterChains()))
	chains := l.FilterChains[:0]
	for _, fc := range l.GetFilterChains() {
		err := g.checkChain(fc, names, matches, packErrsBefore)
		if err != nil {
			g.problem("listener %s: filter chain %s dropped: %v", l.GetName(), fc.GetName(), err)
			continue
		}
		chains = append(chains, fc)
	}
	l.FilterChains = chains
	if len(chains) == 0 {
		return errors.New("no filter chain left")
	}
	return nil
}

func (g *gen) checkChain(fc *listenerv3.FilterChain, names, matches map[string]bool, packErrsBefore int) error {
	if err := g.valid(fc, packErrsBefore); err != nil {
		return err
	}
	if names != nil && names[fc.GetName()] {
		return errors.New("an earlier chain has this name")
	}
	key, err := proto.MarshalOptions{Deterministic: true}.Marshal(fc.GetFilterChainMatch())
	if err != nil {
		return fmt.Errorf("match: %w", err)
	}
	if matches[string(key)] {
		return errors.New("an earlier chain has the same match")
	}
	for _, f := range fc.GetFilters() {
		if err := g.checkFilter(f); err != nil {
			return err
		}
	}
	if names != nil {
		names[fc.GetName()] = true
	}
	matches[string(key)] = true
	return nil
}

func (g *gen) checkFilter(f *listenerv3.Filter) error {
	if err, ok := g.filterChecks[f.GetTypedConfig()]; ok {
		return err // checked when built (networkFilter)
	}
	switch f.GetName() {
	case tcpProxyFilter:
		tp := &tcpproxyv3.TcpProxy{}
		if err := f.GetTypedConfig().UnmarshalTo(tp); err != nil {
			return fmt.Errorf("tcp_proxy: %w", err)
		}
		return g.checkConfig(tp)
	case hcmFilter:
		hcm := &hcmv3.HttpConnectionManager{}
		if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
			return fmt.Errorf("http_connection_manager: %w", err)
		}
		return g.checkConfig(hcm)
	}
	return nil
}

// checkConfig checks a network filter's configuration: tcp_proxy names
// clusters the output has; an HTTP connection manager passes checkHCM.
func (g *gen) checkConfig(cfg proto.Message) error {
	switch c := cfg.(type) {
	case *tcpproxyv3.TcpProxy:
		tp := c
		names := []string{}
		if c := tp.GetCluster(); c != "" {
			names = append(names, c)
		}
		for _, w := range tp.GetWeightedClusters().GetClusters() {
			names = append(names, w.GetName())
		}
		for _, n := range names {
			if !g.clusterOK(n) {
				return fmt.Errorf("tcp_proxy names unknown cluster %q", n)
			}
		}
	case *hcmv3.HttpConnectionManager:
		return g.checkHCM(c)
	}
	return nil
}

// routeKnown reports whether a route configuration an HCM names is one
// the proxy gets (its flavour decides).
func (g *gen) routeKnown(name string) bool { return g.fl.routeKnown(g, name) }

// checkHCM: the router filter is last, RDS names a generated route
// configuration, and an inline one only names clusters the output has.
func (g *gen) checkHCM(hcm *hcmv3.HttpConnectionManager) error {
	fs := hcm.GetHttpFilters()
	if len(fs) == 0 || fs[len(fs)-1].GetName() != routerFilter {
		return errors.New("the router filter is not last")
	}
	if rds := hcm.GetRds(); rds != nil && !g.routeKnown(rds.GetRouteConfigName()) {
		return fmt.Errorf("RDS names unknown route configuration %q", rds.GetRouteConfigName())
	}
	if rc := hcm.GetRouteConfig(); rc != nil {
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if err := g.routeClusters(r.GetRoute()); err != nil {
					return fmt.Errorf("inline route %s: %w", r.GetName(), err)
				}
			}
		}
	}
	return nil
}

// networkFilter packs a network filter. Its consistency check
// (checkConfig) runs now, on the message at hand, so that checking the
// listener later needs no unpacking.
func (g *gen) networkFilter(name string, cfg proto.Message) *listenerv3.Filter {
	a := g.pack(cfg)
	if g.filterChecks == nil {
		g.filterChecks = map[*anypb.Any]error{}
	}
	g.filterChecks[a] = g.checkConfig(cfg)
	return &listenerv3.Filter{Name: name, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}
}
