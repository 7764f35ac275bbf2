// Package meshid reads the mesh identity (the SPIFFE ID in a certificate's
// URI SAN) of the other end of a gRPC call.
package meshid

import (
	"context"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// OfContext is the SPIFFE ID of the caller of a server call, "" when the
// call came without a mesh certificate.
func OfContext(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	return OfPeer(p)
}

// OfPeer is the SPIFFE ID of p's certificate, "" when it presented none
// (plaintext, or TLS without a SPIFFE ID).
func OfPeer(p *peer.Peer) string {
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return ""
	}
	for _, u := range info.State.PeerCertificates[0].URIs {
		if strings.EqualFold(u.Scheme, "spiffe") {
			return u.String()
		}
	}
	return ""
}
