package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/platform/telemetry"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

func testHandler(tb testing.TB) http.Handler {
	tb.Helper()
	h, err := Handler(Options{Log: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider().Meter("t")})
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

func post(h http.Handler, contentType string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func review(kind metav1.GroupVersionKind, op admissionv1.Operation, object string) []byte {
	r := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "0001", Kind: kind, Namespace: "default", Name: "reviews", Operation: op,
			Object: runtime.RawExtension{Raw: []byte(object)},
		},
	}
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	return b
}

var vsKind = metav1.GroupVersionKind{Group: "networking.istio.io", Version: "v1", Kind: "VirtualService"}

func answer(t *testing.T, rec *httptest.ResponseRecorder) *admissionv1.AdmissionResponse {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("HTTP %d: %s", rec.Code, rec.Body.String())
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if out.Response == nil || out.Response.UID != "0001" || out.APIVersion != "admission.k8s.io/v1" {
		t.Fatalf("response %+v", out)
	}
	return out.Response
}

func TestAnInvalidObjectIsDeniedWithEveryErrorAndItsPath(t *testing.T) {
	obj := `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"reviews","namespace":"default"},
"spec":{"hosts":["reviews","reviews"],"http":[{"route":[{"destination":{"host":"reviews"},"weight":60},{"destination":{"host":"reviews"},"weight":60}]}]}}`
	resp := answer(t, post(testHandler(t), "application/json", review(vsKind, admissionv1.Create, obj)))
	want := `VirtualService default/reviews: spec.hosts[1]: host "reviews" is listed twice; spec.http[0].route: destination weights must add up to 100, not 120 (60+60)`
	if resp.Allowed || resp.Result.Message != want || resp.Result.Code != http.StatusUnprocessableEntity {
		t.Fatalf("allowed=%v result %+v\nwant message %q", resp.Allowed, resp.Result, want)
	}
}

func TestWarningsAreReturnedAsAdmissionWarnings(t *testing.T) {
	obj := `{"apiVersion":"networking.istio.io/v1","kind":"DestinationRule","metadata":{"name":"r"},
"spec":{"host":"reviews","trafficPolicy":{"outlierDetection":{"consecutiveErrors":5}}}}`
	kind := metav1.GroupVersionKind{Group: "networking.istio.io", Version: "v1beta1", Kind: "DestinationRule"}
	resp := answer(t, post(testHandler(t), "application/json; charset=utf-8", review(kind, admissionv1.Update, obj)))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.HasPrefix(resp.Warnings[0], "FLT0103 ") || !strings.Contains(resp.Warnings[0], "consecutiveErrors is deprecated") {
		t.Fatalf("allowed=%v warnings %v", resp.Allowed, resp.Warnings)
	}
}

func TestDeletesAndForeignKindsAreAllowed(t *testing.T) {
	h := testHandler(t)
	if resp := answer(t, post(h, "application/json", review(vsKind, admissionv1.Delete, `{}`))); !resp.Allowed {
		t.Fatal("delete denied")
	}
	foreign := metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
	if resp := answer(t, post(h, "application/json", review(foreign, admissionv1.Create, `{}`))); !resp.Allowed || len(resp.Warnings) != 1 {
		t.Fatalf("foreign kind: %+v", resp)
	}
}

func TestAnUndecodableObjectIsDeniedWithTheReason(t *testing.T) {
	obj := `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"reviews","namespace":"default"},"spec":{"hostz":[]}}`
	resp := answer(t, post(testHandler(t), "application/json", review(vsKind, admissionv1.Create, obj)))
	if resp.Allowed || resp.Result.Message != `VirtualService default/reviews: spec: unknown field "hostz"` {
		t.Fatalf("%+v", resp.Result)
	}
}

