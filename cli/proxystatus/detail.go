package proxystatus

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/textdiff"
	// Also registers the Envoy types a config dump holds, to print them.
	"github.com/flotilla-mesh/flotilla/internal/translate"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// Detail is one proxy's state on its replica and what it lacks.
type Detail struct {
	connect.Row
	// Diff holds, per section (Clusters, Endpoints, Listeners, Routes,
	// Secrets), what the replica would send now against what the proxy
	// acknowledged.
	Diff []SectionDiff `json:"diff"`
}

// SectionDiff is one section's difference.
type SectionDiff struct {
	Section string `json:"section"`
	// Known is false when the replica cannot tell what the proxy holds
	// (it acknowledged a version from a push the replica no longer
	// holds): AckedVersion says which.
	Known        bool     `json:"known"`
	AckedVersion string   `json:"ackedVersion,omitempty"`
	Added        []string `json:"added,omitempty"`
	Removed      []string `json:"removed,omitempty"`
	Changed      []string `json:"changed,omitempty"`
	// Lines is a line diff of the changed resources' JSON ("-" what the
	// proxy holds, "+" what it would get).
	Lines []string `json:"lines,omitempty"`
}

// Match reports whether nothing differs.
func (d SectionDiff) Match() bool {
	return d.Known && len(d.Added)+len(d.Removed)+len(d.Changed) == 0
}

func showProxy(ctx context.Context, w io.Writer, cl *connect.Client, name, output string) error {
	r, err := cl.Locate(ctx, name)
	if err != nil {
		return err
	}
	now := cl.Fetch(ctx, r.Address, debugapi.ConfigDump, r.Proxy.ID)
	if now.Err != nil {
		return fmt.Errorf("config_dump of %s on %s: %w", r.Proxy.ID, r.Address, now.Err)
	}
	acked := cl.Fetch(ctx, r.Address, debugapi.AckedConfigDump, r.Proxy.ID)
	if acked.Err != nil {
		return fmt.Errorf("acked_config_dump of %s on %s: %w", r.Proxy.ID, r.Address, acked.Err)
	}
	d := Detail{Row: r}
	if d.Diff, err = diffDumps(acked.Resp, now.Resp); err != nil {
		return err
	}
	switch output {
	case "json":
		return writeJSON(w, d)
	case "yaml":
		return writeYAML(w, d)
	}
	return printDetail(w, d, time.Now())
}

