package proxycontract

import "testing"

func TestANodeIDReadsBackAsItWasWritten(t *testing.T) {
	n := NodeID{Type: Sidecar, IP: "10.1.1.1", ID: PodID("app-7d9f", "default"), DNSDomain: PodDNSDomain("default", "cluster.local")}
	if got := n.String(); got != "sidecar~10.1.1.1~app-7d9f.default~default.svc.cluster.local" {
		t.Errorf("String() = %q", got)
	}
	if got, ok := ParseNodeID(n.String()); !ok || got != n {
		t.Errorf("ParseNodeID(%q) = %+v, %v", n.String(), got, ok)
	}
	for _, bad := range []string{"", "sidecar~10.1.1.1~app.default", "a~b~c~d~e"} {
		if _, ok := ParseNodeID(bad); ok {
			t.Errorf("ParseNodeID(%q) accepted", bad)
		}
	}
}

func TestAClusterNameReadsBackAsItWasWritten(t *testing.T) {
	for _, c := range []struct {
		dir          string
		port         uint32
		subset, host string
		name         string
	}{
		{Outbound, 80, "v1", "reviews.default.svc.cluster.local", "outbound|80|v1|reviews.default.svc.cluster.local"},
		{Inbound, 8080, "", "", "inbound|8080||"},
	} {
		if got := ClusterName(c.dir, c.port, c.subset, c.host); got != c.name {
			t.Errorf("ClusterName = %q, want %q", got, c.name)
		}
		dir, port, subset, host, ok := ParseClusterName(c.name)
		if !ok || dir != c.dir || port != c.port || subset != c.subset || host != c.host {
			t.Errorf("ParseClusterName(%q) = %q, %d, %q, %q, %v", c.name, dir, port, subset, host, ok)
		}
	}
	for _, bad := range []string{"BlackHoleCluster", "outbound|http||a", "sideways|80||a", "outbound|80|v1|a|b"} {
		if _, _, _, _, ok := ParseClusterName(bad); ok {
			t.Errorf("ParseClusterName(%q) accepted", bad)
		}
	}
}
