package secretaccess

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
)

var env *kubeenv.Env

func TestMain(m *testing.M) {
	os.Exit(kubeenv.RunTests(m, &env, kubeenv.Options{}))
}

// serve runs s on a loopback port and returns a client of it.
func serve(t *testing.T, s *Server) galleyv1.SecretAccessServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return galleyv1.NewSecretAccessServiceClient(cc)
}

func anyone(string) bool { return true }

// TestAnAccountMayHaveItsNamespacesSecretsOnlyIfRBACLetsItListThem: against
// the real apiserver with RBAC, an account a Role lets list its
// namespace's Secrets is allowed; another of the same namespace is
// refused with the reason; once a RoleBinding grants it too, it is
// allowed without waiting for the refusal to expire.
func TestAnAccountMayHaveItsNamespacesSecretsOnlyIfRBACLetsItListThem(t *testing.T) {
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "gw")
	if err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"ingress", "intruder"} {
		if err := env.CreateServiceAccount(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	rbac := env.Client.RbacV1()
	if _, err := rbac.Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "sds"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "watch", "list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bind := func(name, sa string) {
		t.Helper()
		if _, err := rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "sds"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bind("ingress-sds", "ingress")
	s := New(anyone, slog.New(slog.DiscardHandler), time.Now)
	s.UseCluster(env.Client.AuthorizationV1().SubjectAccessReviews())
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = s.WatchRBAC(watchCtx, env.Client) }()
	c := serve(t, s)
	ask := func(sa string) *galleyv1.AuthorizeResponse {
		t.Helper()
		resp, err := c.Authorize(ctx, &galleyv1.AuthorizeRequest{Namespace: ns, ServiceAccount: sa})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	deadline := time.Now().Add(30 * time.Second)
	for !ask("ingress").GetAllowed() { // the RoleBinding reaches the authorizer's cache
		if time.Now().After(deadline) {
			t.Fatal("an account a Role lets list its namespace's Secrets was refused for 30 s")
		}
		s.Invalidate()
		time.Sleep(100 * time.Millisecond)
	}
	if r := ask("intruder"); r.GetAllowed() || !strings.Contains(r.GetReason(), "system:serviceaccount:"+ns+":intruder may not list secrets in namespace "+ns) {
		t.Fatalf("an account with no Role: %v, want refused with the reason", r)
	}
	bind("intruder-sds", "intruder")
	for !ask("intruder").GetAllowed() {
		if time.Now().After(deadline.Add(30 * time.Second)) {
			t.Fatal("a new RoleBinding did not count within 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOnlyDiscoveryMayAskAndOnlyNames: a caller the server does not
// answer is refused; a namespace or account that cannot be a Kubernetes
// name is refused before anything is reviewed; without a cluster every
// account may.
func TestOnlyDiscoveryMayAskAndOnlyNames(t *testing.T) {
	refused := serve(t, New(func(string) bool { return false }, slog.New(slog.DiscardHandler), time.Now))
	if _, err := refused.Authorize(t.Context(), &galleyv1.AuthorizeRequest{Namespace: "a", ServiceAccount: "b"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a caller not answered: %v, want PermissionDenied", err)
	}
	c := serve(t, New(anyone, slog.New(slog.DiscardHandler), time.Now))
	for _, req := range []*galleyv1.AuthorizeRequest{
		{Namespace: "", ServiceAccount: "b"},
		{Namespace: "a", ServiceAccount: "b:c"},
		{Namespace: strings.Repeat("a", 254), ServiceAccount: "b"},
		{Namespace: "a", ServiceAccount: "B"},
		{Namespace: "a", ServiceAccount: strings.Repeat("b", 1<<20)},
	} {
		if _, err := c.Authorize(t.Context(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%.40q/%.40q: %v, want InvalidArgument", req.GetNamespace(), req.GetServiceAccount(), err)
		}
	}
	if r, err := c.Authorize(t.Context(), &galleyv1.AuthorizeRequest{Namespace: "a", ServiceAccount: "b"}); err != nil || !r.GetAllowed() {
		t.Fatalf("without a cluster: %v %v, want allowed", r, err)
	}
}

// FuzzAuthorizeAnswersOrRefusesWithAStatus: whatever it is asked, the
// server (without a cluster) allows a Kubernetes name and refuses
// anything else with InvalidArgument, never failing otherwise.
func FuzzAuthorizeAnswersOrRefusesWithAStatus(f *testing.F) {
	f.Add("default", "ingress")
	f.Add("", "")
	f.Add("a/b", "system:serviceaccount:x:y")
	s := New(anyone, slog.New(slog.DiscardHandler), time.Now)
	f.Fuzz(func(t *testing.T, ns, sa string) {
		r, err := s.Authorize(t.Context(), &galleyv1.AuthorizeRequest{Namespace: ns, ServiceAccount: sa})
		valid := checkName(ns) == nil && checkName(sa) == nil
		switch {
		case valid && (err != nil || !r.GetAllowed()):
			t.Fatalf("%q/%q: %v %v, want allowed", ns, sa, r, err)
		case !valid && status.Code(err) != codes.InvalidArgument:
			t.Fatalf("%q/%q: %v, want InvalidArgument", ns, sa, err)
		case !valid && !utf8.ValidString(status.Convert(err).Message()):
			t.Fatalf("the refusal of %q is not valid UTF-8", ns)
		}
	})
}
