package galley_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// sds is an ADS stream over mTLS asking for secrets by name.
type sds struct {
	st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
}

func dialSDS(t *testing.T, ca *testpki.CA, addr string, id testpki.Files, node string, names ...string) *sds {
	t.Helper()
	st, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dialMTLS(t, ca, addr, id)).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: resourcev3.SecretType, ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	return &sds{st: st}
}

// until reads responses (30 s at most) until done holds of one, and
// returns that one's secrets, or the last's.
func (s *sds) until(t *testing.T, names []string, done func(got map[string]string) bool) map[string]string {
	t.Helper()
	var got map[string]string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if got = s.next(t, names...); done(got) {
			break
		}
	}
	return got
}

// next waits (30 s at most) for a response, ACKs it (asking for the same
// names) and returns each secret's certificate chain or CA by name.
func (s *sds) next(t *testing.T, names ...string) map[string]string {
	t.Helper()
	type recv struct {
		resp *discoveryv3.DiscoveryResponse
		err  error
	}
	ch := make(chan recv, 1)
	go func() {
		r, err := s.st.Recv()
		ch <- recv{r, err}
	}()
	var resp *discoveryv3.DiscoveryResponse
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		resp = r.resp
	case <-time.After(30 * time.Second):
		t.Fatal("no SDS response within 30 s")
	}
	if err := s.st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce(), ResourceNames: names}); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range resp.GetResources() {
		sec := &tlsv3.Secret{}
		if err := a.UnmarshalTo(sec); err != nil {
			t.Fatal(err)
		}
		if c := sec.GetTlsCertificate(); c != nil {
			out[sec.GetName()] = string(c.GetCertificateChain().GetInlineBytes())
		} else {
			out[sec.GetName()] = string(sec.GetValidationContext().GetTrustedCa().GetInlineBytes())
		}
	}
	return out
}

// gatewayMesh is galley on the real apiserver, serving MCP over mTLS with
// certificates of a test CA, and what discovery needs to subscribe to it:
// each namespace of the mesh has a TLS Secret shop-cert and a Gateway
// "public" naming it.
type gatewayMesh struct {
	system     string
	namespaces map[string]string // by the name asked for, the namespace made
	ca         *testpki.CA
	caFile     string
	discovery  testpki.Files
	mcpAddr    string
	secure     string // discovery's mTLS xDS address, the same across restarts
	galley     *process
}

// newGatewayMesh makes the namespaces, each with a shop-cert whose
// certificate is certs[name], and starts galley.
func newGatewayMesh(t *testing.T, certs map[string]string) *gatewayMesh {
	t.Helper()
	ctx := context.Background()
	if err := env.InstallCRDs(ctx, crdgen.All()...); err != nil {
		t.Fatal(err)
	}
	m := &gatewayMesh{namespaces: map[string]string{}}
	var err error
	if m.system, err = env.CreateNamespace(ctx, "flotilla"); err != nil {
		t.Fatal(err)
	}
	ic, err := istioclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	for name, cert := range certs {
		ns, err := env.CreateNamespace(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		m.namespaces[name] = ns
		if _, err := env.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "shop-cert", Namespace: ns}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": []byte(cert), "tls.key": []byte("k")},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		grantSecrets(t, ns, "ingress", "app") // the gateways' accounts, as the chart's Role does
		gw := &networkingv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: "public", Namespace: ns}}
		gw.Spec.Selector = map[string]string{"istio": "ingressgateway"}
		gw.Spec.Servers = []*networkingapi.Server{{
			Port: &networkingapi.Port{Number: 443, Name: "https", Protocol: "HTTPS"}, Hosts: []string{"shop.example.com"},
			Tls: &networkingapi.ServerTLSSettings{Mode: networkingapi.ServerTLSSettings_SIMPLE, CredentialName: "shop-cert"},
		}}
		if _, err := ic.NetworkingV1().Gateways(ns).Create(ctx, gw, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if m.ca, err = testpki.NewCA("flotilla-test-root"); err != nil {
		t.Fatal(err)
	}
	m.caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(m.caFile, m.ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	galleyID := m.ca.IssueFiles(t, "galley", "spiffe://cluster.local/ns/"+m.system+"/sa/flotilla-galley")
	m.discovery = m.ca.IssueFiles(t, "discovery", "spiffe://cluster.local/ns/"+m.system+"/sa/flotilla-discovery")
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	m.mcpAddr, m.secure = proc.FreeAddr(t), proc.FreeAddr(t)
	m.galley = startGalleyWith(t, proc.FreeAddr(t), "--kubeconfig", kubeconfig, "--mcp-address", m.mcpAddr, "--system-namespace", m.system,
		"--mcp-tls-cert-file", galleyID.Cert, "--mcp-tls-key-file", galleyID.Key, "--mcp-tls-ca-file", m.caFile)
	return m
}

// grantSecrets lets the accounts read the Secrets of ns, as the chart's
// Role lets its gateways.
func grantSecrets(t *testing.T, ns string, accounts ...string) {
	t.Helper()
	ctx := context.Background()
	if _, err := env.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "sds"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "watch", "list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sds"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "sds"},
	}
	for _, sa := range accounts {
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: "ServiceAccount", Name: sa, Namespace: ns})
	}
	if _, err := env.Client.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startDiscovery starts discovery, subscribed to galley over mTLS and
