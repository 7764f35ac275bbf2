package proxystatus

import (
	"strings"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
)

func anyOf(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func clusters(t *testing.T, cs ...*clusterv3.Cluster) *adminv3.ClustersConfigDump {
	t.Helper()
	d := &adminv3.ClustersConfigDump{}
	for _, c := range cs {
		d.DynamicActiveClusters = append(d.DynamicActiveClusters, &adminv3.ClustersConfigDump_DynamicCluster{Cluster: anyOf(t, c)})
	}
	return d
}

func response(t *testing.T, sections ...proto.Message) *discoveryv3.DiscoveryResponse {
	t.Helper()
	r := &discoveryv3.DiscoveryResponse{}
	for _, s := range sections {
		r.Resources = append(r.Resources, anyOf(t, s))
	}
	return r
}

func TestTheDifferenceNamesWhatIsAddedRemovedAndChangedLineByLine(t *testing.T) {
	a := &clusterv3.Cluster{Name: "a", ConnectTimeout: durationpb.New(time.Second)}
	a2 := &clusterv3.Cluster{Name: "a", ConnectTimeout: durationpb.New(5 * time.Second)}
	b, c := &clusterv3.Cluster{Name: "b"}, &clusterv3.Cluster{Name: "c"}
	unknown, _ := structpb.NewStruct(map[string]any{debugapi.MetadataUnknownTypes: map[string]any{resourcev3.ListenerType: "v7"}})
	diff, err := diffDumps(response(t, clusters(t, a, b), unknown), response(t, clusters(t, a2, c), &adminv3.ListenersConfigDump{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(diff) != 2 || diff[0].Section != "Clusters" || diff[1].Section != "Listeners" {
		t.Fatalf("sections %+v", diff)
	}
	cd := diff[0]
	if cd.Match() || strings.Join(cd.Added, ",") != "c" || strings.Join(cd.Removed, ",") != "b" || strings.Join(cd.Changed, ",") != "a" {
		t.Fatalf("clusters: %+v", cd)
	}
	lines := strings.Join(cd.Lines, "\n")
	if !strings.Contains(lines, `-   "connectTimeout": "1s"`) || !strings.Contains(lines, `+   "connectTimeout": "5s"`) {
		t.Fatalf("line diff:\n%s", lines)
	}
	if ld := diff[1]; ld.Known || ld.AckedVersion != "v7" {
		t.Fatalf("listeners the replica cannot tell: %+v", ld)
	}
	var out strings.Builder
	if err := printDetail(&out, Detail{Row: connect.Row{Replica: "r1", Address: "a:1"}, Diff: diff}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"Clusters Don't Match", "  + c", "  - b", "  ~ a", "Listeners: cannot tell (the proxy acknowledged version v7"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("detail lacks %q:\n%s", w, out.String())
		}
	}
	same, err := diffDumps(response(t, clusters(t, a)), response(t, clusters(t, a)))
	if err != nil || len(same) != 1 || !same[0].Match() {
		t.Fatalf("the same clusters: %+v %v", same, err)
	}
}
