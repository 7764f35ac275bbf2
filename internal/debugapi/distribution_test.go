package debugapi

import "testing"

func TestRequiredIsTheFirstPushHoldingTheVersionALaterGenerationOrTheDeletion(t *testing.T) {
	v := func(version string, push uint64) ObjectVersion { return ObjectVersion{Version: version, Push: push} }
	del := func(push uint64) ObjectVersion { return ObjectVersion{Deleted: true, Push: push} }
	tests := []struct {
		name    string
		history []ObjectVersion
		want    Want
		push    uint64
		ok      bool
		why     string
	}{
		{"the version itself", []ObjectVersion{v("3", 2), v("4", 5)}, Want{Version: "3"}, 2, true, ""},
		{"a generation skipped in a debounced push", []ObjectVersion{v("3", 2), v("6", 5)}, Want{Version: "5"}, 5, true, ""},
		{"a generation not there yet", []ObjectVersion{v("3", 2)}, Want{Version: "4"}, 0, false, "has version 3, not 4"},
		{"a content version matches exactly", []ObjectVersion{v("a1b2", 2), v("c3d4", 5)}, Want{Version: "c3d4"}, 5, true, ""},
		{"a content version is not ordered", []ObjectVersion{v("a1b2", 2)}, Want{Version: "ffff"}, 0, false, "has version a1b2, not ffff"},
		{"the latest", []ObjectVersion{v("3", 2), v("4", 5)}, Want{}, 5, true, ""},
		{"never had it", nil, Want{Version: "1"}, 0, false, "does not have the object"},
		{"never had it: deleted", nil, Want{Delete: true}, 0, true, ""},
		{"deleted", []ObjectVersion{v("3", 2), del(7)}, Want{Delete: true}, 7, true, ""},
		{"not deleted yet", []ObjectVersion{v("3", 2)}, Want{Delete: true}, 0, false, "still has version 3"},
		{"deleted, then created again", []ObjectVersion{v("3", 2), del(7), v("1", 9)}, Want{Delete: true}, 0, false, "was created again after its deletion (version 1)"},
		{"a version from before the deletion is not the object now", []ObjectVersion{v("3", 2), del(7), v("1", 9)}, Want{Version: "3"}, 0, false, "has version 1, not 3"},
		{"deleted: no version", []ObjectVersion{v("3", 2), del(7)}, Want{Version: "3"}, 0, false, "does not have the object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			push, ok, why := ObjectDistribution{History: tt.history}.Required(tt.want)
			if push != tt.push || ok != tt.ok || why != tt.why {
				t.Fatalf("Required(%+v) = %d, %v, %q; want %d, %v, %q", tt.want, push, ok, why, tt.push, tt.ok, tt.why)
			}
		})
	}
}

func TestADistributionSurvivesItsEncoding(t *testing.T) {
	d := ObjectDistribution{
		Object: "VirtualService/default/a", Push: 12,
		History: []ObjectVersion{{Version: "3", Push: 2}, {Deleted: true, Push: 12}},
		Proxies: []ProxyPush{{ID: "sidecar~10.0.0.1~a-1.default~default.svc.cluster.local", Namespace: "default", Push: 11}},
	}
	st, err := d.Struct()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseDistribution(st)
	if err != nil {
		t.Fatal(err)
	}
	if got.Object != d.Object || got.Push != 12 || len(got.History) != 2 || !got.History[1].Deleted || got.Proxies[0] != d.Proxies[0] {
		t.Fatalf("decoded %+v, want %+v", got, d)
	}
}
