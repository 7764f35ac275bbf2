// Package carelay serves Istio's certificate service
// (istio.v1.auth.IstioCertificateService) on discovery's secure port by
// passing each request on to ca. Istio's agent, as Istio injects it, sends
// its certificate requests to istiod's address unless told another
// (pilot-agent's CA_ADDR defaults to its discoveryAddress), because istiod
// is also Istio's CA; in Flotilla ca is its own service, so discovery,
// which plays istiod's part, relays — and pods Istio injected get their
// certificates unchanged.
//
// The relay adds nothing of its own: the request goes on with the
// caller's token only, over a connection that presents no certificate of
// discovery's (ca must authenticate the proxy, never discovery), and ca's
// answer — the certificate chain or the error and its code — comes back
// as it is. ca sees discovery's address as the caller's: its budget of
// failed authentications is then shared by the proxies of this replica,
// which costs a genuine token nothing (ca checks a token the apiserver
// signed against the apiserver's keys, whatever the address's budget).
package carelay

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/flotilla-mesh/flotilla/services/discovery/tokens"
)

// MaxRequestBytes bounds a request passed on: ca's own bound.
const MaxRequestBytes = 64 << 10

// maxTokenBytes bounds the authorization header passed on: the bound on
// a token discovery passes to ca (ca's own), and "Bearer ".
const maxTokenBytes = tokens.MaxTokenBytes + len("Bearer ")

// Relay is IstioCertificateService, answered by ca.
type Relay struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	ca      securityv1alpha1.IstioCertificateServiceClient
	timeout time.Duration
}

// New returns a relay to ca's client, over a connection that presents no
// client certificate.
func New(ca securityv1alpha1.IstioCertificateServiceClient) *Relay {
	return &Relay{ca: ca, timeout: 10 * time.Second}
}

// CreateCertificate passes the request and the caller's token to ca.
func (r *Relay) CreateCertificate(ctx context.Context, req *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	if n := proto.Size(req); n > MaxRequestBytes {
		return nil, status.Errorf(codes.InvalidArgument, "certificate request of %d bytes, more than %d", n, MaxRequestBytes)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	auth := md.Get("authorization")
	switch {
	case len(auth) == 0:
		return nil, status.Error(codes.Unauthenticated, "no token: send the pod's service account token (audience istio-ca) as \"authorization: Bearer <token>\"")
	case len(auth) > 1:
		return nil, status.Error(codes.Unauthenticated, "more than one authorization header")
	case len(auth[0]) > maxTokenBytes:
		return nil, status.Errorf(codes.Unauthenticated, "authorization header of %d bytes, more than %d", len(auth[0]), maxTokenBytes)
	}
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(ctx, metadata.Pairs("authorization", auth[0])), r.timeout)
	defer cancel()
	resp, err := r.ca.CreateCertificate(ctx, req)
	if err != nil {
		if st, ok := status.FromError(err); ok {
			return nil, st.Err() // ca's answer, as it is
		}
		return nil, status.Error(codes.Unavailable, fmt.Sprintf("ca: %v", err))
	}
	return resp, nil
}
