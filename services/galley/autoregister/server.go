package autoregister

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clientnetworking "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	galleyv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/galley/v1"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Defaults and bounds (Istio's where Istio has one).
const (
	// DefaultGracePeriod is how long an entry stays after its workload
	// disconnected (PILOT_WORKLOAD_ENTRY_GRACE_PERIOD).
	DefaultGracePeriod = 10 * time.Second
	// DefaultMaxConnectionAge is how long a connection lasts at most:
	// discovery's xdsMaxConnectionAge (30 minutes, Istio's
	// MaxServerConnectionAge) with its +10 % jitter and its drain, rounded
	// up. Istio's controller uses MaxServerConnectionAge itself.
	DefaultMaxConnectionAge = 35 * time.Minute
	// cleanupsPerSecond bounds deletions (Istio's cleanupLimit).
	cleanupsPerSecond = 20
	// maxAttempts bounds the retries of a write that lost a race with
	// another (resourceVersion conflicts).
	maxAttempts = 5
	// maxPendingCleanups bounds the cleanups waiting for their grace
	// period; beyond, the periodic sweep removes the entries.
	maxPendingCleanups = 4096
	// maxLabels bounds a workload's labels, as discovery bounds a node's.
	maxLabels = proxycontract.MaxLabels
)

// Options configures a Server.
type Options struct {
	// Istio writes the WorkloadEntries and reads the WorkloadGroups.
	Istio istioclient.Interface
	// Caller says whether a caller's identity may call (discovery's).
	Caller func(identity string) bool
	Log    *slog.Logger
	Now    func() time.Time
	// GracePeriod defaults to DefaultGracePeriod. MaxConnectionAge is
	// taken as given (galley's flag defaults to DefaultMaxConnectionAge):
	// 0 or less never sweeps an entry marked connected.
	GracePeriod      time.Duration
	MaxConnectionAge time.Duration
}

// Server is galley's WorkloadEntryService, and the cleanup of the entries
// it registered (Run). Safe for concurrent use.
type Server struct {
	galleyv1.UnimplementedWorkloadEntryServiceServer
	o        Options
	limit    *rate.Limiter
	cleanups chan cleanup
}

// cleanup is an entry to look at once its grace period is over.
type cleanup struct {
	namespace, name string
	due             time.Time
}

// New returns a server; Run sweeps.
func New(o Options) *Server {
	if o.GracePeriod <= 0 {
		o.GracePeriod = DefaultGracePeriod
	}
	return &Server{o: o, limit: rate.NewLimiter(cleanupsPerSecond, 1), cleanups: make(chan cleanup, maxPendingCleanups)}
}

// Register serves it on g.
func (s *Server) Register(g *grpc.Server) { galleyv1.RegisterWorkloadEntryServiceServer(g, s) }

// Connect registers a workload, or takes its entry over.
func (s *Server) Connect(ctx context.Context, req *galleyv1.ConnectRequest) (*galleyv1.ConnectResponse, error) {
	if err := s.authorize(ctx, req.GetReplica()); err != nil {
		return nil, err
	}
	w := req.GetWorkload()
	if err := checkWorkload(w); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.GetConnectedAt() == nil {
		return nil, status.Error(codes.InvalidArgument, "connected_at is required")
	}
	at := req.GetConnectedAt().AsTime()
	ns, name := w.GetNamespace(), EntryName(w)
	entries := s.o.Istio.NetworkingV1().WorkloadEntries(ns)
	for range maxAttempts {
		we, err := entries.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && w.GetGroup() == "" {
			// Istio's OnConnect: "proxy metadata indicates that it must
			// correspond to an existing WorkloadEntry".
			return nil, status.Errorf(codes.FailedPrecondition, "the workload names WorkloadEntry %s/%s (ISTIO_META_WORKLOAD_ENTRY), which does not exist", ns, name)
		}
		if apierrors.IsNotFound(err) {
			wg, err := s.o.Istio.NetworkingV1().WorkloadGroups(ns).Get(ctx, w.GetGroup(), metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil, status.Errorf(codes.FailedPrecondition, "auto-registration of a workload at %s failed: cannot find WorkloadGroup %s/%s", w.GetAddress(), ns, w.GetGroup())
			}
			if err != nil {
				return nil, unavailable("read WorkloadGroup", err)
			}
			entry := fromGroup(name, w, wg)
			if !mayControl(w, &entry.Spec, ns) {
				return nil, status.Errorf(codes.PermissionDenied, "WorkloadGroup %s/%s is for service account %q, the workload is %q", ns, wg.Name, entry.Spec.GetServiceAccount(), w.GetServiceAccount())
			}
			setConnected(entry, req.GetReplica(), at)
			_, err = entries.Create(ctx, entry, metav1.CreateOptions{FieldManager: "flotilla-galley"})
			if apierrors.IsAlreadyExists(err) {
				continue // another replica's connect won the race: look again
			}
			if err != nil {
				return nil, unavailable("create WorkloadEntry", err)
			}
			s.o.Log.Info("auto-registered WorkloadEntry", "entry", ns+"/"+name, "replica", req.GetReplica())
			return &galleyv1.ConnectResponse{Entry: name}, nil
		}
		if err != nil {
			return nil, unavailable("read WorkloadEntry", err)
		}
		if w.GetGroup() == "" && !healthChecked(we) {
			return &galleyv1.ConnectResponse{}, nil // not controlled (Istio's IsEligibleForHealthStatusUpdates)
		}
		if !mayControl(w, &we.Spec, we.Namespace) {
			return nil, status.Errorf(codes.PermissionDenied, "WorkloadEntry %s/%s is for service account %q, the workload is %q", ns, name, we.Spec.GetServiceAccount(), w.GetServiceAccount())
		}
		updated, changed := connectedBy(we, req.GetReplica(), at)
		if !changed {
			return &galleyv1.ConnectResponse{Entry: name}, nil
		}
		_, err = entries.Update(ctx, updated, metav1.UpdateOptions{FieldManager: "flotilla-galley"})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, unavailable("update WorkloadEntry", err)
		}
		return &galleyv1.ConnectResponse{Entry: name}, nil
	}
	return nil, status.Errorf(codes.Aborted, "WorkloadEntry %s/%s changed %d times while being written; try again", ns, name, maxAttempts)
}

