// Package workload is `flotilla x workload entry configure`: the files a
// VM (or any machine outside the cluster) needs to join the mesh as one
// of a WorkloadGroup's workloads, as istioctl's command of the same name
// writes them (istioctl/pkg/workload): cluster.env, mesh.yaml,
// root-cert.pem, istio-token and hosts. flotilla-agent reads them where
// Istio's VM package puts them (deploy/vm), and so does Istio's own agent.
package workload

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// The files, by name.
const (
	ClusterEnv = "cluster.env"
	MeshYAML   = "mesh.yaml"
	RootCert   = "root-cert.pem"
	Token      = "istio-token"
	Hosts      = "hosts"
)

// proxyConfigAnnotation is Istio's proxy.istio.io/config, read on the
// group and on its template's metadata.
const proxyConfigAnnotation = "proxy.istio.io/config"

// Inputs is what the files are made of.
type Inputs struct {
	// Group is the WorkloadGroup (its spec a *networking.WorkloadGroup).
	Group *istio.Object
	// Mesh is the mesh configuration (the istio ConfigMap's).
	Mesh *meshv1alpha1.MeshConfig
	// Injection is the revision's injection values: where discovery and
	// ca are, the trust domain and the cluster's name.
	Injection inject.Values
	// ClusterID overrides the injection values' cluster name.
	ClusterID string
	// Roots is the mesh's roots (PEM); Token the workload's token.
	Roots, Token []byte
	// IngressIP is where the VM reaches discovery and ca (the east-west
	// gateway's address); empty writes an empty hosts file.
	IngressIP string
	// InternalIP or ExternalIP, at most one, is the VM's own address
	// (ISTIO_SVC_IP).
	InternalIP, ExternalIP string
	// AutoRegister makes the agent register the workload
	// (ISTIO_META_AUTO_REGISTER_GROUP); CaptureDNS turns the DNS proxy
	// on (ISTIO_META_DNS_CAPTURE).
	AutoRegister, CaptureDNS bool
}

// Files returns the files, by name.
func Files(in Inputs) (map[string][]byte, error) {
	wg, ok := in.Group.Spec.(*networking.WorkloadGroup)
	if !ok {
		return nil, fmt.Errorf("%s is not a WorkloadGroup", in.Group.Kind.Kind)
	}
	if in.InternalIP != "" && in.ExternalIP != "" {
		return nil, errors.New("the internal and the external IP are mutually exclusive")
	}
	pc, err := proxyConfig(in, wg)
	if err != nil {
		return nil, err
	}
	mesh, err := meshYAML(pc)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		MeshYAML:   mesh,
		ClusterEnv: clusterEnv(in, wg, pc),
		RootCert:   in.Roots,
		Token:      in.Token,
		Hosts:      hosts(in),
	}
	return files, nil
}

// proxyConfig is the workload's proxy config (Istio's createMeshConfig):
// the mesh's default, with the group's proxy.istio.io/config laid over
// it, the group's probe as its readiness probe, and the workload's
// identity and labels in its proxy metadata.
func proxyConfig(in Inputs, wg *networking.WorkloadGroup) (*meshv1alpha1.ProxyConfig, error) {
	pc := &meshv1alpha1.ProxyConfig{}
	if d := in.Mesh.GetDefaultConfig(); d != nil {
		pc = proto.CloneOf(d)
	}
	for _, annotations := range []map[string]string{in.Group.Meta.Annotations, wg.GetMetadata().GetAnnotations()} {
		if text, ok := annotations[proxyConfigAnnotation]; ok {
			over, err := istio.ParseProxyConfig([]byte(text))
			if err != nil {
				return nil, fmt.Errorf("WorkloadGroup %s: %s: %w", in.Group.Key(), proxyConfigAnnotation, err)
			}
			proto.Merge(pc, over)
		}
	}
	if pc.GetDiscoveryAddress() == "" {
		pc.DiscoveryAddress = in.Injection.DiscoveryAddress
	}
	pc.ReadinessProbe = wg.GetProbe()
	labels := maps.Clone(wg.GetMetadata().GetLabels())
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, wg.GetTemplate().GetLabels()) // the template's win, as in Istio
	md := pc.GetProxyMetadata()
	if md == nil {
		md = map[string]string{}
	}
	name := in.Group.Meta.Name
	md["CANONICAL_SERVICE"], md["CANONICAL_REVISION"] = inject.CanonicalService(labels, name)
	md["POD_NAMESPACE"] = in.Group.Meta.Namespace
	md["SERVICE_ACCOUNT"] = wg.GetTemplate().GetServiceAccount()
	md["TRUST_DOMAIN"] = cmpOr(in.Mesh.GetTrustDomain(), in.Injection.TrustDomain)
	md["ISTIO_META_CLUSTER_ID"] = cmpOr(in.ClusterID, in.Injection.ClusterID)
	md["ISTIO_META_MESH_ID"] = pc.GetMeshId()
	md["ISTIO_META_NETWORK"] = wg.GetTemplate().GetNetwork()
	if ports := podPorts(wg.GetTemplate().GetPorts()); ports != "" {
		md["ISTIO_META_POD_PORTS"] = ports
	}
	md["ISTIO_META_WORKLOAD_NAME"] = name
	labels["service.istio.io/canonical-name"] = md["CANONICAL_SERVICE"]
	labels["service.istio.io/canonical-revision"] = md["CANONICAL_REVISION"]
	b, err := json.Marshal(labels)
	if err != nil {
		return nil, err
	}
	md["ISTIO_METAJSON_LABELS"] = string(b)
	if in.CaptureDNS {
		md["ISTIO_META_DNS_CAPTURE"] = "true"
	}
	if in.AutoRegister {
		md["ISTIO_META_AUTO_REGISTER_GROUP"] = name
	}
	pc.ProxyMetadata = md
	return pc, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// podPorts is ISTIO_META_POD_PORTS of the template's ports: [{name,
