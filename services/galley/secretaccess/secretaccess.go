// Package secretaccess answers, for discovery, whether a workload's
// service account may read its namespace's Secrets (galleyv1's
// SecretAccessService): a gateway gets a credentialName Secret's key over
// SDS only if so, as Istio's pilot decides
// (pilot/pkg/credentials/kube's CredentialsController.Authorize), so one
// compromised workload in a gateway's namespace does not get the
// gateway's TLS key. The decision is a SubjectAccessReview, cached; the
// cache is emptied whenever RBAC changes (Invalidate).
package secretaccess

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/tools/cache"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
)

// How long a decision is kept, as Istio's cacheTTL: a refusal a minute,
// an approval five (nothing needs it revoked quickly, and Invalidate
// empties the cache on any RBAC change); and how many are kept at most.
const (
	refusalTTL  = time.Minute
	approvalTTL = 5 * time.Minute
	maxCached   = 10_000
)

// Server is galley's SecretAccessService.
type Server struct {
	galleyv1.UnimplementedSecretAccessServiceServer

	// sar reviews access; nil: no cluster, every account may.
	sar authorizationv1client.SubjectAccessReviewInterface
	// caller says whether a caller's identity (mcp.PeerIdentity, as the
	// restricted collections are decided) may ask.
	caller func(identity string) bool
	now    func() time.Time
	log    *slog.Logger

	mu    sync.Mutex
	cache map[string]decision
	again bool // a second invalidation is scheduled (rbacChanged)
}

type decision struct {
	allowed bool
	reason  string
	expires time.Time
}

// New returns the server, answering every account allowed until
// UseCluster; caller says who may ask.
func New(caller func(identity string) bool, log *slog.Logger, now func() time.Time) *Server {
	return &Server{caller: caller, log: log, now: now, cache: map[string]decision{}}
}

// UseCluster reviews access in the cluster of sar; call before serving.
func (s *Server) UseCluster(sar authorizationv1client.SubjectAccessReviewInterface) { s.sar = sar }

// WatchRBAC empties the cache whenever a Role, ClusterRole or binding
// changes, until ctx ends: a grant or a revocation counts at once, not
// when the decision would expire.
func (s *Server) WatchRBAC(ctx context.Context, kube kubernetes.Interface) error {
	f := informers.NewSharedInformerFactory(kube, 0)
	rbac := f.Rbac().V1()
	invalidate := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.rbacChanged() },
		UpdateFunc: func(any, any) { s.rbacChanged() },
		DeleteFunc: func(any) { s.rbacChanged() },
	}
	for _, inf := range []cache.SharedIndexInformer{
		rbac.Roles().Informer(), rbac.RoleBindings().Informer(), rbac.ClusterRoles().Informer(), rbac.ClusterRoleBindings().Informer(),
	} {
		if _, err := inf.AddEventHandler(invalidate); err != nil {
			return fmt.Errorf("rbac informer: %w", err)
		}
	}
	f.Start(ctx.Done())
	<-ctx.Done()
	f.Shutdown()
	return nil
}

// Register adds the service to g.
func (s *Server) Register(g *grpc.Server) { galleyv1.RegisterSecretAccessServiceServer(g, s) }

// settle is how long after galley sees an RBAC change the apiserver's own
// authorizer, which watches the same objects, may still answer as before:
// decisions made in that time are forgotten again once it has passed.
const settle = 2 * time.Second

// rbacChanged forgets every decision now, and again once the apiserver
// has surely seen the change too.
func (s *Server) rbacChanged() {
	s.Invalidate()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.again {
		s.again = true
		time.AfterFunc(settle, func() {
			s.mu.Lock()
			s.again = false
			s.mu.Unlock()
			s.Invalidate()
		})
	}
}

// Invalidate forgets every decision (RBAC changed).
func (s *Server) Invalidate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.cache)
}

// Authorize answers one account.
func (s *Server) Authorize(ctx context.Context, req *galleyv1.AuthorizeRequest) (*galleyv1.AuthorizeResponse, error) {
	identity := mcp.PeerIdentity(ctx)
	if !s.caller(identity) {
		return nil, status.Errorf(codes.PermissionDenied, "secret access is answered to discovery only, not to %s", identity)
	}
	ns, sa := req.GetNamespace(), req.GetServiceAccount()
	if err := checkName(ns); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "namespace: %v", err)
	}
	if err := checkName(sa); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "service account: %v", err)
	}
	if s.sar == nil {
		return &galleyv1.AuthorizeResponse{Allowed: true}, nil
	}
	user := "system:serviceaccount:" + ns + ":" + sa
	now := s.now()
	s.mu.Lock()
	d, ok := s.cache[user]
	s.mu.Unlock()
	if !ok || !now.Before(d.expires) {
		var err error
		if d, err = s.review(ctx, ns, user, now); err != nil {
			s.log.Warn("secret access review failed", "user", user, "error", err)
			return nil, status.Errorf(codes.Unavailable, "reviewing %s: %v", user, err)
		}
	}
	return &galleyv1.AuthorizeResponse{Allowed: d.allowed, Reason: d.reason}, nil
}

// review asks the apiserver, as Istio does: may user list secrets in ns?
func (s *Server) review(ctx context.Context, ns, user string, now time.Time) (decision, error) {
	resp, err := s.sar.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "list", Resource: "secrets"},
		User:               user,
	}}, metav1.CreateOptions{})
	if err != nil {
		return decision{}, fmt.Errorf("subject access review: %w", err)
	}
	d := decision{allowed: resp.Status.Allowed, expires: now.Add(approvalTTL)}
	if !d.allowed {
		d.reason = clip.String(fmt.Sprintf("%s may not list secrets in namespace %s (%s)", user, ns, resp.Status.Reason), 512)
		d.expires = now.Add(refusalTTL)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cache) >= maxCached {
		clear(s.cache) // bounded: start over rather than grow
	}
	s.cache[user] = d
	return d, nil
}

// checkName refuses what cannot be a Kubernetes namespace or service
// account name (a DNS subdomain of at most 253 characters).
func checkName(n string) error {
	if n == "" || len(n) > 253 {
		return fmt.Errorf("%q is not a name", clip.String(n, 64))
	}
	for _, r := range n {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' && r != '.' {
			return fmt.Errorf("%q is not a name", clip.String(n, 64))
		}
	}
	return nil
}
