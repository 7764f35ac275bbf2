package wait

import (
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

func TestWithoutGalleyTheVersionIsTheOneTheReplicasAgreeOnOrTheLatestGeneration(t *testing.T) {
	k, _ := istio.ByName("VirtualService")
	tg := target{kind: k, namespace: "default", name: "reviews"}
	for _, tt := range []struct {
		latest  map[string]string
		want    string
		wantErr string
	}{
		{map[string]string{"r1": "a1b2", "r2": "a1b2"}, "a1b2", ""},
		{map[string]string{"r1": "3", "r2": "5"}, "5", ""},
		{map[string]string{"r1": "a1b2", "r2": "c3d4"}, "", "the replicas hold different versions of VirtualService default/reviews (a1b2, c3d4)"},
		{map[string]string{}, "", "no discovery replica has VirtualService default/reviews"},
	} {
		got, err := latestVersion(tg, tt.latest)
		if got != tt.want || (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("latestVersion(%v) = %q, %v; want %q, %q", tt.latest, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestTheTimeoutNamesWhatIsBehindUpToALimit(t *testing.T) {
	k, _ := istio.ByName("DestinationRule")
	w := &waiter{t: target{kind: k, namespace: "default", name: "dr"}}
	tl := tally{done: 1, waiting: []behind{{replica: "r2", why: "it has version 3, not 4"}}}
	for i := range maxListed + 5 {
		tl.waiting = append(tl.waiting, behind{proxy: "sidecar~10.0.0.1~p" + string(rune('a'+i)) + ".default~default.svc.cluster.local", replica: "r1", why: "holds push 1"})
	}
	msg := w.timedOut(tl).Error()
	for _, want := range []string{
		"is held by 1 of 26 proxies; behind:",
		"\n  replica r2: it has version 3, not 4", // a replica first, then proxies by name
		"\n  pa.default (on r1): holds push 1",
		"\n  … and 6 more",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the timeout says\n%s\nwithout %q", msg, want)
		}
	}
}
