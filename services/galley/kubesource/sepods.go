package kubesource

import (
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	kubenorm "github.com/flotilla-mesh/flotilla/internal/normalize/kube"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// A ServiceEntry's workloadSelector selects pods as well as
// WorkloadEntries, as in Istio (whose Kubernetes registry hands its pods
// to the ServiceEntry controller as workload instances): galley, which
// alone sees pods, publishes the selected pods of each such ServiceEntry
// as an EndpointSet of its own per host (kubenorm.ServiceEntryPods),
// beside the one of its inline endpoints and WorkloadEntries.

// publishServiceEntryPods (re)publishes the pod endpoints of the
// ServiceEntry id is (nil: deleted), and withdraws the sets it no longer
// has. Only what changed is sent. Must hold s.mu.
func (s *Source) publishServiceEntryPods(id istio.ID, se *istio.Object) {
	want := map[string]*registryv1.EndpointSet{}
	if se != nil {
		for _, set := range kubenorm.ServiceEntryPods(se, slices.Collect(maps.Values(s.pods[se.Meta.Namespace]))) {
			want[registry.EndpointSetName(set.GetServiceNamespace(), set.GetServiceHostname(), set.GetShard())] = set
		}
	}
	have := s.sePodSets[id]
	for name, set := range want {
		if old, ok := have[name]; !ok || !proto.Equal(old, set) {
			s.publish(registry.EndpointSetTypeURL, name, set)
		}
	}
	for name := range have {
		if _, ok := want[name]; !ok {
			s.remove(registry.EndpointSetTypeURL, name)
		}
	}
	if len(want) == 0 {
		delete(s.sePodSets, id)
	} else {
		s.sePodSets[id] = want
	}
	// The index a pod's change looks in: ServiceEntries that select.
	ns, _, _ := strings.Cut(id.Name, "/")
	if len(want) > 0 {
		if s.seSelecting[ns] == nil {
			s.seSelecting[ns] = map[istio.ID]*istio.Object{}
		}
		s.seSelecting[ns][id] = se
	} else if s.seSelecting[ns] != nil {
		delete(s.seSelecting[ns], id)
		if len(s.seSelecting[ns]) == 0 {
			delete(s.seSelecting, ns)
		}
	}
}

// refreshServiceEntryPods re-derives the pod endpoints of every
// ServiceEntry of namespace that selects workloads. Must hold s.mu.
func (s *Source) refreshServiceEntryPods(namespace string) {
	for id, o := range s.seSelecting[namespace] {
		s.publishServiceEntryPods(id, o)
	}
}