// TestMalformedOversizedAndHostileRequestsGet400 (415 for a body that is
// not JSON by its Content-Type, as Istio's webhooks answer).
func TestMalformedOversizedAndHostileRequestsGet400(t *testing.T) {
	h := testHandler(t)
	deep := strings.Repeat(`{"a":`, 100000) + "1" + strings.Repeat("}", 100000)
	noUID := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}`
	tests := map[string]struct {
		contentType string
		body        []byte
		want        string
	}{
		"not json":          {"application/json", []byte("<xml/>"), "malformed AdmissionReview"},
		"wrong type":        {"text/plain", []byte("{}"), "Content-Type must be application/json"},
		"empty":             {"application/json", nil, "malformed AdmissionReview"},
		"no request":        {"application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), "has no request"},
		"no uid":            {"application/json", []byte(noUID), "has no request"},
		"v1beta1 review":    {"application/json", []byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`), "want an admission.k8s.io/v1 AdmissionReview"},
		"oversized":         {"application/json", bytes.Repeat([]byte(" "), MaxBodyBytes+1), "larger than"},
		"deeply nested":     {"application/json", []byte(deep), "malformed AdmissionReview"},
		"request not a map": {"application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":[1]}`), "malformed AdmissionReview"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := post(h, tc.contentType, tc.body)
			code := http.StatusBadRequest
			if tc.contentType != "application/json" {
				code = http.StatusUnsupportedMediaType
			}
			if rec.Code != code || !strings.Contains(rec.Body.String(), tc.want) {
				t.Fatalf("HTTP %d %q, want %d with %q", rec.Code, rec.Body.String(), code, tc.want)
			}
		})
	}
	req := httptest.NewRequest(http.MethodGet, Path, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d", rec.Code)
	}
}

func TestHostileObjectsInsideAValidReviewAreDenied(t *testing.T) {
	h := testHandler(t)
	for name, obj := range map[string]string{
		"not an object": `"just a string"`,
		"a list":        `[{"apiVersion":"networking.istio.io/v1"},{"kind":"VirtualService"}]`,
		"huge regex":    `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"r"},"spec":{"hosts":["r"],"http":[{"match":[{"uri":{"regex":"` + strings.Repeat("(a|b)*", 500) + `"}}],"route":[{"destination":{"host":"r"}}]}]}}`,
		"wrong kind":    `{"apiVersion":"networking.istio.io/v1","kind":"Gateway","metadata":{"name":"r"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			resp := answer(t, post(h, "application/json", review(vsKind, admissionv1.Create, obj)))
			if resp.Allowed {
				t.Fatalf("allowed: %+v", resp)
			}
		})
	}
}

func FuzzReview(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","operation":"CREATE","kind":{"group":"networking.istio.io","version":"v1","kind":"VirtualService"},"object":{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"a"},"spec":{"hosts":["a"]}}}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"request":null}`))
	h := testHandler(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := post(h, "application/json", body)
		if rec.Code != http.StatusOK && rec.Code != http.StatusBadRequest {
			t.Fatalf("HTTP %d", rec.Code)
		}
	})
}