// serving xDS over mTLS on m.secure, with the extra flags, and waits
// until it is ready.
func (m *gatewayMesh) startDiscovery(t *testing.T, extra ...string) *proc.Process {
	t.Helper()
	admin := proc.FreeAddr(t)
	p := proc.Start(t, "discovery", filepath.Join(binDir, "flotilla-discovery"), append([]string{
		"--galley-address", m.mcpAddr, "--xds-address", proc.FreeAddr(t), "--admin-address", admin, "--system-namespace", m.system,
		"--galley-tls-cert-file", m.discovery.Cert, "--galley-tls-key-file", m.discovery.Key, "--galley-tls-ca-file", m.caFile,
		"--secure-xds-address", m.secure,
		"--xds-tls-cert-file", m.discovery.Cert, "--xds-tls-key-file", m.discovery.Key, "--xds-tls-ca-file", m.caFile,
	}, extra...)...)
	proc.WaitReady(t, "http://"+admin+"/readyz")
	return p
}

// TestGatewaySecretsReachOnlyGatewaysOfTheirNamespaceOverSDS runs galley
// on a real apiserver and discovery subscribed to it over mTLS. A
// Secret a Gateway names reaches, over SDS on discovery's mTLS port, a
// gateway proxy whose certificate is of the Secret's namespace, and its
// rotation is pushed; a proxy of another namespace asking for it by
// either name gets its own namespace's Secret of that name or nothing; a
// subscriber with the injector's identity is refused the credentials by
// galley.
func TestGatewaySecretsReachOnlyGatewaysOfTheirNamespaceOverSDS(t *testing.T) {
	ctx := context.Background()
	m := newGatewayMesh(t, map[string]string{"edge": "edge-v1", "other": "other"})
	system, edge, other, ca, mcpAddr, g := m.system, m.namespaces["edge"], m.namespaces["other"], m.ca, m.mcpAddr, m.galley
	injectorID := ca.IssueFiles(t, "injector", "spiffe://cluster.local/ns/"+system+"/sa/flotilla-injector")
	gatewayID := ca.IssueFiles(t, "gateway", "spiffe://cluster.local/ns/"+edge+"/sa/ingress")
	strangerID := ca.IssueFiles(t, "stranger", "spiffe://cluster.local/ns/"+other+"/sa/app")
	secure := m.secure
	m.startDiscovery(t)

	names := []string{"kubernetes://shop-cert", "kubernetes://" + edge + "/shop-cert"}
	gw := dialSDS(t, ca, secure, gatewayID, "router~10.0.0.5~ingress-1."+edge+"~"+edge+".svc.cluster.local", names...)
	got := gw.until(t, names, func(got map[string]string) bool { return got["kubernetes://shop-cert"] == "edge-v1" })
	if got["kubernetes://shop-cert"] != "edge-v1" || got["kubernetes://"+edge+"/shop-cert"] != "edge-v1" {
		t.Fatalf("the gateway of %s got %v", edge, got)
	}

	// Rotation is pushed on the open stream.
	sec, err := env.Client.CoreV1().Secrets(edge).Get(ctx, "shop-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Data["tls.crt"] = []byte("edge-v2")
	if _, err := env.Client.CoreV1().Secrets(edge).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got = gw.until(t, names, func(got map[string]string) bool { return got["kubernetes://shop-cert"] == "edge-v2" })
	if got["kubernetes://shop-cert"] != "edge-v2" {
		t.Fatalf("after the rotation the gateway has %v", got)
	}

	// A proxy of another namespace: its own namespace's Secret by the
	// short name, nothing by edge's qualified name.
	stranger := dialSDS(t, ca, secure, strangerID, "router~10.0.0.6~ingress-1."+other+"~"+other+".svc.cluster.local", names...)
	got = stranger.until(t, names, func(got map[string]string) bool { return got["kubernetes://shop-cert"] != "" })
	if got["kubernetes://shop-cert"] != "other" || got["kubernetes://"+edge+"/shop-cert"] != "" {
		t.Fatalf("a proxy of %s got %v", other, got)
	}
	for _, v := range got {
		if strings.HasPrefix(v, "edge") {
			t.Fatalf("a proxy of %s got edge's key material: %v", other, got)
		}
	}

	// galley serves the credentials to discovery only: of any revision
	// (a canary's discovery, flotilla-discovery-canary), and never to an
	// injector of any.
	askCredentials := func(id testpki.Files) error {
		t.Helper()
		mst, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dialMTLS(t, ca, mcpAddr, id)).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := mst.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "asker"}, TypeUrl: registry.CredentialTypeURL}); err != nil {
			t.Fatal(err)
		}
		_, err = mst.Recv()
		return err // the test reads its code
	}
	if err := askCredentials(injectorID); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the injector's identity asking for credentials: %v, want PermissionDenied", err)
	}
	canaryInjector := ca.IssueFiles(t, "injector-canary", "spiffe://cluster.local/ns/"+system+"/sa/flotilla-injector-canary")
	if err := askCredentials(canaryInjector); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a canary injector's identity asking for credentials: %v, want PermissionDenied", err)
	}
	canaryDiscovery := ca.IssueFiles(t, "discovery-canary", "spiffe://cluster.local/ns/"+system+"/sa/flotilla-discovery-canary")
	if err := askCredentials(canaryDiscovery); err != nil {
		t.Fatalf("a canary discovery's identity asking for credentials: %v", err)
	}
	g.out.WaitFor(t, "refusing a subscriber a restricted collection")
}

