// Package server is ca's gRPC edge: Istio's IstioCertificateService
// (CreateCertificate), authenticating callers and mapping errors to gRPC
// codes: Unauthenticated (no or bad credential), PermissionDenied (asks
// for an identity that is not the caller's), InvalidArgument (bad CSR or
// TTL), ResourceExhausted (rate limit), Unavailable (no signing key).
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	cav1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/ca/v1"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
	"github.com/flotilla-mesh/flotilla/internal/platform/grpcserver"
	"github.com/flotilla-mesh/flotilla/services/ca/authority"
)

// ControlPlaneAccounts is the ControlPlane option of a ca whose control
// plane runs in systemNamespace: its services' accounts there, discovery's
// and the injector's of every revision (flotilla-discovery-canary), each
// reached by its Service names (controlplane.ServiceNames: discovery's
// own and Istio's istiod).
func ControlPlaneAccounts(systemNamespace string) func(namespace, serviceAccount string) ([]string, bool) {
	return func(namespace, account string) ([]string, bool) {
		if namespace != systemNamespace {
			return nil, false
		}
		return controlplane.ServiceNames(account)
	}
}

// Options configures a Server.
type Options struct {
	Log   *slog.Logger
	Meter metric.Meter
	// IstioMeter is the meter of the metrics named as Istio's Citadel
	// names them (telemetry.Providers.Istio); none when nil.
	IstioMeter metric.Meter
	// CA returns the current authority (nil while none is loaded).
	CA func() *authority.Authority
	// Authenticators are tried in order; the first that finds a credential
	// of its kind decides.
	Authenticators []Authenticator
	TrustDomain    string
	DomainSuffix   string
	// ControlPlane says whether a service account is the control plane's
	// and, if so, the Services whose DNS names its certificate also carries.
	ControlPlane func(namespace, serviceAccount string) (services []string, ok bool)
	// RatePerIdentity and Burst limit requests per caller identity
	// (default 10/s, burst 20).
	RatePerIdentity float64
	Burst           int
	// Deadline bounds one request (default 10s).
	Deadline time.Duration
	// Replica names this replica and its version to callers, in every
	// answer's debugapi.ReplicaHeader (flotilla version reads it).
	Replica debugapi.Replica
	Now     func() time.Time
}

// Server implements IstioCertificateService.
type Server struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	o Options

	mu       sync.Mutex
	limiters map[string]*rate.Limiter
	failedBy map[string]*rate.Limiter // failure budgets, by peer address

	issued  metric.Int64Counter
	failed  metric.Int64Counter
	latency metric.Float64Histogram
	// Istio's (security/pkg/server/ca/monitoring.go): every request, the
	// callers that did not authenticate (or claimed an identity not
	// theirs), signing errors by Istio's error code, and issuances.
	csrs, authFailures, signErrors, successes metric.Float64Counter

	reviewer *reviewer // TokenReviewService
}