// Disconnect marks an entry disconnected, and schedules its removal.
func (s *Server) Disconnect(ctx context.Context, req *galleyv1.DisconnectRequest) (*galleyv1.DisconnectResponse, error) {
	if err := s.authorize(ctx, req.GetReplica()); err != nil {
		return nil, err
	}
	ns, name := req.GetNamespace(), req.GetEntry()
	if err := checkEntry(ns, name); err != nil {
		return nil, err
	}
	if req.GetConnectedAt() == nil || req.GetDisconnectedAt() == nil {
		return nil, status.Error(codes.InvalidArgument, "connected_at and disconnected_at are required")
	}
	entries := s.o.Istio.NetworkingV1().WorkloadEntries(ns)
	for range maxAttempts {
		we, err := entries.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return &galleyv1.DisconnectResponse{}, nil // removed meanwhile
		}
		if err != nil {
			return nil, unavailable("read WorkloadEntry", err)
		}
		updated, changed := disconnectedBy(we, req.GetReplica(), req.GetConnectedAt().AsTime(), req.GetDisconnectedAt().AsTime())
		if !changed {
			return &galleyv1.DisconnectResponse{}, nil
		}
		_, err = entries.Update(ctx, updated, metav1.UpdateOptions{FieldManager: "flotilla-galley"})
		if apierrors.IsConflict(err) {
			continue
		}
		if apierrors.IsNotFound(err) {
			return &galleyv1.DisconnectResponse{}, nil
		}
		if err != nil {
			return nil, unavailable("update WorkloadEntry", err)
		}
		if autoRegistered(we) || healthChecked(we) {
			select {
			case s.cleanups <- cleanup{namespace: ns, name: name, due: s.o.Now().Add(s.o.GracePeriod)}:
			default: // the periodic sweep removes it
			}
		}
		return &galleyv1.DisconnectResponse{}, nil
	}
	return nil, status.Errorf(codes.Aborted, "WorkloadEntry %s/%s changed %d times while being written; try again", ns, name, maxAttempts)
}