// dialMTLS connects to addr over mTLS with the identity id.
func dialMTLS(t *testing.T, ca *testpki.CA, addr string, id testpki.Files) *grpc.ClientConn {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(id.Cert, id.Key)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: ca.Pool(), ServerName: "127.0.0.1", Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestAGatewayAccountThatMayNotReadItsSecretsGetsNoneAndDiscoverySaysWhy:
// galley on the real apiserver with RBAC, discovery subscribed to it. A
// proxy of the gateway's namespace whose account no Role lets read the
// namespace's Secrets (one compromised workload beside the gateway) asks
// for the gateway's credential over SDS: it gets none, and discovery logs
// why, as galley's SubjectAccessReview said; the gateway's own account is
// served.
func TestAGatewayAccountThatMayNotReadItsSecretsGetsNoneAndDiscoverySaysWhy(t *testing.T) {
	m := newGatewayMesh(t, map[string]string{"edge": "edge-cert"})
	edge, ca := m.namespaces["edge"], m.ca
	d := m.startDiscovery(t)
	names := []string{"kubernetes://shop-cert"}
	gw := dialSDS(t, ca, m.secure, ca.IssueFiles(t, "gateway", "spiffe://cluster.local/ns/"+edge+"/sa/ingress"),
		"router~10.0.0.5~ingress-1."+edge+"~"+edge+".svc.cluster.local", names...)
	got := gw.until(t, names, func(got map[string]string) bool { return got["kubernetes://shop-cert"] == "edge-cert" })
	if got["kubernetes://shop-cert"] != "edge-cert" {
		t.Fatalf("the gateway's account got %v", got)
	}
	intruder := dialSDS(t, ca, m.secure, ca.IssueFiles(t, "intruder", "spiffe://cluster.local/ns/"+edge+"/sa/intruder"),
		"sidecar~10.0.0.7~app-1."+edge+"~"+edge+".svc.cluster.local", names...)
	if got := intruder.next(t, names...); len(got) != 0 {
		t.Fatalf("an account no Role lets read the Secrets got %v", got)
	}
	d.Out.WaitFor(t, "withholding a proxy's credentials")
	if want := "system:serviceaccount:" + edge + ":intruder may not list secrets in namespace " + edge; !strings.Contains(d.Out.String(), want) {
		t.Fatalf("discovery's log does not say %q:\n%s", want, d.Out.String())
	}
	// galley knows discovery's mTLS subscription by its identity (it was
	// once labelled plaintext); it logs a subscriber once it has stayed a
	// second.
	m.galley.out.WaitFor(t, "identity=spiffe://cluster.local/ns/"+m.system+"/sa/flotilla-discovery")
}

// TestCredentialsNeverReachAStreamWhateverNumberItShares reproduces the
// attack of a peer holding the identity of the system namespace's default
// service account (the CLI's token, the chart's gateways): six
// state-of-the-world streams held open to galley, discovery restarted so
// that its new delta stream is numbered among theirs, then each of the six
// asks for the credentials. Each is refused with PermissionDenied and none
// ever receives a credential, while the restarted discovery is served the
// gateway's key.
func TestCredentialsNeverReachAStreamWhateverNumberItShares(t *testing.T) {
	m := newGatewayMesh(t, map[string]string{"edge": "edge-cert"})
	system, edge, ca, mcpAddr, g, secure := m.system, m.namespaces["edge"], m.ca, m.mcpAddr, m.galley, m.secure
	attackerID := ca.IssueFiles(t, "default", "spiffe://cluster.local/ns/"+system+"/sa/default")
	d := m.startDiscovery(t)

	// Six streams of the attacker, each served an unrestricted collection.
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(dialMTLS(t, ca, mcpAddr, attackerID))
	var streams []discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	for i := range 6 {
		st, err := ads.StreamAggregatedResources(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: fmt.Sprintf("attacker-%d", i)}, TypeUrl: vsType()}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	d.Kill(t)
	m.startDiscovery(t)

	// The restarted discovery holds the gateway's key: its SDS serves it.
	names := []string{"kubernetes://shop-cert"}
	sdsStream := dialSDS(t, ca, secure, ca.IssueFiles(t, "gateway", "spiffe://cluster.local/ns/"+edge+"/sa/ingress"),
		"router~10.0.0.5~ingress-1."+edge+"~"+edge+".svc.cluster.local", names...)
	got := sdsStream.until(t, names, func(got map[string]string) bool { return got["kubernetes://shop-cert"] == "edge-cert" })
	if got["kubernetes://shop-cert"] != "edge-cert" {
		t.Fatalf("the gateway got %v from the restarted discovery", got)
	}

	for i, st := range streams {
		if err := st.Send(&discoveryv3.DiscoveryRequest{TypeUrl: registry.CredentialTypeURL}); err != nil {
			t.Fatal(err)
		}
		for {
			resp, err := st.Recv()
			if err != nil {
				if status.Code(err) != codes.PermissionDenied {
					t.Fatalf("attacker stream %d ended with %v, want PermissionDenied", i, err)
				}
				break
			}
			if resp.GetTypeUrl() == registry.CredentialTypeURL {
				t.Fatalf("attacker stream %d was served %d credentials", i, len(resp.GetResources()))
			}
		}
	}
	g.out.WaitForCount(t, "refusing a subscriber a restricted collection", len(streams))
}