// New returns a Server.
func New(o Options) (*Server, error) {
	if o.RatePerIdentity <= 0 {
		o.RatePerIdentity = 10
	}
	if o.Burst <= 0 {
		o.Burst = 20
	}
	if o.Deadline <= 0 {
		o.Deadline = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Server{o: o, limiters: map[string]*rate.Limiter{}, failedBy: map[string]*rate.Limiter{}}
	var err error
	if s.issued, err = o.Meter.Int64Counter("flotilla.ca.certificates_issued",
		metric.WithDescription("Certificates issued, by kind (workload or control-plane).")); err != nil {
		return nil, fmt.Errorf("metric: %w", err)
	}
	if s.failed, err = o.Meter.Int64Counter("flotilla.ca.certificate_failures",
		metric.WithDescription("CreateCertificate calls refused or failed, by reason (gRPC code).")); err != nil {
		return nil, fmt.Errorf("metric: %w", err)
	}
	if s.latency, err = o.Meter.Float64Histogram("flotilla.ca.signing_duration", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
		metric.WithDescription("Time to authenticate and sign one request.")); err != nil {
		return nil, fmt.Errorf("metric: %w", err)
	}
	im := cmp.Or[metric.Meter](o.IstioMeter, noop.Meter{})
	for _, c := range []struct {
		to         *metric.Float64Counter
		name, help string
	}{
		{&s.csrs, "citadel_server_csr_count", "The number of CSRs received by Citadel server."},
		{&s.authFailures, "citadel_server_authentication_failure_count", "The number of authentication failures."},
		{&s.signErrors, "citadel_server_csr_sign_err_count", "The number of errors occurred when signing the CSR."},
		{&s.successes, "citadel_server_success_cert_issuance_count", "The number of certificates issuances that have succeeded."},
	} {
		if *c.to, err = im.Float64Counter(c.name, metric.WithDescription(c.help)); err != nil {
			return nil, fmt.Errorf("metric %s: %w", c.name, err)
		}
	}
	if s.reviewer, err = newReviewer(s); err != nil {
		return nil, err
	}
	return s, nil
}

// countFailure counts an error of create's as Istio's CA does: an
// authentication failure (no or a bad credential, or a CSR for an
// identity not the caller's), or a signing error by Istio's code
// (security/pkg/pki/error); a request refused before either (rate
// limited, past its deadline, authentication unavailable) is neither.
func (s *Server) countFailure(ctx context.Context, err error) {
	code := "CERT_GEN_ERROR"
	switch {
	case errors.Is(err, ErrUnauthenticated), errors.Is(err, authority.ErrForbidden):
		s.authFailures.Add(ctx, 1)
		return
	case errors.Is(err, ErrAuthUnavailable), errors.Is(err, errRateLimited), errors.Is(err, ErrThrottled), errors.Is(err, errDeadline):
		return
	case errors.Is(err, errUnavailable):
		code = "CA_NOT_READY"
	case errors.Is(err, authority.ErrInvalidTTL):
		code = "TTL_ERROR"
	case errors.Is(err, authority.ErrInvalidRequest):
		code = "CSR_ERROR"
	}
	s.signErrors.Add(ctx, 1, metric.WithAttributes(attribute.String("error", code)))
}

// Register adds the services to a gRPC server: Istio's certificate
// service, and the token reviews discovery asks for.
func (s *Server) Register(gs *grpc.Server) {
	securityv1alpha1.RegisterIstioCertificateServiceServer(gs, s)
	cav1.RegisterTokenReviewServiceServer(gs, s.reviewer)
}

// CreateCertificate signs the CSR for the authenticated caller.
func (s *Server) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	start := time.Now()
	if s.o.Replica.ID != "" {
		_ = grpc.SetHeader(ctx, metadata.Pairs(debugapi.ReplicaHeader, s.o.Replica.ControlPlane().GetIdentifier())) // fails only outside a gRPC call (unit tests)
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.Deadline)
	defer cancel()
	s.csrs.Add(ctx, 1)
	addr := peerAddress(ctx)
	failures := s.failures(addr)
	if failures.Tokens() < 1 {
		// This address failed to authenticate too often. Pods behind one
		// node address share it, so its callers are not refused: each
		// credential is still checked where that costs ca alone (a JWT, a
		// client certificate, a token reviewed before, a token the
		// apiserver's keys verify), and only what would cost the apiserver
		// a review for nothing is refused (ErrThrottled).
		ctx = context.WithValue(ctx, throttledKey{}, true)
	}
	resp, kind, err := s.create(ctx, req)
	if err != nil {
		s.countFailure(ctx, err)
		st := toStatus(err)
		s.failed.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", st.Code().String())))
		// Failed authentications spend the address's budget and are
		// logged within it only: a flood of bad tokens logs a few lines.
		logIt := !errors.Is(err, ErrThrottled)
		if st.Code() == codes.Unauthenticated {
			logIt = failures.Allow()
		}
		if logIt {
			s.o.Log.Info("certificate refused", "code", st.Code().String(), "peer", addr, "error", clip.String(err.Error(), 512))
		}
		return nil, st.Err()
	}
	s.issued.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", kind)))
	s.successes.Add(ctx, 1)
	s.latency.Record(ctx, time.Since(start).Seconds())
	return resp, nil
}

func (s *Server) create(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, string, error) {
	ca := s.o.CA()
	if ca == nil {
		return nil, "", errUnavailable
	}
	id, err := s.authenticate(ctx)
	if err != nil {
		return nil, "", err
	}
	if id.TrustDomain != "" && id.TrustDomain != s.o.TrustDomain {
		return nil, "", fmt.Errorf("%w: the credential is for trust domain %q, this CA's is %q", ErrUnauthenticated, id.TrustDomain, s.o.TrustDomain)
	}
	id.TrustDomain = s.o.TrustDomain
	kind := "workload"
	if s.o.ControlPlane != nil {
		if services, ok := s.o.ControlPlane(id.Namespace, id.ServiceAccount); ok {
			kind = "control-plane"
			for _, svc := range services {
				base := svc + "." + id.Namespace + ".svc"
				id.DNSNames = append(id.DNSNames, base, base+"."+s.o.DomainSuffix)
			}
		}
	}
	if !s.limiter(id.SPIFFEID()).Allow() {
		return nil, "", fmt.Errorf("%w: %s", errRateLimited, id.SPIFFEID())
	}
	if err := ctx.Err(); err != nil {
		return nil, "", fmt.Errorf("%w: %w", errDeadline, err)
	}
	ttl := time.Duration(req.GetValidityDuration()) * time.Second
	if req.GetValidityDuration() < 0 || req.GetValidityDuration() > int64((100*365*24*time.Hour)/time.Second) {
		return nil, "", fmt.Errorf("%w: %w: validity_duration %d s is out of range", authority.ErrInvalidRequest, authority.ErrInvalidTTL, req.GetValidityDuration())
	}
	issued, err := ca.Issue(authority.Request{CSRPEM: []byte(req.GetCsr()), TTL: ttl, Identity: id}, s.o.Now())
	if err != nil {
		return nil, "", err
	}
	return &securityv1alpha1.IstioCertificateResponse{CertChain: issued.PEM()}, kind, nil
}

