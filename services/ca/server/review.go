package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	cav1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/ca/v1"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
)

// MaxReviewCache bounds how long discovery may reuse one review of a
// token: as long as ca's own cache of the apiserver's reviews, never past
// the token's expiry.
const MaxReviewCache = 5 * time.Minute

// reviewer is TokenReviewService: discovery asks it who a proxy that
// connected with a token and no client certificate is (Istio's agent as
// Istio injects it). Only discovery may ask: the answer is an identity
// for any token, and the caller's own certificate must be discovery's.
type reviewer struct {
	cav1.UnimplementedTokenReviewServiceServer
	s       *Server
	reviews metric.Int64Counter
}

func newReviewer(s *Server) (*reviewer, error) {
	c, err := s.o.Meter.Int64Counter("flotilla.ca.proxy_token_reviews",
		metric.WithDescription("Proxies' tokens discovery asked ca to authenticate, by result: authenticated, refused, unavailable, throttled or forbidden (the caller was not discovery)."))
	if err != nil {
		return nil, fmt.Errorf("metric: %w", err)
	}
	return &reviewer{s: s, reviews: c}, nil
}

// Review implements TokenReviewService.
func (r *reviewer) Review(ctx context.Context, req *cav1.ReviewRequest) (*cav1.ReviewResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, r.s.o.Deadline)
	defer cancel()
	if err := r.callerIsDiscovery(ctx); err != nil {
		r.count(ctx, "forbidden")
		if r.s.failures(peerAddress(ctx)).Allow() {
			r.s.o.Log.Info("token review refused to its caller", "peer", peerAddress(ctx), "error", clip.String(err.Error(), 512))
		}
		return nil, err
	}
	proxy := proxyAddress(req.GetPeerAddress())
	// The token is checked exactly as a certificate request's, by the same
	// authenticators, as if the proxy had called: its address's failure
	// budget applies, and the caller's own certificate is no credential
	// here (the peer below carries none).
	pctx := peer.NewContext(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+req.GetToken())), &peer.Peer{Addr: proxy})
	failures := r.s.failures(proxy.String())
	if failures.Tokens() < 1 {
		pctx = context.WithValue(pctx, throttledKey{}, true)
	}
	id, err := r.s.authenticate(pctx)
	if err == nil && id.TrustDomain != "" && id.TrustDomain != r.s.o.TrustDomain {
		err = fmt.Errorf("%w: the token is for trust domain %q, this CA's is %q", ErrUnauthenticated, id.TrustDomain, r.s.o.TrustDomain)
	}
	if err != nil {
		st := toStatus(err)
		switch {
		case errors.Is(err, ErrThrottled):
			r.count(ctx, "throttled")
		case st.Code() == codes.Unavailable:
			r.count(ctx, "unavailable")
			r.s.o.Log.Warn("token review unavailable", "error", clip.String(err.Error(), 512))
		default:
			r.count(ctx, "refused")
			if failures.Allow() {
				r.s.o.Log.Info("proxy token refused", "proxy", proxy.String(), "error", clip.String(err.Error(), 512))
			}
		}
		return nil, st.Err()
	}
	r.count(ctx, "authenticated")
	var cache time.Duration
	if exp, ok := TokenExpiry(req.GetToken()); ok {
		cache = min(MaxReviewCache, exp.Sub(r.s.o.Now()))
	}
	return &cav1.ReviewResponse{
		TrustDomain: r.s.o.TrustDomain, Namespace: id.Namespace, ServiceAccount: id.ServiceAccount,
		CacheSeconds: int64(max(cache, 0) / time.Second),
	}, nil
}

// callerIsDiscovery checks the caller's client certificate: ca's, and of
// a discovery account of the control plane (any revision's).
func (r *reviewer) callerIsDiscovery(ctx context.Context) error {
	id, ok, err := ClientCert{CA: r.s.o.CA, Now: r.s.o.Now}.Authenticate(ctx)
	switch {
	case !ok:
		return status.Error(codes.Unauthenticated, "token reviews are for discovery only: present its client certificate")
	case err != nil:
		return toStatus(err).Err()
	}
	if r.s.o.ControlPlane != nil {
		if _, cp := r.s.o.ControlPlane(id.Namespace, id.ServiceAccount); cp {
			if service, _, _ := controlplane.Parse(id.ServiceAccount); service == controlplane.Discovery {
				return nil
			}
		}
	}
	return status.Errorf(codes.PermissionDenied, "token reviews are for discovery only, not %s", id.SPIFFEID())
}

func (r *reviewer) count(ctx context.Context, result string) {
	r.reviews.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result)))
}

// proxyAddress is the proxy address discovery reports, as an address
// ("unknown" when it is not an IP: the budget is then shared by every
// proxy discovery could not place, which is never a genuine one).
func proxyAddress(s string) net.Addr {
	ip := net.ParseIP(s)
	if ip == nil {
		return unknownAddr{}
	}
	return &net.IPAddr{IP: ip}
}

type unknownAddr struct{}

func (unknownAddr) Network() string { return "ip" }
func (unknownAddr) String() string  { return "unknown" }
