// Package proxy identifies the proxies that connect to discovery from what
// they send first: an Istio-style node ID ("sidecar~10.1.1.1~app-7d9f.default~default.svc.cluster.local")
// and node metadata (NAMESPACE, LABELS, ISTIO_VERSION, CLUSTER_ID,
// SERVICE_ACCOUNT, GENERATOR, INSTANCE_IPS, PROXY_CONFIG), in the forms of
// internal/proxycontract, which the agent writes them by. Bad input is an
// error that says what is wrong, for the stream to return, never a crash.
package proxy

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Proxy is the identity parsed from a node.
type Proxy = model.Proxy

// Type is what kind of proxy connects.
type Type = model.ProxyType

// Proxy types and generators.
const (
	Sidecar       = model.SidecarProxy
	Router        = model.RouterProxy
	GeneratorGRPC = model.GeneratorGRPC
)

// LocalityLabel on a workload sets its locality, "region.zone.subzone",
// when its node does not say (Istio's istio-locality label).
const LocalityLabel = "istio-locality"

// Limits on what a node may send.
const (
	maxNodeID  = 1024
	maxLabels  = proxycontract.MaxLabels
	maxIPs     = 16
	maxLabelLn = 512
	// maxProxyConfig bounds PROXY_CONFIG, as JSON.
	maxProxyConfig = 64 << 10
)

// FromNode parses a node.
func FromNode(node *corev3.Node) (*Proxy, error) {
	if node == nil {
		return nil, errors.New("no node in the request")
	}
	p, err := ParseID(node.GetId())
	if err != nil {
		return nil, err
	}
	if err := applyMetadata(p, node.GetMetadata().GetFields()); err != nil {
		return nil, fmt.Errorf("node %q metadata: %w", node.GetId(), err)
	}
	if p.Namespace == "" {
		return nil, fmt.Errorf("node %q: no namespace (set %s metadata or use an id of the form pod.namespace)", node.GetId(), proxycontract.MetadataNamespace)
	}
	if err := applyLocality(p, node.GetLocality()); err != nil {
		return nil, fmt.Errorf("node %q: %w", node.GetId(), err)
	}
	p.ServiceCluster = node.GetCluster()
	p.IstioTelemetry = hasExtensions(node, proxycontract.IstioTelemetryTypeURLs)
	for _, f := range []struct{ name, v string }{{"cluster", p.ServiceCluster}, {proxycontract.MetadataMeshID, p.MeshID}, {proxycontract.MetadataClusterID, p.ClusterID}} {
		if len(f.v) > maxLabelLn {
			return nil, fmt.Errorf("node %q: %s is %d bytes, more than %d", node.GetId(), f.name, len(f.v), maxLabelLn)
		}
	}
	return p, nil
}

// applyLocality takes the node's locality, else the workload's
// istio-locality label ("region.zone.subzone", Istio's override).
func applyLocality(p *Proxy, l *corev3.Locality) error {
	p.Locality = model.Locality{Region: l.GetRegion(), Zone: l.GetZone(), Subzone: l.GetSubZone()}
	if p.Locality.IsZero() {
		if v := p.Labels[LocalityLabel]; v != "" {
			parts := append(strings.SplitN(v, ".", 3), "", "")
			p.Locality = model.Locality{Region: parts[0], Zone: parts[1], Subzone: parts[2]}
		}
	}
	if n := len(p.Locality.Region) + len(p.Locality.Zone) + len(p.Locality.Subzone); n > maxLabelLn {
		return fmt.Errorf("locality is %d bytes, more than %d", n, maxLabelLn)
	}
	return nil
}

// ParseID parses "type~ip~id~domain".
func ParseID(id string) (*Proxy, error) {
	if len(id) > maxNodeID {
		return nil, fmt.Errorf("node id is %d bytes, more than %d", len(id), maxNodeID)
	}
	n, ok := proxycontract.ParseNodeID(id)
	if !ok {
		return nil, fmt.Errorf("node id %q: want type~ip~id~domain, e.g. sidecar~10.1.1.1~app-7d9f.default~default.svc.cluster.local", id)
	}
	p := &Proxy{Type: Type(n.Type), ID: n.ID, DNSDomain: n.DNSDomain}
	switch p.Type {
	case Sidecar, Router:
	default:
		return nil, fmt.Errorf("node id %q: unknown proxy type %q (want %s or %s)", id, n.Type, Sidecar, Router)
	}
	ip, err := netip.ParseAddr(n.IP)
	if err != nil {
		return nil, fmt.Errorf("node id %q: %q is not an IP address", id, n.IP)
	}
	p.IPs = []netip.Addr{ip}
	if p.ID == "" {
		return nil, fmt.Errorf("node id %q: the id part is empty", id)
	}
	if _, ns, ok := strings.Cut(p.ID, "."); ok && ns != "" {
		p.Namespace = ns
	}
	return p, nil
}

