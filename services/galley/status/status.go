// Package status writes galley's verdict on invalid Istio objects that are
// in the cluster anyway (created before the webhook, or with it bypassed)
// into their status.validationMessages, so `kubectl get -o yaml` shows why
// the mesh ignores them; and clears it when they are fixed. Only the elected
// leader among galley replicas writes (a Lease), so replicas never fight.
package status

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/platform/leader"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// MessageCode marks Flotilla's validation messages among others in status.
const MessageCode = "FLT0001"

// FindingName and FindingCode mark what discovery found wrong with an
// object it serves (an EnvoyFilter patch it could not apply).
const (
	FindingName = "EnvoyFilterPatchNotApplied"
	FindingCode = string(validation.CodeEnvoyFilter)
)

// verdict is what galley says of an object: the message, and of which
// kind (the zero verdict says nothing: its status is cleared).
type verdict struct {
	kind verdictKind
	msg  string
}

type verdictKind int

const (
	invalid verdictKind = iota + 1 // rejected by validation
	finding                        // accepted, and found wrong by discovery
)

// Options configures a Writer.
type Options struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	Log     *slog.Logger
	// Rejected returns the invalid objects and why (kubesource.Source.Rejected).
	Rejected func() map[istio.ID]string
	// Findings returns what discovery found wrong with objects galley
	// serves and accepted (the EnvoyFilters' patches it could not apply:
	// envoyfilterstatus.Server.Findings); may be nil. An object invalid
	// and with findings shows that it is invalid.
	Findings func() map[istio.ID]string
	// Identity names this replica in the Lease (the pod name).
	Identity string
	// LeaseNamespace and LeaseName locate the Lease.
	LeaseNamespace, LeaseName string
	// Interval is how often the leader reconciles. Default 2s.
	Interval time.Duration
	// Lease timings; defaults 15s, 10s, 2s as client-go recommends.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Writer reconciles status while it leads.
type Writer struct {
	o       Options
	written map[istio.ID]verdict // what this leader last wrote
}

// New returns a writer.
func New(o Options) *Writer {
	if o.Interval == 0 {
		o.Interval = 2 * time.Second
	}
	o.Log = o.Log.With("component", "status-writer", "identity", o.Identity)
	return &Writer{o: o, written: map[istio.ID]verdict{}}
}

// Run campaigns for the Lease and, while leading, reconciles status. It
// returns when ctx ends, releasing the Lease so another replica takes over
// at once.
func (w *Writer) Run(ctx context.Context) error {
	return leader.Run(ctx, leader.Options{
		Client: w.o.Kube, Log: w.o.Log, Namespace: w.o.LeaseNamespace, Name: w.o.LeaseName, Identity: w.o.Identity,
		LeaseDuration: w.o.LeaseDuration, RenewDeadline: w.o.RenewDeadline, RetryPeriod: w.o.RetryPeriod,
	}, w.lead)
}

func (w *Writer) lead(ctx context.Context) {
	w.o.Log.Info("leading: writing validation status")
	w.written = map[istio.ID]verdict{} // a new leader trusts nothing it did not write itself
	tick := time.NewTicker(w.o.Interval)
	defer tick.Stop()
	for {
		w.reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// reconcile writes messages for newly rejected objects and clears them for
// fixed ones.
func (w *Writer) reconcile(ctx context.Context) {
	want := map[istio.ID]verdict{}
	add := func(kind verdictKind, msgs map[istio.ID]string) {
		for id, msg := range msgs {
			want[id] = verdict{kind: kind, msg: msg}
		}
	}
	if w.o.Findings != nil {
		add(finding, w.o.Findings())
	}
	add(invalid, w.o.Rejected())
	ids := slices.Collect(maps.Keys(want))
	for id := range w.written {
		if _, ok := want[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b istio.ID) int {
		return cmp.Or(strings.Compare(a.Kind, b.Kind), strings.Compare(a.Name, b.Name))
	})
	for _, id := range ids {
		v, say := want[id]
		if w.written[id] == v {
			continue
		}
		if err := w.write(ctx, id, v); err != nil {
			w.o.Log.Warn("writing status", "object", id.Kind+" "+id.Name, "error", err)
			continue
		}
		if say {
			w.written[id] = v
		} else {
			delete(w.written, id)
		}
	}
}

// message is one entry of Istio's status.validationMessages (an
// AnalysisMessageBase), with the reason in "message".
type message struct {
	Type    messageType `json:"type"`
	Level   string      `json:"level"`
	Message string      `json:"message"`
}

type messageType struct {
	Name string `json:"name"`
	Code string `json:"code"`
}

// write sets (a verdict) or clears (the zero verdict) the object's
// messages with a merge patch of the status subresource: only status
// changes, so the object's generation, and what galley publishes, stay
// the same.
func (w *Writer) write(ctx context.Context, id istio.ID, v verdict) error {
	kind, ns, name, err := locate(id)
	if err != nil {
		return err
	}
	var messages []message
	switch v.kind {
	case invalid:
		messages = []message{{Type: messageType{Name: "InvalidConfiguration", Code: MessageCode}, Level: "ERROR", Message: v.msg}}
	case finding:
		messages = []message{{Type: messageType{Name: FindingName, Code: FindingCode}, Level: "WARNING", Message: v.msg}}
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"validationMessages": messages}})
	if err != nil {
		return fmt.Errorf("encode status: %w", err)
	}
	gvr := schema.GroupVersionResource{Group: kind.Group, Version: kind.Version(), Resource: kind.Plural}
	_, err = w.o.Dynamic.Resource(gvr).Namespace(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "flotilla-galley"}, "status")
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile: nothing to report on
	}
	if err != nil {
		return fmt.Errorf("patch status of %s %s: %w", id.Kind, id.Name, err)
	}
	return nil
}

// locate finds an object's kind, among those Flotilla serves, and its
// namespace and name.
func locate(id istio.ID) (kind istio.Kind, namespace, name string, err error) {
	ns, name, ok := strings.Cut(id.Name, "/")
	if !ok {
		return istio.Kind{}, "", "", fmt.Errorf("object name %q is not namespace/name", id.Name)
	}
	for _, k := range istio.Kinds() {
		if k.Kind == id.Kind {
			return k, ns, name, nil
		}
	}
	return istio.Kind{}, "", "", fmt.Errorf("unknown kind %q", id.Kind)
}
