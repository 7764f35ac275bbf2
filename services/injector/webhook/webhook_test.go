package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
		resp := review(context.Background(), tt.o, tt.req, "")
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
		if resp := review(context.Background(), options(broken), req, ""); !resp.Allowed || resp.Patch != nil {
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
		"spec": {"containers": [{"name": "a"}]}}`), "")
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("not injected: %+v", resp)
	}
	if len(resp.Warnings) != 1 || !strings.HasPrefix(resp.Warnings[0], "sidecar.istio.io/bootstrapOverride is not honoured by Flotilla") {
		t.Fatalf("warnings %q, want one for bootstrapOverride", resp.Warnings)
	}
}

func TestATagsWebhookInjectsWhatSelectsTheRevisionByTheTagsName(t *testing.T) {
	labelled := func(ls map[string]string) func(context.Context, string) (map[string]string, error) {
		return func(context.Context, string) (map[string]string, error) { return ls, nil }
	}
	canary := func(ls map[string]string) Options {
		o := options(labelled(ls))
		o.Policy.Revision = "canary"
		return o
	}
	pod := podRequest(`{"metadata": {}, "spec": {"containers": [{"name": "a"}]}}`)
	h, err := Handler(canary(map[string]string{controlplane.RevisionLabel: "prod"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		ns       map[string]string
		tag      string
		injected bool
	}{
		{"a namespace of tag prod, through prod's webhook", map[string]string{controlplane.RevisionLabel: "prod"}, "prod", true},
		{"a namespace of tag prod, through the revision's own", map[string]string{controlplane.RevisionLabel: "prod"}, "", false},
		{"a namespace of the revision, through prod's", map[string]string{controlplane.RevisionLabel: "canary"}, "prod", false},
		{"istio-injection=enabled through the default tag's", map[string]string{inject.NamespaceLabel: "enabled"}, controlplane.DefaultRevision, true},
		{"istio-injection=enabled through prod's", map[string]string{inject.NamespaceLabel: "enabled"}, "prod", false},
	} {
		resp := review(context.Background(), canary(tc.ns), pod, tc.tag)
		if !resp.Allowed || (resp.Patch != nil) != tc.injected {
			t.Errorf("%s: allowed %v, injected %v; want injected %v", tc.name, resp.Allowed, resp.Patch != nil, tc.injected)
		}
	}
	if resp := review(context.Background(), canary(nil), pod, "Not_A_Tag"); resp.Allowed || !strings.Contains(resp.Result.Message, "names no revision tag") {
		t.Errorf("a malformed tag in the path: %+v", resp)
	}
	// Over HTTP: the tag comes from the path the tag's webhook calls.
	for path, injected := range map[string]bool{TagPath + "prod": true, Path: false, TagPath + "prod/more": false} {
		rec := httptest.NewRecorder()
		body, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: pod})
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		var out admissionv1.AdmissionReview
		_ = json.Unmarshal(rec.Body.Bytes(), &out)
		got := rec.Code == http.StatusOK && out.Response != nil && out.Response.Patch != nil
		if got != injected {
			t.Errorf("%s: %d, injected %v, want %v: %s", path, rec.Code, got, injected, rec.Body)
		}
	}
}
