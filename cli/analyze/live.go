package analyze

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// liveCollections are what analysis reads from galley: everything
// discovery reads but the credentials (which galley gives discovery
// alone).
func liveCollections() []string {
	return slices.DeleteFunc(model.TypeURLs(), func(t string) bool { return t == registry.CredentialTypeURL })
}

// Live is the configuration and registry galley serves, read once over
// MCP as discovery reads them (into the same store).
type Live struct {
	Store *model.Store
	// Rejected are resources that did not decode, as discovery would
	// refuse them.
	Rejected []error
	// Refused is what galley refuses to serve (debugapi.Rejections): its
	// proxies keep the last valid state of each, or never get it.
	Refused []debugapi.Rejection
}

// FetchLive reads galley's collections once and returns what they hold.
func FetchLive(ctx context.Context, conn *connect.Options) (*Live, error) {
	live := &Live{Store: model.NewStore()}
	_, err := conn.ReadGalley(ctx, "flotilla-analyze", liveCollections(), func(typeURL string, updated []*mcp.Resource, removed []string) {
		for _, r := range updated {
			if err := live.Store.Put(typeURL, r.Name, model.Meta{Labels: r.Labels, Annotations: r.Annotations, Created: r.Created, Version: r.ObjectVersion()}, r.Body); err != nil {
				live.Rejected = append(live.Rejected, err)
			}
		}
		for _, name := range removed {
			live.Store.Delete(typeURL, name)
		}
	})
	if err != nil {
		return nil, err
	}
	// An older galley does not say: nothing known refused.
	live.Refused, _ = conn.GalleyRejections(ctx)
	return live, nil
}

// LiveInput is the analysis input of galley's configuration with local
// files overlaid, as istioctl analyze overlays files on the cluster: an
// object of the files replaces the live one of the same kind and name, a
// Kubernetes Service of the files the live one of the same name.
func LiveInput(l *Live, f *Files, domainSuffix string) validation.Input {
	objects, services, endpoints, mesh := l.Store.Contents()
	overlaid := map[istio.ID]bool{}
	for _, o := range f.Objects {
		overlaid[o.ID()] = true
	}
	in := validation.Input{Mesh: mesh, DomainSuffix: domainSuffix, HaveServices: true, HaveWorkloads: true}
	in.Objects = slices.DeleteFunc(slices.Clone(objects), func(o *istio.Object) bool { return overlaid[o.ID()] })
	in.Admitted = make(map[istio.ID]bool, len(in.Objects))
	for _, o := range in.Objects {
		in.Admitted[o.ID()] = true
	}
	in.Objects = append(in.Objects, f.Objects...)
	// Analyze makes the ServiceEntries' Services from the objects, so
	// that an overlaid ServiceEntry counts as it is in the files.
	fromFiles := map[string]bool{}
	for _, s := range f.Services {
		fromFiles[registry.ServiceName(s.GetNamespace(), s.GetHostname())] = true
	}
	derived := map[string]bool{}
	for _, s := range services {
		key := registry.ServiceName(s.GetNamespace(), s.GetHostname())
		if s.GetSourceKind() == registryv1.SourceKind_SOURCE_KIND_SERVICE_ENTRY {
			derived[key] = true
			continue
		}
		if !fromFiles[key] {
			in.Services = append(in.Services, s)
		}
	}
	in.Services = append(in.Services, f.Services...)
	for _, es := range endpoints {
		if !derived[registry.ServiceName(es.GetServiceNamespace(), es.GetServiceHostname())] {
			in.Endpoints = append(in.Endpoints, es)
		}
	}
	in.Workloads = f.Workloads
	// A cluster's namespaces only: its apiserver labels every one with
	// its name (kubernetes.io/metadata.name). galley's file mode names
	// those its objects are in, labelled with nothing: no injection there
	// to check.
	in.Namespaces = map[string]map[string]string{}
	for name, labels := range l.Store.NamespaceLabels() {
		if _, cluster := labels[corev1.LabelMetadataName]; cluster {
			in.Namespaces[name] = labels
		}
	}
	maps.Copy(in.Namespaces, f.Namespaces)
	return in
}

// rejectedMessages reports what galley sent that does not decode.
func rejectedMessages(l *Live) []validation.Message {
	out := make([]validation.Message, 0, len(l.Rejected))
	for _, err := range l.Rejected {
		out = append(out, validation.Message{Code: validation.CodeUnreadable, Object: validation.Ref{Kind: "Galley"}, Text: err.Error()})
	}
	// What galley refuses: an object it names is invalid (FLT0101), a
	// document without one unreadable (FLT0100).
	for _, r := range l.Refused {
		m := validation.Message{Code: validation.CodeUnreadable, Object: validation.Ref{Kind: "Galley"}, Text: "galley refuses " + r.Message}
		if kind, key, ok := strings.Cut(r.Object, " "); ok {
			ns, name, _ := strings.Cut(key, "/")
			m.Code, m.Object = validation.CodeInvalid, validation.Ref{Kind: kind, Namespace: ns, Name: name}
		}
		out = append(out, m)
	}
	return out
}

var errNoInput = errors.New("no files to analyze: name files or directories (-f), or - for standard input, or analyze galley's configuration with --live")
