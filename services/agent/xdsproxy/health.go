package xdsproxy

import (
	"context"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// healthReports holds the workload's latest health report, which every
// stream sends up (Istio's XdsProxy sendHealthCheckRequest and its
// initialHealthRequest): the latest on a new stream once Envoy's first
// request is sent, then each new one.
type healthReports struct {
	mu          sync.Mutex
	sotw, delta *frame        // the latest report, nil before the first
	changed     chan struct{} // closed and replaced on each report
}

// ReportHealth sets the workload's health, sent up the stream now and on
// every stream after it (Istio's HealthInformation request: an
// ErrorDetail with the message when unhealthy).
func (p *Proxy) ReportHealth(healthy bool, message string) {
	var detail *statuspb.Status
	if !healthy {
		detail = &statuspb.Status{Code: int32(codes.Internal), Message: message}
	}
	sotw, err := proto.Marshal(&discoveryv3.DiscoveryRequest{TypeUrl: xdstype.HealthInfoType, ErrorDetail: detail})
	if err != nil {
		return // a message of two strings: cannot fail
	}
	delta, err := proto.Marshal(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: xdstype.HealthInfoType, ErrorDetail: detail})
	if err != nil {
		return
	}
	h := &p.health
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sotw, h.delta = &frame{data: sotw}, &frame{data: delta}
	close(h.changed)
	h.changed = make(chan struct{})
}

// relay sends the latest report up one stream, and each later one, until
// ctx ends or a send fails.
func (h *healthReports) relay(ctx context.Context, delta bool, send func(*frame) error) error {
	var sent *frame
	for {
		h.mu.Lock()
		latest, changed := h.sotw, h.changed
		if delta {
			latest = h.delta
		}
		h.mu.Unlock()
		if latest != nil && latest != sent {
			if err := send(latest); err != nil {
				return err
			}
			sent = latest
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