func (s *Server) authenticate(ctx context.Context) (authority.Identity, error) {
	for _, a := range s.o.Authenticators {
		id, ok, err := a.Authenticate(ctx)
		if !ok {
			continue
		}
		if err != nil {
			return authority.Identity{}, err
		}
		return id, nil
	}
	return authority.Identity{}, fmt.Errorf("%w: no credential (send a service account token as \"authorization: Bearer <token>\", or renew with a client certificate)", ErrUnauthenticated)
}

// MaxRequestBytes bounds one CreateCertificate request, enforced before
// it is decoded: a CSR and its few fields take a few KiB (an RSA 4096
// CSR under 2), so 64 KiB leaves room and no more.
const MaxRequestBytes = 64 << 10

// ErrThrottled refuses a credential that would have to be checked by
// another service (a TokenReview of the apiserver) for a caller at an
// address that has failed to authenticate too often, unless it can be
// told genuine without that service (a token the apiserver's published
// keys verify); it maps to ResourceExhausted, and the caller should retry
// later.
var ErrThrottled = errors.New("too many failed authentications from this address; a credential not checked before must wait")

type throttledKey struct{}

// Throttled reports whether the caller of ctx is at an address over its
// budget of failed authentications: an Authenticator whose check costs
// another service refuses such a caller's credentials with ErrThrottled
// unless it has checked them before or can tell them genuine by itself;
// checks that cost ca alone go on.
func Throttled(ctx context.Context) bool {
	t, _ := ctx.Value(throttledKey{}).(bool)
	return t
}

// Failed authentications a peer address may make: this many in a burst,
// then this many a second.
const (
	failuresPerSecond = 1
	failuresBurst     = 10
)

// failures is the failure budget of a peer address.
func (s *Server) failures(addr string) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.failedBy[addr]
	if !ok {
		if len(s.failedBy) > 100_000 {
			s.failedBy = map[string]*rate.Limiter{} // bounded, as limiters
		}
		l = rate.NewLimiter(failuresPerSecond, failuresBurst)
		s.failedBy[addr] = l
	}
	return l
}

// peerAddress is the caller's IP address ("unknown" without one).
func peerAddress(ctx context.Context) string {
	return cmp.Or(grpcserver.PeerIP(ctx), "unknown")
}

func (s *Server) limiter(id string) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.limiters[id]
	if !ok {
		if len(s.limiters) > 100_000 {
			s.limiters = map[string]*rate.Limiter{} // bounded: forget everyone rather than grow without end
		}
		l = rate.NewLimiter(rate.Limit(s.o.RatePerIdentity), s.o.Burst)
		s.limiters[id] = l
	}
	return l
}

var (
	errUnavailable = errors.New("no signing key is loaded")
	errRateLimited = errors.New("too many requests")
	errDeadline    = errors.New("request deadline exceeded")
)

// toStatus maps an error to its gRPC status, once, at the edge.
func toStatus(err error) *status.Status {
	switch {
	case errors.Is(err, ErrAuthUnavailable):
		return status.New(codes.Unavailable, err.Error())
	case errors.Is(err, ErrUnauthenticated):
		return status.New(codes.Unauthenticated, err.Error())
	case errors.Is(err, authority.ErrForbidden):
		return status.New(codes.PermissionDenied, err.Error())
	case errors.Is(err, authority.ErrInvalidRequest):
		return status.New(codes.InvalidArgument, err.Error())
	case errors.Is(err, errRateLimited), errors.Is(err, ErrThrottled):
		return status.New(codes.ResourceExhausted, err.Error())
	case errors.Is(err, errUnavailable):
		return status.New(codes.Unavailable, err.Error())
	case errors.Is(err, errDeadline):
		return status.New(codes.DeadlineExceeded, err.Error())
	default:
		return status.New(codes.Internal, "signing failed")
	}
}