func TestSubsetWarningsUseTheServedDestinationRules(t *testing.T) {
	drs := istio.Decode("dr.yaml", []byte(`apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec: {host: reviews, subsets: [{name: v1, labels: {version: v1}}]}
`), "default")
	h, err := Handler(Options{
		Log: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider().Meter("t"),
		Context: func() validation.Context {
			return validation.NewSubsetIndex([]*istio.Object{drs[0].Object}, "cluster.local")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	obj := `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"reviews","namespace":"default"},
"spec":{"hosts":["reviews"],"http":[{"route":[{"destination":{"host":"reviews","subset":"v2"}}]}]}}`
	resp := answer(t, post(h, "application/json", review(vsKind, admissionv1.Create, obj)))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], `subset "v2" is not defined by the DestinationRule for host "reviews" (it defines [v1])`) {
		t.Fatalf("allowed=%v warnings %v", resp.Allowed, resp.Warnings)
	}
}

// TestHeavyObjectsCostThemselvesAndSmallReviewsAreStillAnswered: four
// parallel reviews of a 3 MiB VirtualService with 2,800 regexes of 1,000
// characters are denied for their regex budget, and a small review sent
// meanwhile is answered. (Before the budget, the four got no answer in
// 15 s and the small one waited 390 ms.)
func TestHeavyObjectsCostThemselvesAndSmallReviewsAreStillAnswered(t *testing.T) {
	h := testHandler(t)
	var b strings.Builder
	b.WriteString(`{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"reviews","namespace":"default"},"spec":{"hosts":["reviews"],"http":[`)
	re := strings.Repeat("(a|b)", 200)
	for i := range 2800 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"name":"r%d","match":[{"uri":{"regex":%q}}],"route":[{"destination":{"host":"reviews"}}]}`, i, re)
	}
	b.WriteString(`]}}`)
	heavy := review(vsKind, admissionv1.Create, b.String())
	small := review(vsKind, admissionv1.Create, `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"reviews","namespace":"default"},"spec":{"hosts":["reviews"],"http":[{"route":[{"destination":{"host":"reviews"}}]}]}}`)
	results := make(chan *httptest.ResponseRecorder, 4)
	for range 4 {
		go func() { results <- post(h, "application/json", heavy) }()
	}
	if resp := answer(t, post(h, "application/json", small)); !resp.Allowed {
		t.Fatalf("the small review during the heavy ones: %+v", resp.Result)
	}
	for range 4 {
		resp := answer(t, <-results)
		if resp.Allowed || !strings.Contains(resp.Result.Message, "in all") {
			t.Fatalf("a heavy review: allowed %v, %v; want denied for the regex budget", resp.Allowed, resp.Result)
		}
	}
}

// TestIstiosDashboardsReadTheValidationsUnderIstiosNames posts a valid,
// an invalid and an undecodable VirtualService, a kind galley does not
// validate, and requests refused at the edge, then reads /metrics as
// Prometheus scrapes it: galley_validation_* as Istio's webhook counts
// them. A review claiming a resource of its own invention is counted
// under its kind's resource, so no caller grows the series.
func TestIstiosDashboardsReadTheValidationsUnderIstiosNames(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Options{ServiceName: "flotilla-galley"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	h, err := Handler(Options{Log: slog.New(slog.DiscardHandler), Meter: noop.NewMeterProvider().Meter("t"), IstioMeter: tel.Istio.Meter("istio")})
	if err != nil {
		t.Fatal(err)
	}
	valid := `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"reviews"},"spec":{"hosts":["reviews"],"http":[{"route":[{"destination":{"host":"reviews"}}]}]}}`
	invalid := `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"reviews"},"spec":{"hosts":["reviews","reviews"],"http":[{"route":[{"destination":{"host":"reviews"}}]}]}}`
	answer(t, post(h, "application/json", review(vsKind, admissionv1.Create, valid)))
	answer(t, post(h, "application/json", review(vsKind, admissionv1.Update, valid)))
	answer(t, post(h, "application/json", review(vsKind, admissionv1.Create, invalid)))
	answer(t, post(h, "application/json", review(vsKind, admissionv1.Create, `{"apiVersion":"networking.istio.io/v1","kind":"VirtualService","metadata":{"name":"r"},"spec":{"hosts":"not-a-list"}}`)))
	answer(t, post(h, "application/json", review(metav1.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}, admissionv1.Create, `{}`)))
	var hostile admissionv1.AdmissionReview
	if err := json.Unmarshal(review(vsKind, admissionv1.Create, valid), &hostile); err != nil {
		t.Fatal(err)
	}
	hostile.Request.Resource = metav1.GroupVersionResource{Group: "evil", Version: "v666", Resource: strings.Repeat("x", 1000)}
	body, err := json.Marshal(hostile)
	if err != nil {
		t.Fatal(err)
	}
	answer(t, post(h, "application/json", body))
	post(h, "text/plain", []byte("{}"))
	post(h, "application/json", []byte("<xml/>"))

	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil))
	got := rec.Body.String()
	for _, want := range []string{
		`galley_validation_passed{group="networking.istio.io",resource="virtualservices",version="v1"} 3`,
		`galley_validation_failed{group="networking.istio.io",reason="invalid_resource",resource="virtualservices",version="v1"} 1`,
		`galley_validation_failed{group="networking.istio.io",reason="yaml_decode_error",resource="virtualservices",version="v1"} 1`,
		`galley_validation_http_error{status="400"} 1`,
		`galley_validation_http_error{status="415"} 1`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, unwanted := range []string{"evil", "example.com", "Widget"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("/metrics has %q", unwanted)
		}
	}
}
