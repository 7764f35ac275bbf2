package webhook

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/inject"
)

func options(labels func(context.Context, string) (map[string]string, error)) Options {
	def := inject.DefaultConfig(controlplane.DefaultRevision)
	return Options{
		Log: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider().Meter("t"),
		Config: func() inject.Config { return def }, NamespaceLabels: labels,
	}
}

func podRequest(raw string) *admissionv1.AdmissionRequest {
	return &admissionv1.AdmissionRequest{
		UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create,
		Namespace: "shop", Object: runtime.RawExtension{Raw: []byte(raw)},
	}
}

func TestRequestsTheWebhookCannotDecideOnAreDeniedWithTheReason(t *testing.T) {
	enabled := func(context.Context, string) (map[string]string, error) {
		return map[string]string{inject.NamespaceLabel: "enabled"}, nil
	}
	broken := func(context.Context, string) (map[string]string, error) { return nil, errors.New("galley is away") }
	tests := map[string]struct {
		o    Options
		req  *admissionv1.AdmissionRequest
		says string
	}{
		"not a pod":            {options(enabled), podRequest(`{"spec": {"containers": "nope"}}`), "not a Pod"},
		"garbage":              {options(enabled), podRequest(`{{{`), "not a Pod"},
		"no namespace labels":  {options(broken), podRequest(`{"metadata": {}, "spec": {"containers": [{"name": "a"}]}}`), "galley is away"},
		"no metadata":          {options(enabled), podRequest(`{"spec": {"containers": [{"name": "a"}]}}`), "it has no metadata"},
		"metadata not a map":   {options(enabled), podRequest(`{"metadata": null, "spec": {"containers": [{"name": "a"}]}}`), "it has no metadata"},
		"keys in another case": {options(enabled), podRequest(`{"Metadata": {}, "Spec": {"containers": [{"name": "a"}]}}`), "it has no metadata"},
		"a bad annotation":     {options(enabled), podRequest(`{"metadata": {"annotations": {"sidecar.istio.io/proxyCPU": "lots"}}, "spec": {"containers": [{"name": "a"}]}}`), "injection failed"},
		"no spec":              {options(enabled), podRequest(`{"metadata": {}}`), "it has no spec"},
	}
	for name, tt := range tests {
		resp := review(context.Background(), tt.o, tt.req)
		if resp.Allowed || !strings.Contains(resp.Result.Message, tt.says) {
			t.Errorf("%s: allowed %v, %+v; want denied saying %q", name, resp.Allowed, resp.Result, tt.says)
		}
	}
	// Other kinds, operations and subresources pass untouched.
	for _, req := range []*admissionv1.AdmissionRequest{
		{UID: "2", Kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, Operation: admissionv1.Create},
		{UID: "3", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Update},
		{UID: "4", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create, SubResource: "binding"},
	} {
		if resp := review(context.Background(), options(broken), req); !resp.Allowed || resp.Patch != nil {
			t.Errorf("%s %s: %+v", req.Kind.Kind, req.Operation, resp)
		}
	}
}

func TestAnInjectedPodIsWarnedOfTheIstioAnnotationsFlotillaDoesNotHonour(t *testing.T) {
	enabled := func(context.Context, string) (map[string]string, error) {
		return map[string]string{inject.NamespaceLabel: "enabled"}, nil
	}
	resp := review(context.Background(), options(enabled), podRequest(`{"metadata": {"annotations": {
		"sidecar.istio.io/bootstrapOverride": "mine", "sidecar.istio.io/proxyCPU": "100m", "example.com/x": "y"}},
		"spec": {"containers": [{"name": "a"}]}}`))
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("not injected: %+v", resp)
	}
	if len(resp.Warnings) != 1 || !strings.HasPrefix(resp.Warnings[0], "sidecar.istio.io/bootstrapOverride is not honoured by Flotilla") {
		t.Fatalf("warnings %q, want one for bootstrapOverride", resp.Warnings)
	}
}
