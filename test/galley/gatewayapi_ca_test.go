package galley_test

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gw "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

// TestAGatewayAPIListenersConfigMapCAReachesItsGatewayOverSDS: a
// Gateway of Flotilla's class whose frontend validation names a
// ConfigMap's ca.crt, applied to a real apiserver: galley converts it,
// publishes the ConfigMap's CA certificates to discovery (over mTLS, a
// restricted collection), and discovery serves them as
// configmap://<namespace>/<name>-cacert to the gateway — a proxy of the
// Gateway's namespace that is an instance of its Service — and a changed
// ca.crt follows. A CA certificate is public, as in Istio: a proxy of
// another namespace asking for it by name gets it too.
func TestAGatewayAPIListenersConfigMapCAReachesItsGatewayOverSDS(t *testing.T) {
	ctx := context.Background()
	if err := env.InstallCRDs(ctx, gatewayAPICRDs(t)...); err != nil {
		t.Fatal(err)
	}
	m := newGatewayMesh(t, map[string]string{"edge": "edge-v1", "other": "other"})
	edge, other, ca := m.namespaces["edge"], m.namespaces["other"], m.ca
	m.startDiscovery(t)
	m.galley.out.WaitFor(t, "watching the Gateway API")

	// The gateway's certificate, and the clients' CA in a ConfigMap.
	serving := ca.IssueFiles(t, "web", "spiffe://cluster.local/ns/"+edge+"/sa/web-flotilla")
	cert, err := os.ReadFile(serving.Cert)
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(serving.Key)
	if err != nil {
		t.Fatal(err)
	}
	kube := env.Client
	if _, err := kube.CoreV1().Secrets(edge).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "web-cert"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": cert, "tls.key": key},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	clients, err := testpkiCA(t, "clients-v1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().ConfigMaps(edge).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "client-ca"}, Data: map[string]string{"ca.crt": clients},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The Gateway's Service (<gateway>-<class>) with the gateway proxy,
	// 10.0.0.7, as its ready endpoint.
	serviceWithEndpoint(t, edge, "web-flotilla", "https", 443, 443, "10.0.0.7")
	gwc, err := gwclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	terminate := gw.TLSModeTerminate
	if _, err := gwc.GatewayV1().Gateways(edge).Create(ctx, &gw.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: gw.GatewaySpec{
			GatewayClassName: "flotilla",
			Listeners: []gw.Listener{{
				Name: "https", Port: 443, Protocol: gw.HTTPSProtocolType,
				TLS: &gw.ListenerTLSConfig{Mode: &terminate, CertificateRefs: []gw.SecretObjectReference{{Name: "web-cert"}}},
			}},
			TLS: &gw.GatewayTLSConfig{Frontend: &gw.FrontendTLSConfig{Default: gw.TLSConfig{Validation: &gw.FrontendTLSValidation{
				CACertificateRefs: []gw.ObjectReference{{Group: "", Kind: "ConfigMap", Name: "client-ca"}},
			}}}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The listener's references resolved: galley converted it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		g, err := gwc.GatewayV1().Gateways(edge).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Status.Listeners) == 1 && meta.IsStatusConditionTrue(g.Status.Listeners[0].Conditions, string(gw.ListenerConditionResolvedRefs)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Gateway's status: %+v", g.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}

	caName := "configmap://" + edge + "/client-ca-cacert"
	names := []string{caName}
	gatewayID := ca.IssueFiles(t, "gateway", "spiffe://cluster.local/ns/"+edge+"/sa/web-flotilla")
	sds := dialSDS(t, ca, m.secure, gatewayID, "router~10.0.0.7~web-flotilla-1."+edge+"~"+edge+".svc.cluster.local", names...)
	got := sds.until(t, names, func(got map[string]string) bool { return got[caName] == clients })
	if got[caName] != clients {
		t.Fatalf("the gateway got %v, want the ConfigMap's ca.crt as %s", got, caName)
	}

	// A new ca.crt is published again and pushed.
	rotated, err := testpkiCA(t, "clients-v2")
	if err != nil {
		t.Fatal(err)
	}
	cm, err := kube.CoreV1().ConfigMaps(edge).Get(ctx, "client-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["ca.crt"] = rotated
	if _, err := kube.CoreV1().ConfigMaps(edge).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := sds.until(t, names, func(got map[string]string) bool { return got[caName] == rotated }); got[caName] != rotated {
		t.Fatalf("after the ConfigMap changed the gateway has %v", got)
	}

	// A proxy of another namespace asking for it by name gets it too
	// (Istio's filterAuthorizedResources: a ConfigMap's ca.crt is not
	// private), beside its own namespace's shop-cert.
	asked := []string{caName, "kubernetes://shop-cert"}
	strangerID := ca.IssueFiles(t, "stranger", "spiffe://cluster.local/ns/"+other+"/sa/app")
	stranger := dialSDS(t, ca, m.secure, strangerID, "router~10.0.0.8~ingress-1."+other+"~"+other+".svc.cluster.local", asked...)
	if got := stranger.until(t, asked, func(got map[string]string) bool { return got["kubernetes://shop-cert"] != "" && got[caName] != "" }); got["kubernetes://shop-cert"] != "other" || got[caName] != rotated {
		t.Fatalf("a proxy of %s got %v", other, got)
	}
}

// TestABackendTLSPolicysConfigMapCAReachesEveryClientOverSDS: a
// BackendTLSPolicy of a real apiserver naming a ConfigMap's ca.crt for a
// Service: galley's leader writes its status (Accepted and ResolvedRefs
// for the Service, as the mesh's ancestor), galley publishes the CA, and
// discovery serves it as configmap://<namespace>/<name>-cacert to a
// client of another namespace (the DestinationRule the policy becomes
// tells every client to verify the Service with it). The ConfigMap's
// ca.crt removed, the policy is NoValidCACertificate /
// InvalidCACertificateRef and the CA is withdrawn.
func TestABackendTLSPolicysConfigMapCAReachesEveryClientOverSDS(t *testing.T) {
	ctx := context.Background()
	if err := env.InstallCRDs(ctx, gatewayAPICRDs(t)...); err != nil {
		t.Fatal(err)
	}
	m := newGatewayMesh(t, map[string]string{"apps": "apps", "client": "client"})
	apps, client, ca := m.namespaces["apps"], m.namespaces["client"], m.ca
	m.startDiscovery(t)
	m.galley.out.WaitFor(t, "watching the Gateway API")

	backendCA, err := testpkiCA(t, "backend")
	if err != nil {
		t.Fatal(err)
	}
	kube := env.Client
	if _, err := kube.CoreV1().ConfigMaps(apps).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "backend-ca"}, Data: map[string]string{"ca.crt": backendCA},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	serviceWithEndpoint(t, apps, "secure", "https", 443, 8443, "10.0.0.9")
	gwc, err := gwclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gwc.GatewayV1().BackendTLSPolicies(apps).Create(ctx, &gw.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "secure-tls"},
		Spec: gw.BackendTLSPolicySpec{
			TargetRefs: []gw.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: gw.LocalPolicyTargetReference{Group: "", Kind: "Service", Name: "secure"}}},
			Validation: gw.BackendTLSPolicyValidation{
				Hostname:          "secure.example.com",
				CACertificateRefs: []gw.LocalObjectReference{{Group: "", Kind: "ConfigMap", Name: "backend-ca"}},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	policyHas := func(cond, reason string, status metav1.ConditionStatus) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			p, err := gwc.GatewayV1().BackendTLSPolicies(apps).Get(ctx, "secure-tls", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Status.Ancestors) == 1 && p.Status.Ancestors[0].AncestorRef.Name == "secure" {
				if c := meta.FindStatusCondition(p.Status.Ancestors[0].Conditions, cond); c != nil && c.Reason == reason && c.Status == status && c.ObservedGeneration == p.Generation {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the policy's status: %+v, want %s %s %s", p.Status, cond, status, reason)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	policyHas(string(gw.PolicyConditionAccepted), string(gw.PolicyReasonAccepted), metav1.ConditionTrue)
	policyHas(string(gw.BackendTLSPolicyConditionResolvedRefs), string(gw.BackendTLSPolicyReasonResolvedRefs), metav1.ConditionTrue)

	caName := "configmap://" + apps + "/backend-ca-cacert"
	names := []string{caName}
	clientID := ca.IssueFiles(t, "client", "spiffe://cluster.local/ns/"+client+"/sa/app")
	sds := dialSDS(t, ca, m.secure, clientID, "sidecar~10.0.0.10~app-1."+client+"~"+client+".svc.cluster.local", names...)
	if got := sds.until(t, names, func(got map[string]string) bool { return got[caName] == backendCA }); got[caName] != backendCA {
		t.Fatalf("the client got %v, want the ConfigMap's ca.crt as %s", got, caName)
	}

	cm, err := kube.CoreV1().ConfigMaps(apps).Get(ctx, "backend-ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{"other": "data"}
	if _, err := kube.CoreV1().ConfigMaps(apps).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	policyHas(string(gw.PolicyConditionAccepted), string(gw.BackendTLSPolicyReasonNoValidCACertificate), metav1.ConditionFalse)
	policyHas(string(gw.BackendTLSPolicyConditionResolvedRefs), string(gw.BackendTLSPolicyReasonInvalidCACertificateRef), metav1.ConditionFalse)
	if got := sds.until(t, names, func(got map[string]string) bool { return got[caName] == "" }); got[caName] != "" {
		t.Fatalf("after the ConfigMap lost its ca.crt the client has %v", got)
	}
}

// testpkiCA is the PEM certificate of a new CA named name.
func testpkiCA(t *testing.T, name string) (string, error) {
	t.Helper()
	c, err := testpki.NewCA(name)
	if err != nil {
		return "", err
	}
	return string(c.CertPEM), nil
}