func applyMetadata(p *Proxy, md map[string]*structpb.Value) error {
	str := func(key string) (string, error) {
		v, ok := md[key]
		if !ok {
			return "", nil
		}
		s, ok := v.GetKind().(*structpb.Value_StringValue)
		if !ok {
			return "", fmt.Errorf("%s must be a string", key)
		}
		return s.StringValue, nil
	}
	var err error
	fields := []struct {
		key string
		dst *string
	}{
		{proxycontract.MetadataIstioVersion, &p.IstioVersion},
		{proxycontract.MetadataClusterID, &p.ClusterID},
		{proxycontract.MetadataMeshID, &p.MeshID},
		{proxycontract.MetadataServiceAccount, &p.ServiceAccount},
		{proxycontract.MetadataGenerator, &p.Generator},
	}
	for _, f := range fields {
		if *f.dst, err = str(f.key); err != nil {
			return err
		}
	}
	ns, err := str(proxycontract.MetadataNamespace)
	if err != nil {
		return err
	}
	if ns != "" {
		p.Namespace = ns
	}
	if p.Generator != "" && p.Generator != GeneratorGRPC {
		return fmt.Errorf("%s %q is not supported (only %q)", proxycontract.MetadataGenerator, p.Generator, GeneratorGRPC)
	}
	if v, ok := md[proxycontract.MetadataLabels]; ok {
		st := v.GetStructValue()
		if st == nil {
			return fmt.Errorf("%s must be a map of strings", proxycontract.MetadataLabels)
		}
		if len(st.GetFields()) > maxLabels {
			return fmt.Errorf("%s has %d entries, more than %d", proxycontract.MetadataLabels, len(st.GetFields()), maxLabels)
		}
		p.Labels = make(map[string]string, len(st.GetFields()))
		for k, lv := range st.GetFields() {
			s, ok := lv.GetKind().(*structpb.Value_StringValue)
			if !ok {
				return fmt.Errorf("%s[%s] must be a string", proxycontract.MetadataLabels, k)
			}
			if len(k)+len(s.StringValue) > maxLabelLn {
				return fmt.Errorf("%s[%s] is longer than %d bytes", proxycontract.MetadataLabels, k, maxLabelLn)
			}
			p.Labels[k] = s.StringValue
		}
	}
	if v, ok := md[proxycontract.MetadataProxyConfig]; ok {
		if p.ProxyConfig, err = proxyConfig(v); err != nil {
			return err
		}
	}
	p.Metadata = stringFields(md)
	ips, err := str(proxycontract.MetadataInstanceIPs)
	if err != nil {
		return err
	}
	if ips != "" {
		list := strings.Split(ips, ",")
		if len(list) > maxIPs {
			return fmt.Errorf("%s has %d addresses, more than %d", proxycontract.MetadataInstanceIPs, len(list), maxIPs)
		}
		for _, s := range list {
			ip, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil {
				return fmt.Errorf("%s: %q is not an IP address", proxycontract.MetadataInstanceIPs, s)
			}
			if !slices.Contains(p.IPs, ip) {
				p.IPs = append(p.IPs, ip)
			}
		}
	}
	return nil
}

// proxyConfig reads PROXY_CONFIG: a JSON object of Istio's ProxyConfig
// (fields this Istio API does not know are left out, as a newer agent's
// may send them), at most maxProxyConfig bytes of it.
func proxyConfig(v *structpb.Value) (*meshv1alpha1.ProxyConfig, error) {
	if v.GetStructValue() == nil {
		return nil, fmt.Errorf("%s must be an object", proxycontract.MetadataProxyConfig)
	}
	if n := proto.Size(v); n > maxProxyConfig {
		return nil, fmt.Errorf("%s is %d bytes, more than %d", proxycontract.MetadataProxyConfig, n, maxProxyConfig)
	}
	js, err := protojson.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", proxycontract.MetadataProxyConfig, err)
	}
	pc := &meshv1alpha1.ProxyConfig{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(js, pc); err != nil {
		return nil, fmt.Errorf("%s is not a proxy config: %w", proxycontract.MetadataProxyConfig, err)
	}
	return pc, nil
}

// stringFields keeps the metadata's string fields for EnvoyFilter proxy
// matches: at most maxLabels of them (by key order), each key and value
// together at most maxLabelLn bytes; longer ones (Istio's agent sends
// some long JSON strings) are left out, so a match on them fails.
func stringFields(md map[string]*structpb.Value) map[string]string {
	var out map[string]string
	for _, k := range slices.Sorted(maps.Keys(md)) {
		s, ok := md[k].GetKind().(*structpb.Value_StringValue)
		if !ok || len(k)+len(s.StringValue) > maxLabelLn {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = s.StringValue
		if len(out) == maxLabels {
			break
		}
	}
	return out
}

// hasExtensions reports whether a node lists, among its extensions, one
// configured by each of the type URLs (with or without
// "type.googleapis.com/").
func hasExtensions(node *corev3.Node, typeURLs []string) bool {
	found := map[string]bool{}
	for _, e := range node.GetExtensions() {
		if e.GetDisabled() {
			continue
		}
		for _, u := range e.GetTypeUrls() {
			u = strings.TrimPrefix(u, "type.googleapis.com/")
			if slices.Contains(typeURLs, u) {
				found[u] = true
			}
		}
	}
	return len(found) == len(typeURLs)
}
