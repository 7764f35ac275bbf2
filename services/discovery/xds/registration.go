package xds

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Bounds of the disconnections waiting to be told to galley: past them
// galley's own sweep removes the entries (max connection age).
const (
	maxPendingDisconnects = 1024
	disconnectAttempts    = 5
	registrationTimeout   = 10 * time.Second
)

// registrations registers the WorkloadEntries of the proxies that join
// with a WorkloadGroup through galley (Registrar), as istiod's
// autoregistration controller does on connect and disconnect: a proxy's
// entry is connected while this replica has a stream of it, and told
// disconnected when its last stream here ends.
type registrations struct {
	client  galleyv1.WorkloadEntryServiceClient
	replica string
	log     *slog.Logger

	mu      sync.Mutex
	streams map[string]int // by "namespace/entry"
	pending chan *galleyv1.DisconnectRequest
}

// registration is what a stream registered: its entry and since when.
type registration struct {
	namespace, entry string
	connectedAt      time.Time
}

func newRegistrations(client galleyv1.WorkloadEntryServiceClient, replica string, log *slog.Logger) *registrations {
	if client == nil {
		return nil
	}
	return &registrations{client: client, replica: replica, log: log, streams: map[string]int{}, pending: make(chan *galleyv1.DisconnectRequest, maxPendingDisconnects)}
}

// workload is what galley is told of a proxy (Istio's
// workloadEntryFromGroup reads the same): nil when the proxy does not ask
// to be registered.
func workload(p *model.Proxy) *galleyv1.Workload {
	group := p.Metadata[proxycontract.MetadataAutoRegisterGroup]
	if group == "" {
		return nil
	}
	w := &galleyv1.Workload{
		Namespace: p.VerifiedNamespace, Group: group, Network: p.Metadata[proxycontract.MetadataNetwork], Labels: p.Labels,
		Locality: localityString(p.Locality), ServiceAccount: p.VerifiedServiceAccount,
		HealthChecked: p.ProxyConfig.GetReadinessProbe() != nil,
	}
	if len(p.IPs) > 0 {
		w.Address = p.IPs[0].String()
	}
	return w
}

// localityString is Istio's LocalityToString: the parts set, in order.
func localityString(l model.Locality) string {
	out := l.Region
	if l.Zone == "" {
		return out
	}
	out += "/" + l.Zone
	if l.Subzone == "" {
		return out
	}
	return out + "/" + l.Subzone
}

// connect registers the proxy of a new stream, if it asks to be: the
// stream is refused when galley refuses (no such WorkloadGroup, an
// identity that may not), as istiod refuses it, or cannot be asked.
func (r *registrations) connect(ctx context.Context, p *model.Proxy, at time.Time) (*registration, error) {
	w := workload(p)
	if w == nil {
		return nil, nil
	}
	if r == nil {
		return nil, status.Error(codes.FailedPrecondition, "auto-registration (AUTO_REGISTER_GROUP) needs galley in a cluster; this discovery has none to register with")
	}
	if p.VerifiedNamespace == "" {
		return nil, status.Error(codes.PermissionDenied, "registration of WorkloadEntry requires a verified identity: connect with a certificate from ca or a service account token")
	}
	if len(p.IPs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "auto-registration needs the proxy's IP address in its node ID")
	}
	cctx, cancel := context.WithTimeout(ctx, registrationTimeout)
	defer cancel()
	resp, err := r.client.Connect(cctx, &galleyv1.ConnectRequest{Replica: r.replica, Workload: w, ConnectedAt: timestamppb.New(at)})
	if err != nil {
		switch status.Code(err) {
		case codes.FailedPrecondition, codes.PermissionDenied, codes.InvalidArgument:
			return nil, err
		case codes.Unimplemented:
			return nil, status.Errorf(codes.FailedPrecondition, "auto-registration (AUTO_REGISTER_GROUP) needs galley in a cluster to write WorkloadEntries: %s", status.Convert(err).Message())
		default:
			return nil, status.Errorf(codes.Unavailable, "auto-registration with galley: %v", status.Convert(err).Message())
		}
	}
	reg := &registration{namespace: w.GetNamespace(), entry: resp.GetEntry(), connectedAt: at}
	r.mu.Lock()
	r.streams[reg.namespace+"/"+reg.entry]++
	r.mu.Unlock()
	return reg, nil
}

// disconnect ends a stream's registration: when it was the proxy's last
// stream here, galley is told (in the background, retried).
func (r *registrations) disconnect(reg *registration, at time.Time) {
	if r == nil || reg == nil {
		return
	}
	key := reg.namespace + "/" + reg.entry
	r.mu.Lock()
	r.streams[key]--
	last := r.streams[key] <= 0
	if last {
		delete(r.streams, key)
	}
	r.mu.Unlock()
	if !last {
		return
	}
	req := &galleyv1.DisconnectRequest{
		Replica: r.replica, Namespace: reg.namespace, Entry: reg.entry,
		ConnectedAt: timestamppb.New(reg.connectedAt), DisconnectedAt: timestamppb.New(at),
	}
	select {
	case r.pending <- req:
	default:
		r.log.Warn("too many disconnections waiting for galley: this one is left to galley's sweep", "entry", key)
	}
}

// run tells galley the disconnections, each retried with backoff.
func (r *registrations) run(ctx context.Context) {
	if r == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case req := <-r.pending:
			backoff := 100 * time.Millisecond
			for attempt := range disconnectAttempts {
				cctx, cancel := context.WithTimeout(ctx, registrationTimeout)
				_, err := r.client.Disconnect(cctx, req)
				cancel()
				if err == nil || ctx.Err() != nil {
					break
				}
				if attempt == disconnectAttempts-1 {
					r.log.Warn("telling galley of a disconnection", "entry", req.GetNamespace()+"/"+req.GetEntry(), "error", err)
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff *= 2
			}
		}
	}
}