// ReportHealth writes a workload's health into its entry's Healthy
// condition.
func (s *Server) ReportHealth(ctx context.Context, req *galleyv1.ReportHealthRequest) (*galleyv1.ReportHealthResponse, error) {
	if err := s.authorize(ctx, req.GetReplica()); err != nil {
		return nil, err
	}
	ns, name := req.GetNamespace(), req.GetEntry()
	if err := checkEntry(ns, name); err != nil {
		return nil, err
	}
	if req.GetProbedAt() == nil {
		return nil, status.Error(codes.InvalidArgument, "probed_at is required")
	}
	if len(req.GetMessage()) > maxHealthMessage {
		return nil, status.Errorf(codes.InvalidArgument, "message: %d bytes, at most %d", len(req.GetMessage()), maxHealthMessage)
	}
	entries := s.o.Istio.NetworkingV1().WorkloadEntries(ns)
	for range maxAttempts {
		we, err := entries.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, status.Errorf(codes.NotFound, "WorkloadEntry %s/%s does not exist", ns, name)
		}
		if err != nil {
			return nil, unavailable("read WorkloadEntry", err)
		}
		updated, changed := healthReportedBy(we, req.GetReplica(), req.GetHealthy(), req.GetMessage(), req.GetProbedAt().AsTime())
		if !changed {
			return &galleyv1.ReportHealthResponse{}, nil
		}
		_, err = entries.UpdateStatus(ctx, updated, metav1.UpdateOptions{FieldManager: "flotilla-galley"})
		if apierrors.IsConflict(err) {
			continue
		}
		if apierrors.IsNotFound(err) {
			return nil, status.Errorf(codes.NotFound, "WorkloadEntry %s/%s does not exist", ns, name)
		}
		if err != nil {
			return nil, unavailable("update WorkloadEntry status", err)
		}
		return &galleyv1.ReportHealthResponse{}, nil
	}
	return nil, status.Errorf(codes.Aborted, "WorkloadEntry %s/%s changed %d times while being written; try again", ns, name, maxAttempts)
}

// checkEntry refuses a namespace or an entry name that no object has.
func checkEntry(ns, name string) error {
	if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
		return status.Errorf(codes.InvalidArgument, "namespace: %s", strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return status.Errorf(codes.InvalidArgument, "entry: %s", strings.Join(msgs, "; "))
	}
	return nil
}

func (s *Server) authorize(ctx context.Context, replica string) error {
	if identity := mcp.PeerIdentity(ctx); !s.o.Caller(identity) {
		return status.Errorf(codes.PermissionDenied, "WorkloadEntries are registered for discovery only, not for %s", identity)
	}
	if replica == "" || len(replica) > maxNameLength {
		return status.Error(codes.InvalidArgument, "replica: want a name of 1 to 253 bytes")
	}
	return nil
}

func unavailable(what string, err error) error {
	return status.Errorf(codes.Unavailable, "%s: %v", what, err)
}