// containerPort}] by name (Istio's marshalWorkloadEntryPodPorts).
func podPorts(ports map[string]uint32) string {
	type podPort struct {
		Name          string `json:"name,omitempty"`
		ContainerPort uint32 `json:"containerPort"`
	}
	var out []podPort
	for _, name := range slices.Sorted(maps.Keys(ports)) {
		out = append(out, podPort{Name: name, ContainerPort: ports[name]})
	}
	if len(out) == 0 {
		return ""
	}
	b, err := json.Marshal(out)
	if err != nil {
		return ""
	}
	return string(b)
}

// meshYAML is mesh.yaml: {defaultConfig: the proxy config}.
func meshYAML(pc *meshv1alpha1.ProxyConfig) ([]byte, error) {
	js, err := protojson.Marshal(pc)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		return nil, err
	}
	return yaml.Marshal(map[string]any{"defaultConfig": m})
}

// clusterEnv is cluster.env (Istio's createClusterEnv): the proxy
// metadata, then what the capture and the agent read — the inbound ports
// (the template's, else all), the ports never captured (ssh, Envoy's
// Prometheus and health ports, the agent's status port), the service
// and namespace, where discovery and ca are (Flotilla's agent reaches
// each: the split) — one KEY=value per line, values quoted for a shell.
func clusterEnv(in Inputs, wg *networking.WorkloadGroup, pc *meshv1alpha1.ProxyConfig) []byte {
	var ports []string
	for _, p := range slices.Sorted(maps.Values(wg.GetTemplate().GetPorts())) {
		ports = append(ports, strconv.FormatUint(uint64(p), 10))
	}
	inbound := "*"
	if len(ports) > 0 {
		inbound = strings.Join(ports, ",")
	}
	exclude := "22,15090,15021"
	if sp := pc.GetStatusPort(); sp != 15090 && sp != 15021 {
		if sp == 0 {
			sp = 15020
		}
		exclude += "," + strconv.Itoa(int(sp))
	}
	env := maps.Clone(pc.GetProxyMetadata())
	maps.Copy(env, map[string]string{
		"ISTIO_INBOUND_PORTS":       inbound,
		"ISTIO_NAMESPACE":           in.Group.Meta.Namespace,
		"ISTIO_SERVICE":             in.Group.Meta.Name + "." + in.Group.Meta.Namespace,
		"ISTIO_SERVICE_CIDR":        "*",
		"ISTIO_LOCAL_EXCLUDE_PORTS": exclude,
		"SERVICE_ACCOUNT":           wg.GetTemplate().GetServiceAccount(),
		"DISCOVERY_ADDRESS":         pc.GetDiscoveryAddress(),
		"CA_ADDRESS":                in.Injection.CAAddress,
		"CLUSTER_ID":                cmpOr(in.ClusterID, in.Injection.ClusterID),
	})
	switch {
	case in.InternalIP != "":
		env["ISTIO_SVC_IP"] = in.InternalIP
	case in.ExternalIP != "":
		env["ISTIO_SVC_IP"] = in.ExternalIP
		env["REWRITE_PROBE_LEGACY_LOCALHOST_DESTINATION"] = "true"
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(env)) {
		fmt.Fprintf(&b, "%s=%s\n", k, shellQuote(env[k]))
	}
	return []byte(b.String())
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellQuote quotes a value for a POSIX shell (and systemd's
// EnvironmentFile), as istioctl's shellescape.Quote does.
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}

// hosts maps discovery's and ca's names to the address the VM reaches
// them at (Istio's createHosts maps istiod's); empty without one.
func hosts(in Inputs) []byte {
	if _, err := netip.ParseAddr(in.IngressIP); err != nil {
		return nil
	}
	var names []string
	for _, addr := range []string{in.Injection.DiscoveryAddress, in.Injection.CAAddress} {
		host, _, err := net.SplitHostPort(addr)
		if err != nil || net.ParseIP(host) != nil || slices.Contains(names, host) {
			continue
		}
		names = append(names, host)
	}
	if len(names) == 0 {
		return nil
	}
	return []byte(in.IngressIP + " " + strings.Join(names, " ") + "\n")
}
