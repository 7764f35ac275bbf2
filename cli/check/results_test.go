package check

import (
	"cmp"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"
	admregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

var now = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// want checks one result: its status, and that its text (and fix) hold
// the given parts.
func want(t *testing.T, got Result, status Status, text, fix string) {
	t.Helper()
	if got.Status != status || !strings.Contains(got.Text, text) || !strings.Contains(got.Fix, fix) {
		t.Errorf("got %+v; want status %d, text with %q, fix with %q", got, status, text, fix)
	}
}

func TestASubscriberIsCurrentUnlessItRejectedOrLeftAResponseUnansweredTooLong(t *testing.T) {
	for name, c := range map[string]struct {
		sub    debugapi.Subscriber
		status Status
		text   string
		fix    string
	}{
		"current": {debugapi.Subscriber{Version: "v1"}, Passed, "x v1 is subscribed to galley and current", ""},
		"applying a change sent a moment ago": {
			debugapi.Subscriber{Unanswered: map[string]time.Time{"t/VirtualService": now.Add(-2 * time.Second)}}, Passed, "current", "",
		},
		"silent for a minute": {
			debugapi.Subscriber{Unanswered: map[string]time.Time{"t/VirtualService": now.Add(-time.Minute)}},
			Failed,
			"x has not applied galley's latest t/VirtualService for 1m0s", "restart it",
		},
		"rejected": {
			debugapi.Subscriber{Rejected: map[string]string{"t/Gateway": "bad port"}}, Failed, "x rejected galley's t/Gateway: bad port", "flotilla analyze --live",
		},
	} {
		t.Run(name, func(t *testing.T) { want(t, subscription("x", c.sub, now), c.status, c.text, c.fix) })
	}
}

func TestGalleyWithoutAnInjectorWarnsThatPodsGoWithoutSidecars(t *testing.T) {
	g := debugapi.NewReplica("flotilla-galley", "galley-0", "v1")
	got := galleyResults(g, []debugapi.Subscriber{{ID: "discovery~d1"}}, now)
	if len(got) != 2 {
		t.Fatalf("%+v", got)
	}
	want(t, got[0], Passed, "galley v1 (replica galley-0) answers, 1 subscribers", "")
	want(t, got[1], Warning, "no injector is subscribed to galley", "without sidecars")
	got = galleyResults(g, []debugapi.Subscriber{{ID: "injector~inj-1", Version: "v1"}}, now)
	want(t, got[1], Passed, "injector inj-1 v1 is subscribed to galley and current", "")
}

func syncz(t *testing.T, proxies ...debugapi.ProxySync) *discoveryv3.DiscoveryResponse {
	t.Helper()
	resp := &discoveryv3.DiscoveryResponse{}
	for _, p := range proxies {
		a, err := anypb.New(p.ClientConfig())
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	return resp
}

func TestEachReplicaAnswersIsSubscribedAndItsRejectingProxiesAreNamed(t *testing.T) {
	r1 := debugapi.NewReplica("flotilla-discovery", "r1", "v1")
	r2 := debugapi.NewReplica("flotilla-discovery", "r2", "v1")
	nacking := debugapi.ProxySync{ID: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", Types: []debugapi.TypeSync{{TypeURL: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Status: debugapi.Nacked}}}
	answers := []connect.Answer{
		{Address: "a:1", Replica: r1, Resp: syncz(t, nacking, debugapi.ProxySync{ID: "sidecar~10.0.0.2~b.ns~ns.svc.cluster.local"})},
		{Address: "a:2", Replica: r2, Resp: syncz(t)},
		{Address: "a:3", Err: errors.New("rpc error: x509: certificate has expired or is not yet valid")},
		{Address: "a:4", Err: errors.New("connection refused")},
	}
	got := discoveryResults(answers, []debugapi.Subscriber{{ID: "discovery~r1", Version: "v1"}}, true, now)
	if len(got) != 7 {
		t.Fatalf("%d results: %+v", len(got), got)
	}
	want(t, got[0], Passed, "discovery r1 v1 answers at a:1, 2 proxies", "")
	want(t, got[1], Passed, "discovery r1 v1 is subscribed to galley and current", "")
	want(t, got[2], Warning, "discovery r1: 1 proxies rejected their configuration: sidecar~10.0.0.1~a.ns", "flotilla proxy-status")
	want(t, got[3], Passed, "discovery r2 v1 answers at a:2, 0 proxies", "")
	want(t, got[4], Failed, "discovery r2 is not subscribed to galley", "--galley-address")
	want(t, got[5], Failed, "discovery at a:3 does not answer", "certificate has expired")
	want(t, got[6], Failed, "discovery at a:4 does not answer: connection refused", "running and reachable")

	// Galley did not answer: its subscriptions are not judged.
	if got := discoveryResults(answers[1:2], nil, false, now); len(got) != 1 || got[0].Status != Passed {
		t.Errorf("without galley's answer: %+v", got)
	}
}

func TestRootsAndServingCertificatesAreJudgedByTheLifeTheyHaveLeft(t *testing.T) {
	root := func(days int) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: "root"}, NotAfter: now.Add(time.Duration(days) * 24 * time.Hour)}
	}
	got := rootResults([]*x509.Certificate{root(-1), root(30), root(3650)}, now)
	want(t, got[0], Failed, `root "CN=root" expired on 2026-12-02`, "rotate the root")
	want(t, got[1], Warning, `root "CN=root" expires on 2027-01-02, in 30 days`, "plan the root's rotation")
	want(t, got[2], Passed, `root "CN=root" valid until 2036-11-30`, "")
	want(t, rootResults(nil, now)[0], Failed, "holds no certificate", "--cacert")

	leaf := func(lifeLeft time.Duration) []*x509.Certificate {
		return []*x509.Certificate{{NotBefore: now.Add(lifeLeft - 24*time.Hour), NotAfter: now.Add(lifeLeft)}}
	}
	want(t, servingResult("discovery r1", leaf(20*time.Hour), now), Passed, "discovery r1's certificate valid until 2026-12-04T08:00:00Z", "")
	want(t, servingResult("discovery r1", leaf(3*time.Hour), now), Warning, "discovery r1's certificate expires at 2026-12-03T15:00:00Z, 3h0m0s from now", "half their life")
	want(t, servingResult("discovery r1", nil, now), Skipped, "plain text", "")
}

