package xds

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Bounds of the disconnections waiting to be told to galley: past them
// galley's own sweep removes the entries (max connection age).
const (
	maxPendingDisconnects = 1024
	disconnectAttempts    = 5
	registrationTimeout   = 10 * time.Second
	// Health reports: at most one waits per entry (the latest), at most
	// 1024 entries wait, and galley is sent 20 a second, in turn, so a
	// workload whose probe flaps takes its turn and no more.
	maxPendingHealth = 1024
	healthAttempts   = 3
	healthPerSecond  = 20
	maxHealthMessage = 1000 // clipped, under galley's bound of 1024 bytes
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

	// health holds the latest report waiting per entry; healthQueue the
	// entries in the order their reports came (each at most once).
	health      map[string]*galleyv1.ReportHealthRequest
	healthQueue chan string
	healthLimit *rate.Limiter
}

// registration is what a stream registered: its entry and since when,
// and the last health the stream reported.
type registration struct {
	namespace, entry string
	connectedAt      time.Time

	mu       sync.Mutex
	reported bool
	healthy  bool
	message  string
}

// reportHealth relays a health report of the stream's proxy (Istio's
// HealthInformation request: its agent's readiness probe, an ErrorDetail
// when unhealthy) to galley, for the entry the stream registered; the
// same verdict again is not relayed.
func (c *conn) reportHealth(detail *statuspb.Status) {
	reg := c.registration
	if reg == nil {
		c.s.log.Debug("a health report from a proxy with no WorkloadEntry registered here", "proxy", c.id)
		return
	}
	healthy, message := detail == nil, clip.String(detail.GetMessage(), maxHealthMessage)
	reg.mu.Lock()
	same := reg.reported && reg.healthy == healthy && reg.message == message
	reg.reported, reg.healthy, reg.message = true, healthy, message
	reg.mu.Unlock()
	if !same {
		c.s.registrations.reportHealth(reg, healthy, message, time.Now())
	}
}

func newRegistrations(client galleyv1.WorkloadEntryServiceClient, replica string, log *slog.Logger) *registrations {
	if client == nil {
		return nil
	}
	return &registrations{
		client: client, replica: replica, log: log, streams: map[string]int{}, pending: make(chan *galleyv1.DisconnectRequest, maxPendingDisconnects),
		health: map[string]*galleyv1.ReportHealthRequest{}, healthQueue: make(chan string, maxPendingHealth), healthLimit: rate.NewLimiter(healthPerSecond, 1),
	}
}

// workload is what galley is told of a proxy (Istio's
// workloadEntryFromGroup reads the same): nil when the proxy neither asks
// to be registered nor names its WorkloadEntry (a group wins, as in
// Istio's OnConnect).
func workload(p *model.Proxy) *galleyv1.Workload {
	group, entry := p.Metadata[proxycontract.MetadataAutoRegisterGroup], p.Metadata[proxycontract.MetadataWorkloadEntry]
	if group != "" {
		entry = ""
	}
	if group == "" && entry == "" {
		return nil
	}
	w := &galleyv1.Workload{
		Namespace: p.VerifiedNamespace, Group: group, Entry: entry, Network: p.Metadata[proxycontract.MetadataNetwork], Labels: p.Labels,
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
	if r == nil && w.GetGroup() == "" {
		return nil, nil // its entry's health goes nowhere without galley: as without health checks
	}
	if r == nil {
		return nil, status.Error(codes.FailedPrecondition, "auto-registration (AUTO_REGISTER_GROUP) needs galley in a cluster; this discovery has none to register with")
	}
	if p.VerifiedNamespace == "" {
		return nil, status.Error(codes.PermissionDenied, "registration of WorkloadEntry requires a verified identity: connect with a certificate from ca or a service account token")
	}
	if len(p.IPs) == 0 && w.GetGroup() != "" {
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
			if w.GetGroup() == "" {
				return nil, nil
			}
			return nil, status.Errorf(codes.FailedPrecondition, "auto-registration (AUTO_REGISTER_GROUP) needs galley in a cluster to write WorkloadEntries: %s", status.Convert(err).Message())
		default:
			return nil, status.Errorf(codes.Unavailable, "auto-registration with galley: %v", status.Convert(err).Message())
		}
	}
	if resp.GetEntry() == "" {
		return nil, nil // a named entry whose health is not checked: nothing to control
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

// reportHealth queues a stream's health report for its entry (Istio's
// handleWorkloadHealthcheck): the latest report of an entry replaces one
// still waiting. A stream that registered nothing has no entry to report
// into: its reports are let be, as istiod's.
func (r *registrations) reportHealth(reg *registration, healthy bool, message string, at time.Time) {
	if r == nil || reg == nil {
		return
	}
	key := reg.namespace + "/" + reg.entry
	req := &galleyv1.ReportHealthRequest{
		Replica: r.replica, Namespace: reg.namespace, Entry: reg.entry, Healthy: healthy,
		Message: clip.String(message, maxHealthMessage), ProbedAt: timestamppb.New(at),
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, waiting := r.health[key]; waiting {
		r.health[key] = req
		return
	}
	select {
	case r.healthQueue <- key:
		r.health[key] = req
	default:
		r.log.Warn("too many health reports waiting for galley: one is dropped (the workload's next change of health is reported)")
	}
}

// runHealth sends the waiting health reports to galley, in turn, each
// retried a few times; a report galley cannot take (its entry is gone)
// is dropped.
func (r *registrations) runHealth(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case key := <-r.healthQueue:
			r.mu.Lock()
			req := r.health[key]
			delete(r.health, key)
			r.mu.Unlock()
			for attempt := range healthAttempts {
				if err := r.healthLimit.Wait(ctx); err != nil {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, registrationTimeout)
				_, err := r.client.ReportHealth(cctx, req)
				cancel()
				if err == nil || ctx.Err() != nil {
					break
				}
				if c := status.Code(err); c == codes.NotFound || c == codes.InvalidArgument || c == codes.PermissionDenied || attempt == healthAttempts-1 {
					r.log.Warn("reporting a workload's health to galley", "entry", key, "error", err)
					break
				}
			}
		}
	}
}

// run tells galley the disconnections, each retried with backoff, and
// the workloads' health reports.
func (r *registrations) run(ctx context.Context) {
	if r == nil {
		return
	}
	go r.runHealth(ctx)
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