// checkWorkload refuses what would make an entry Kubernetes rejects, or
// an unbounded one.
func checkWorkload(w *galleyv1.Workload) error {
	if w == nil {
		return errors.New("workload is required")
	}
	if msgs := validation.IsDNS1123Label(w.GetNamespace()); len(msgs) > 0 {
		return fmt.Errorf("workload.namespace: %s", strings.Join(msgs, "; "))
	}
	switch {
	case w.GetGroup() != "" && w.GetEntry() != "":
		return errors.New("workload: a group or an entry, not both")
	case w.GetGroup() == "":
		if msgs := validation.IsDNS1123Subdomain(w.GetEntry()); len(msgs) > 0 {
			return fmt.Errorf("workload.entry: %s", strings.Join(msgs, "; "))
		}
	default:
		if msgs := validation.IsDNS1123Subdomain(w.GetGroup()); len(msgs) > 0 {
			return fmt.Errorf("workload.group: %s", strings.Join(msgs, "; "))
		}
	}
	if _, err := netip.ParseAddr(w.GetAddress()); err != nil && (w.GetGroup() != "" || w.GetAddress() != "") {
		return fmt.Errorf("workload.address: %w", err)
	}
	if n := w.GetNetwork(); len(n) > 63 || strings.ContainsAny(n, " /") {
		return errors.New("workload.network: at most 63 bytes, without spaces or '/'")
	}
	if l := w.GetLocality(); len(l) > 253 || strings.Count(l, "/") > 2 {
		return errors.New("workload.locality: region/zone/subzone, at most 253 bytes")
	}
	if sa := w.GetServiceAccount(); sa != "" {
		if msgs := validation.IsDNS1123Subdomain(sa); len(msgs) > 0 {
			return fmt.Errorf("workload.service_account: %s", strings.Join(msgs, "; "))
		}
	}
	if msgs := validation.IsDNS1123Subdomain(EntryName(w)); len(msgs) > 0 {
		return fmt.Errorf("workload: its entry's name %q (group-address-network) is no object name: %s", EntryName(w), strings.Join(msgs, "; "))
	}
	if len(w.GetLabels()) > maxLabels {
		return fmt.Errorf("workload.labels: %d labels, at most %d", len(w.GetLabels()), maxLabels)
	}
	for k, v := range w.GetLabels() {
		if k == localityLabel {
			continue // dropped
		}
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			return fmt.Errorf("workload.labels: key %q: %s", k, strings.Join(msgs, "; "))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			return fmt.Errorf("workload.labels[%q]: %s", k, strings.Join(msgs, "; "))
		}
	}
	return nil
}

// Run removes the entries that stayed disconnected for the grace period:
// each one Disconnect marked once its period is over, and every ten grace
// periods all that are stale (Istio's periodicWorkloadEntryCleanup), at
// most 20 a second.
func (s *Server) Run(ctx context.Context) error {
	sweep := time.NewTicker(10 * s.o.GracePeriod)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-s.cleanups:
			// FIFO with one grace period for all: due in order.
			if d := c.due.Sub(s.o.Now()); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-ctx.Done():
					t.Stop()
					return nil
				case <-t.C:
				}
			}
			we, err := s.o.Istio.NetworkingV1().WorkloadEntries(c.namespace).Get(ctx, c.name, metav1.GetOptions{})
			if err == nil {
				s.remove(ctx, we)
			}
		case <-sweep.C:
			s.Sweep(ctx)
		}
	}
}

// Sweep removes every stale auto-registered entry.
func (s *Server) Sweep(ctx context.Context) {
	list, err := s.o.Istio.NetworkingV1().WorkloadEntries(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		s.o.Log.Warn("WorkloadEntry cleanup: list", "error", err)
		return
	}
	for _, we := range list.Items {
		s.remove(ctx, we)
	}
}

// remove deletes an auto-registered entry if it is stale, or the health
// condition of a stale health-checked one (Istio's cleanupEntry: its
// health is no longer known), unless it changed since it was read.
func (s *Server) remove(ctx context.Context, we *clientnetworking.WorkloadEntry) {
	if !stale(we, s.o.Now(), s.o.GracePeriod, s.o.MaxConnectionAge) {
		return
	}
	if err := s.limit.Wait(ctx); err != nil {
		return
	}
	if !autoRegistered(we) {
		out := withoutHealth(we)
		_, err := s.o.Istio.NetworkingV1().WorkloadEntries(we.Namespace).UpdateStatus(ctx, out, metav1.UpdateOptions{FieldManager: "flotilla-galley"})
		switch {
		case err == nil:
			s.o.Log.Info("removed the health of a WorkloadEntry whose workload left", "entry", we.Namespace+"/"+we.Name)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		default:
			s.o.Log.Warn("WorkloadEntry cleanup", "entry", we.Namespace+"/"+we.Name, "error", err)
		}
		return
	}
	rv := we.ResourceVersion
	err := s.o.Istio.NetworkingV1().WorkloadEntries(we.Namespace).Delete(ctx, we.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	switch {
	case err == nil:
		s.o.Log.Info("removed auto-registered WorkloadEntry", "entry", we.Namespace+"/"+we.Name)
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
	default:
		s.o.Log.Warn("WorkloadEntry cleanup", "entry", we.Namespace+"/"+we.Name, "error", err)
	}
}