func TestServicesOnTwoVersionsOrProxiesOnAnotherAreWarned(t *testing.T) {
	var one versions
	one.service("v2", "galley g")
	one.service("v2", "discovery r1")
	one.proxies = map[string]int{"v2": 3}
	got := skewResults(one)
	want(t, got[0], Passed, "the control plane runs one version, v2 (2 services and replicas)", "")
	want(t, got[1], Passed, "every proxy runs a version of the control plane's", "")

	var two versions
	two.service("v1", "discovery r1")
	two.service("v2", "galley g")
	two.service("v2", "discovery r2")
	two.proxies = map[string]int{"v1": 2, "v2": 1, "1.29.1": 4}
	got = skewResults(two)
	want(t, got[0], Warning, "the control plane runs 2 versions: v1: discovery r1; v2: galley g, discovery r2", "rollout status")
	want(t, got[1], Warning, "4 proxies run a version no control-plane service runs: 1.29.1 (4)", "rollout restart")

	if got := skewResults(versions{}); len(got) != 1 || got[0].Status != Skipped {
		t.Errorf("nothing known: %+v", got)
	}
}

func svc(ns string, name ...string) *admregv1.ServiceReference {
	return &admregv1.ServiceReference{Namespace: ns, Name: cmp.Or(strings.Join(name, ""), "flotilla-injector")}
}

func TestAWebhookWhoseCABundleLacksARootOfTheMeshFails(t *testing.T) {
	mesh, err := testpki.NewCA("mesh root")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testpki.NewCA("another root")
	if err != nil {
		t.Fatal(err)
	}
	mutating := []admregv1.MutatingWebhookConfiguration{{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-injector"},
		Webhooks: []admregv1.MutatingWebhook{
			{Name: "right.flotilla.io", ClientConfig: admregv1.WebhookClientConfig{Service: svc("mesh"), CABundle: append(other.CertPEM, mesh.CertPEM...)}},
			{Name: "wrong.flotilla.io", ClientConfig: admregv1.WebhookClientConfig{Service: svc("mesh"), CABundle: other.CertPEM}},
			{Name: "another-install.flotilla.io", ClientConfig: admregv1.WebhookClientConfig{Service: svc("elsewhere"), CABundle: other.CertPEM}},
		},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-injector-canary"},
		Webhooks: []admregv1.MutatingWebhook{
			{Name: "rev.namespace.flotilla.io", ClientConfig: admregv1.WebhookClientConfig{Service: svc("mesh", "flotilla-injector-canary"), CABundle: other.CertPEM}},
		},
	}}
	validating := []admregv1.ValidatingWebhookConfiguration{{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-validator"},
		Webhooks:   []admregv1.ValidatingWebhook{{Name: "empty.flotilla.io", ClientConfig: admregv1.WebhookClientConfig{Service: svc("mesh", "flotilla-galley")}}},
	}}
	got := webhookResults("mesh", mutating, validating, []*x509.Certificate{mesh.Cert})
	if len(got) != 4 {
		t.Fatalf("%+v", got)
	}
	want(t, got[0], Passed, "MutatingWebhookConfiguration flotilla-injector, webhook right.flotilla.io: its caBundle holds the mesh's roots", "")
	want(t, got[1], Failed, `webhook wrong.flotilla.io: its caBundle lacks the mesh's root "CN=mesh root`, "flotilla-injector writes the caBundle")
	// Each revision's injector writes its own.
	want(t, got[2], Failed, "MutatingWebhookConfiguration flotilla-injector-canary, webhook rev.namespace.flotilla.io: its caBundle lacks", "flotilla-injector-canary writes the caBundle")
	want(t, got[3], Failed, "ValidatingWebhookConfiguration flotilla-validator, webhook empty.flotilla.io: its caBundle lacks", "flotilla-galley writes the caBundle")
	want(t, webhookResults("elsewhere2", mutating, validating, []*x509.Certificate{mesh.Cert})[0], Failed, "no webhook configuration of Flotilla's (label app.kubernetes.io/part-of=flotilla) calls a Service in elsewhere2", "install the chart")
}

func TestADeploymentNotFullyReadyOrUpdatedFails(t *testing.T) {
	two := int32(2)
	d := func(name string, ready, updated int32) appsv1.Deployment {
		return appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: appsv1.DeploymentSpec{Replicas: &two},
			Status: appsv1.DeploymentStatus{ReadyReplicas: ready, UpdatedReplicas: updated},
		}
	}
	got := deploymentResults("istio-system", []appsv1.Deployment{d("flotilla-galley", 2, 2), d("flotilla-discovery", 1, 2), d("flotilla-ca", 2, 1)})
	want(t, got[0], Failed, "Deployment flotilla-ca: 2 of 2 replicas ready, 1 updated", "describe deployment flotilla-ca")
	want(t, got[1], Failed, "Deployment flotilla-discovery: 1 of 2 replicas ready", "")
	want(t, got[2], Passed, "Deployment flotilla-galley: 2 of 2 replicas ready", "")
	want(t, deploymentResults("mesh", nil)[0], Failed, "no Deployment of Flotilla's in mesh", "helm install")
}
