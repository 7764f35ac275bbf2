// Package proxy identifies the proxies that connect to discovery from what
// they send first: an Istio-style node ID ("sidecar~10.1.1.1~app-7d9f.default~default.svc.cluster.local")
// and node metadata (NAMESPACE, LABELS, ISTIO_VERSION, CLUSTER_ID,
// SERVICE_ACCOUNT, GENERATOR, INSTANCE_IPS). Bad input is an error that says
// what is wrong, for the stream to return, never a crash.
package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/internal/model"
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
	maxLabels  = 256
	maxIPs     = 16
	maxLabelLn = 512
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
		return nil, fmt.Errorf("node %q: no namespace (set NAMESPACE metadata or use an id of the form pod.namespace)", node.GetId())
	}
	if err := applyLocality(p, node.GetLocality()); err != nil {
		return nil, fmt.Errorf("node %q: %w", node.GetId(), err)
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
	parts := strings.Split(id, "~")
	if len(parts) != 4 {
		return nil, fmt.Errorf("node id %q: want type~ip~id~domain, e.g. sidecar~10.1.1.1~app-7d9f.default~default.svc.cluster.local", id)
	}
	p := &Proxy{Type: Type(parts[0]), ID: parts[2], DNSDomain: parts[3]}
	switch p.Type {
	case Sidecar, Router:
	default:
		return nil, fmt.Errorf("node id %q: unknown proxy type %q (want sidecar or router)", id, parts[0])
	}
	ip, err := netip.ParseAddr(parts[1])
	if err != nil {
		return nil, fmt.Errorf("node id %q: %q is not an IP address", id, parts[1])
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
		{"ISTIO_VERSION", &p.IstioVersion},
		{"CLUSTER_ID", &p.ClusterID},
		{"SERVICE_ACCOUNT", &p.ServiceAccount},
		{"GENERATOR", &p.Generator},
	}
	for _, f := range fields {
		if *f.dst, err = str(f.key); err != nil {
			return err
		}
	}
	ns, err := str("NAMESPACE")
	if err != nil {
		return err
	}
	if ns != "" {
		p.Namespace = ns
	}
	if p.Generator != "" && p.Generator != GeneratorGRPC {
		return fmt.Errorf("GENERATOR %q is not supported (only %q)", p.Generator, GeneratorGRPC)
	}
	if v, ok := md["LABELS"]; ok {
		st := v.GetStructValue()
		if st == nil {
			return errors.New("LABELS must be a map of strings")
		}
		if len(st.GetFields()) > maxLabels {
			return fmt.Errorf("LABELS has %d entries, more than %d", len(st.GetFields()), maxLabels)
		}
		p.Labels = make(map[string]string, len(st.GetFields()))
		for k, lv := range st.GetFields() {
			s, ok := lv.GetKind().(*structpb.Value_StringValue)
			if !ok {
				return fmt.Errorf("LABELS[%s] must be a string", k)
			}
			if len(k)+len(s.StringValue) > maxLabelLn {
				return fmt.Errorf("LABELS[%s] is longer than %d bytes", k, maxLabelLn)
			}
			p.Labels[k] = s.StringValue
		}
	}
	ips, err := str("INSTANCE_IPS")
	if err != nil {
		return err
	}
	if ips != "" {
		list := strings.Split(ips, ",")
		if len(list) > maxIPs {
			return fmt.Errorf("INSTANCE_IPS has %d addresses, more than %d", len(list), maxIPs)
		}
		for _, s := range list {
			ip, err := netip.ParseAddr(strings.TrimSpace(s))
			if err != nil {
				return fmt.Errorf("INSTANCE_IPS: %q is not an IP address", s)
			}
			if !slices.Contains(p.IPs, ip) {
				p.IPs = append(p.IPs, ip)
			}
		}
	}
	return nil
}
