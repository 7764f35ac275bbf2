package ipallocate

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	networking "istio.io/api/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/platform/leader"
)

// Options configures a Controller.
type Options struct {
	Kube    kubernetes.Interface // for the Lease
	Dynamic dynamic.Interface    // writes status
	Log     *slog.Logger
	// Objects returns the objects galley serves, with the status it reads
	// (kubesource.Source.Objects).
	Objects func() []*istio.Object
	// IPv4 and IPv6 are the ranges addresses are taken from.
	IPv4, IPv6 netip.Prefix
	// Synced is closed once Objects holds everything in the cluster: a
	// leader plans nothing before, lest it hand out an address it has
	// not yet read in a status (Istio warms its cache the same way).
	Synced <-chan struct{}
	// Identity names this replica in the Lease (the pod name).
	Identity string
	// LeaseNamespace and LeaseName locate the Lease.
	LeaseNamespace, LeaseName string
	// Resync is how often the leader plans without being told of a
	// change (Changed). Default 30s.
	Resync time.Duration
	// Lease timings; defaults as leader.Options.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Controller writes ServiceEntries' status.addresses while it leads.
type Controller struct {
	o    Options
	kick chan struct{}
}

// NewController returns a controller; it checks the ranges.
func NewController(o Options) (*Controller, error) {
	if _, err := New(o.IPv4, o.IPv6); err != nil {
		return nil, err
	}
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	o.Log = o.Log.With("component", "ip-autoallocate", "identity", o.Identity)
	return &Controller{o: o, kick: make(chan struct{}, 1)}, nil
}

// Changed tells the controller that what Objects returns changed. It
// never blocks.
func (c *Controller) Changed() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run campaigns for the Lease and, while leading, keeps status.addresses
// planned. It returns when ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	return leader.Run(ctx, leader.Options{
		Client: c.o.Kube, Log: c.o.Log, Namespace: c.o.LeaseNamespace, Name: c.o.LeaseName, Identity: c.o.Identity,
		LeaseDuration: c.o.LeaseDuration, RenewDeadline: c.o.RenewDeadline, RetryPeriod: c.o.RetryPeriod,
	}, c.lead)
}

func (c *Controller) lead(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-c.o.Synced:
	}
	c.o.Log.Info("leading: allocating ServiceEntry addresses", "ipv4", c.o.IPv4.String(), "ipv6", c.o.IPv6.String())
	alloc, err := New(c.o.IPv4, c.o.IPv6) // a new term starts from the ranges' start, as Istio's
	if err != nil {
		c.o.Log.Error("ranges", "error", err)
		return
	}
	tick := time.NewTicker(c.o.Resync)
	defer tick.Stop()
	var reported []string
	for {
		problems := c.reconcile(ctx, alloc)
		if !slices.Equal(problems, reported) && len(problems) > 0 {
			c.o.Log.Error("ServiceEntry hosts left without addresses", "count", len(problems), "first", problems[0])
		}
		reported = problems
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-tick.C:
		}
	}
}

var serviceEntries = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}

// reconcile plans and writes. A write that fails (the status changed
// since it was read) is planned again on the next change, from what the
// informer then holds.
func (c *Controller) reconcile(ctx context.Context, alloc *Allocator) []string {
	changes, problems := alloc.Plan(c.o.Objects())
	for _, ch := range changes {
		if ctx.Err() != nil {
			break
		}
		err := c.write(ctx, ch)
		if err != nil {
			alloc.Release(ch.Allocated)
		}
		switch {
		case err == nil:
			c.o.Log.Info("ServiceEntry addresses written", "object", ch.ID.Name, "addresses", len(ch.Addresses), "before", len(ch.Current))
		case errors.IsNotFound(err) || errors.IsConflict(err) || errors.IsInvalid(err):
			c.o.Log.Debug("ServiceEntry changed before its addresses were written; planning again", "object", ch.ID.Name, "error", err)
		default:
			c.o.Log.Warn("writing ServiceEntry addresses", "object", ch.ID.Name, "error", err)
		}
	}
	return problems
}

// write patches the status subresource with a JSON patch that first tests
// that status.addresses are still what the plan was made from, as Istio's
// statusPatchForAddresses: the apiserver refuses it if another writer
// (a replica that led before) changed them since. Only status.addresses
// change; the rest of the status stays. When the object has no status
// yet, the first patch fails and the second creates it.
func (c *Controller) write(ctx context.Context, ch Change) error {
	ns, name, _ := strings.Cut(ch.ID.Name, "/")
	res := c.o.Dynamic.Resource(serviceEntries).Namespace(ns)
	current, want := addressList(ch.Current), addressList(ch.Addresses)
	if want == nil {
		want = []address{}
	}
	patch := func(ops ...jsonPatch) error {
		body, err := json.Marshal(ops)
		if err != nil {
			return err
		}
		_, err = res.Patch(ctx, name, types.JSONPatchType, body, metav1.PatchOptions{FieldManager: "flotilla-galley"}, "status")
		return err
	}
	err := patch(jsonPatch{Op: "test", Path: "/status/addresses", Value: current}, jsonPatch{Op: "add", Path: "/status/addresses", Value: want})
	if err == nil || len(ch.Current) > 0 {
		return err
	}
	return patch(jsonPatch{Op: "test", Path: "/status", Value: nil}, jsonPatch{Op: "add", Path: "/status", Value: map[string]any{}},
		jsonPatch{Op: "add", Path: "/status/addresses", Value: want})
}

type jsonPatch struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

type address struct {
	Value string `json:"value"`
	Host  string `json:"host"`
}

func addressList(addrs []*networking.ServiceEntryAddress) []address {
	var out []address
	for _, a := range addrs {
		out = append(out, address{Value: a.GetValue(), Host: a.GetHost()})
	}
	return out
}