func printDetail(w io.Writer, d Detail, now time.Time) error {
	p := d.Proxy
	var b strings.Builder
	fmt.Fprintf(&b, "Proxy:    %s\n", p.ID)
	fmt.Fprintf(&b, "Replica:  %s (%s)\n", d.Replica, d.Address)
	fmt.Fprintf(&b, "Revision: %s\n", d.Revision)
	if p.Identity != "" {
		fmt.Fprintf(&b, "Identity: %s\n", p.Identity)
	}
	kind := p.ProxyType
	if p.Generator == "grpc" {
		kind = "proxyless gRPC"
	}
	stream := "state of the world"
	if p.Delta {
		stream = "delta"
	}
	fmt.Fprintf(&b, "Kind:     %s, %s xDS, version %s, connected %s ago, push %s\n", kind, stream, cmp.Or(p.IstioVersion, "-"), age(now.Sub(p.ConnectedAt)), cmp.Or(p.PushVersion, "-"))
	if p.Telemetry != "" {
		fmt.Fprintf(&b, "Telemetry: %s\n", p.Telemetry)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tSTATUS\tACKED\tSENT\tRESOURCES")
	for _, c := range xdstype.InStatusOrder() {
		for _, t := range p.Types {
			if t.TypeURL == c.URL {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", c.Short, t.Status, cmp.Or(t.AckedVersion, "-"), cmp.Or(t.SentVersion, "-"), t.Resources)
			}
		}
	}
	_ = tw.Flush()
	for _, t := range p.Types {
		if t.Nack != "" {
			again := ""
			if t.NackRepeats > 0 {
				again = fmt.Sprintf(" (and %d times again since)", t.NackRepeats)
			}
			fmt.Fprintf(&b, "\n%s rejected version %s%s: %s\n", xdstype.Short(t.TypeURL), t.SentVersion, again, t.Nack)
		}
	}
	if len(p.Problems) > 0 {
		b.WriteString("\nDropped or degraded for this proxy:\n")
		for _, pr := range p.Problems {
			fmt.Fprintf(&b, "  %s\n", pr)
		}
	}
	b.WriteString("\n")
	for _, s := range d.Diff {
		switch {
		case !s.Known && s.AckedVersion == "":
			fmt.Fprintf(&b, "%s: nothing acknowledged yet\n", s.Section)
		case !s.Known:
			fmt.Fprintf(&b, "%s: cannot tell (the proxy acknowledged version %s, from a push this replica no longer holds)\n", s.Section, s.AckedVersion)
		case s.Match():
			fmt.Fprintf(&b, "%s Match\n", s.Section)
		default:
			fmt.Fprintf(&b, "%s Don't Match (- the proxy has, + its replica would send now)\n", s.Section)
			for _, n := range s.Added {
				fmt.Fprintf(&b, "  + %s\n", n)
			}
			for _, n := range s.Removed {
				fmt.Fprintf(&b, "  - %s\n", n)
			}
			for _, n := range s.Changed {
				fmt.Fprintf(&b, "  ~ %s\n", n)
			}
			for _, l := range s.Lines {
				fmt.Fprintf(&b, "    %s\n", l)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// section is one config dump section's resources by name, as indented
// JSON, and its version.
type section struct {
	name    string
	version string
	byName  map[string]string
}

// sectionsOf reads a config dump's sections; the acked dump's last one
// lists the type URLs it cannot tell (with the versions acknowledged).
func sectionsOf(resp *discoveryv3.DiscoveryResponse) (map[string]section, map[string]string, error) {
	out := map[string]section{}
	unknown := map[string]string{}
	for _, a := range resp.GetResources() {
		m, err := a.UnmarshalNew()
		if err != nil {
			return nil, nil, fmt.Errorf("config dump section %s: %w", a.GetTypeUrl(), err)
		}
		s := section{byName: map[string]string{}}
		add := func(name string, r *anypb.Any) error {
			if r == nil {
				return nil
			}
			b, err := protojson.Marshal(r)
			if err != nil {
				return fmt.Errorf("%s %s: %w", s.name, name, err)
			}
			var buf bytes.Buffer
			if err := json.Indent(&buf, b, "", "  "); err != nil {
				return fmt.Errorf("%s %s: %w", s.name, name, err)
			}
			s.byName[name] = buf.String()
			return nil
		}
		var errs []error
		switch d := m.(type) {
		case *adminv3.ClustersConfigDump:
			s.name, s.version = xdstype.Section(resourcev3.ClusterType), d.GetVersionInfo()
			for _, c := range d.GetDynamicActiveClusters() {
				errs = append(errs, add(nameOf(c.GetCluster()), c.GetCluster()))
			}
		case *adminv3.EndpointsConfigDump:
			s.name = xdstype.Section(resourcev3.EndpointType)
			for _, e := range d.GetDynamicEndpointConfigs() {
				errs = append(errs, add(nameOf(e.GetEndpointConfig()), e.GetEndpointConfig()))
			}
		case *adminv3.ListenersConfigDump:
			s.name, s.version = xdstype.Section(resourcev3.ListenerType), d.GetVersionInfo()
			for _, l := range d.GetDynamicListeners() {
				errs = append(errs, add(l.GetName(), l.GetActiveState().GetListener()))
			}
		case *adminv3.RoutesConfigDump:
			s.name = xdstype.Section(resourcev3.RouteType)
			for _, r := range d.GetDynamicRouteConfigs() {
				errs = append(errs, add(nameOf(r.GetRouteConfig()), r.GetRouteConfig()))
			}
		case *adminv3.SecretsConfigDump:
			s.name = xdstype.Section(resourcev3.SecretType)
			for _, r := range d.GetDynamicActiveSecrets() {
				errs = append(errs, add(r.GetName(), r.GetSecret()))
			}
		case *adminv3.EcdsConfigDump:
			s.name = xdstype.Section(resourcev3.ExtensionConfigType)
			for _, r := range d.GetEcdsFilters() {
				errs = append(errs, add(nameOf(r.GetEcdsFilter()), r.GetEcdsFilter()))
			}
		case *structpb.Struct:
			for k, v := range d.GetFields()[debugapi.MetadataUnknownTypes].GetStructValue().GetFields() {
				unknown[xdstype.Section(k)] = v.GetStringValue()
			}
			continue
		default:
			continue
		}
		if err := errors.Join(errs...); err != nil {
			return nil, nil, err
		}
		out[s.name] = s
	}
	return out, unknown, nil
}

// nameOf is the xDS name of a resource (translate.ResourceName).
func nameOf(a *anypb.Any) string {
	m, err := a.UnmarshalNew()
	if err != nil {
		return a.GetTypeUrl()
	}
	return cmp.Or(translate.ResourceName(m), a.GetTypeUrl())
}

// diffDumps compares, section by section, what the proxy acknowledged
// with what its replica would send now.
func diffDumps(ackedResp, nowResp *discoveryv3.DiscoveryResponse) ([]SectionDiff, error) {
	acked, unknown, err := sectionsOf(ackedResp)
	if err != nil {
		return nil, err
	}
	now, _, err := sectionsOf(nowResp)
	if err != nil {
		return nil, err
	}
	var out []SectionDiff
	for _, t := range xdstype.InStatusOrder() { // the sections in the order shown
		name := t.Section
		n := now[name]
		a, inAcked := acked[name]
		v, isUnknown := unknown[name]
		switch {
		case isUnknown:
			out = append(out, SectionDiff{Section: name, AckedVersion: v})
			continue
		case !inAcked:
			continue // a type the proxy does not watch
		}
		d := SectionDiff{Section: name, Known: true, AckedVersion: a.version}
		for k, j := range n.byName {
			old, ok := a.byName[k]
			switch {
			case !ok:
				d.Added = append(d.Added, k)
			case old != j:
				d.Changed = append(d.Changed, k)
			}
		}
		for k := range a.byName {
			if _, ok := n.byName[k]; !ok {
				d.Removed = append(d.Removed, k)
			}
		}
		slices.Sort(d.Added)
		slices.Sort(d.Removed)
		slices.Sort(d.Changed)
		for _, k := range d.Changed {
			d.Lines = append(d.Lines, "=== "+k)
			d.Lines = append(d.Lines, strings.Split(strings.TrimSuffix(textdiff.Diff(a.byName[k], n.byName[k]), "\n"), "\n")...)
		}
		out = append(out, d)
	}
	return out, nil
}
