package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/platform/admission"
	"github.com/flotilla-mesh/flotilla/internal/platform/telemetry"
	"github.com/flotilla-mesh/flotilla/internal/testsupport/kubeenv"
)

func enabledNamespace(context.Context, string) (map[string]string, error) {
	return map[string]string{inject.NamespaceLabel: "enabled"}, nil
}

// serveHTTPS serves the webhook over TLS on loopback, as the apiserver
// reaches it, and returns a client trusting it and the webhook's URL.
func serveHTTPS(tb testing.TB) (*http.Client, string) {
	tb.Helper()
	h, err := Handler(options(enabledNamespace))
	if err != nil {
		tb.Fatal(err)
	}
	cc := kubeenv.ServeWebhook(tb, h, Path)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(cc.CABundle)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots},
		MaxIdleConnsPerHost: 64,
	}}
	tb.Cleanup(client.CloseIdleConnections)
	return client, *cc.URL
}

func reviewOf(tb testing.TB, pod *corev1.Pod) []byte {
	tb.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		tb.Fatal(err)
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "u-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create,
			Namespace: pod.Namespace, Object: runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

func send(tb testing.TB, client *http.Client, url string, body []byte) (int, []byte) {
	tb.Helper()
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, out
}

func appPod(containers int) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "shop"}}
	for i := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprint("c", i), Image: "app:1"})
	}
	return p
}

// TestHostileRequestsOverHTTPS: what reaches the webhook's TLS port that
// is not a well-formed review gets HTTP 400 with the reason; hostile pods
// inside a good review are injected safely or denied with the reason; the
// webhook keeps serving throughout.
func TestHostileRequestsOverHTTPS(t *testing.T) {
	client, url := serveHTTPS(t)
	for name, tc := range map[string]struct {
		body []byte
		want string
	}{
		"oversized":     {bytes.Repeat([]byte(" "), admission.MaxBodyBytes+1), "larger than"},
		"invalid JSON":  {[]byte(`{"apiVersion":`), "malformed AdmissionReview"},
		"wrong version": {[]byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`), "want an admission.k8s.io/v1 AdmissionReview"},
		"no request":    {[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), "has no request"},
	} {
		code, body := send(t, client, url, tc.body)
		if code != http.StatusBadRequest || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: HTTP %d %q, want 400 saying %q", name, code, body, tc.want)
		}
	}

	answer := func(pod *corev1.Pod) *admissionv1.AdmissionResponse {
		t.Helper()
		code, body := send(t, client, url, reviewOf(t, pod))
		var rev admissionv1.AdmissionReview
		if code != http.StatusOK || json.Unmarshal(body, &rev) != nil || rev.Response == nil || rev.Response.UID != "u-1" {
			t.Fatalf("HTTP %d %s", code, body)
		}
		return rev.Response
	}

	// A thousand containers: injected once, and the patch applies.
	big := appPod(1000)
	resp := answer(big)
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("1000 containers: %+v", resp.Result)
	}
	raw, _ := json.Marshal(big)
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatal(err)
	}
	var out corev1.Pod
	if err := json.Unmarshal(patched, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Spec.Containers) != 1001 || out.Spec.Containers[1000].Name != inject.ProxyContainer {
		t.Fatalf("%d containers after the patch", len(out.Spec.Containers))
	}

	// Annotations that try to inject YAML or template text: denied with
	// the reason, or taken as plain data.
	for key, value := range map[string]string{
		inject.AnnotationIncludeOutbound: "10.0.0.0/8\n  securityContext: {privileged: true}",
		inject.AnnotationExcludeInbound:  "{{ .Values.ProxyImage }}",
		inject.AnnotationLogLevel:        "debug\"]\n  privileged: true",
	} {
		p := appPod(1)
		p.Annotations = map[string]string{key: value}
		if resp := answer(p); resp.Allowed || resp.Result == nil || !strings.Contains(resp.Result.Message, "sidecar injection failed") {
			t.Errorf("%s=%q: %+v", key, value, resp)
		}
	}
	p := appPod(1)
	p.Annotations = map[string]string{inject.AnnotationProxyImage: "x\n  securityContext: {privileged: true}"}
	resp = answer(p)
	if !resp.Allowed || !bytes.Contains(resp.Patch, []byte(`"image":"x\n  securityContext: {privileged: true}"`)) ||
		bytes.Contains(resp.Patch, []byte(`"privileged"`)) {
		t.Fatalf("an image annotation with YAML in it: %s", resp.Patch)
	}

	// Still serving.
	if resp := answer(appPod(1)); !resp.Allowed || resp.Patch == nil {
		t.Fatalf("after the hostile requests: %+v", resp)
	}
}

// FuzzInjectReview: any body is answered 200 (a decision) or 400 (not a
// review), never a crash; a patch, when there is one, applies to the pod.
func FuzzInjectReview(f *testing.F) {
	f.Add(reviewOf(f, appPod(1)))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":{"metadata":{"annotations":{"sidecar.istio.io/proxyCPU":"1\n"}},"spec":{"containers":[{"name":"istio-proxy"}]}}}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":[]}}`))
	f.Add([]byte(`{}`))
	h, err := Handler(options(enabledNamespace))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := http.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		rec := &recorder{header: http.Header{}}
		h.ServeHTTP(rec, req)
		if rec.code != http.StatusOK && rec.code != http.StatusBadRequest {
			t.Fatalf("HTTP %d", rec.code)
		}
		if rec.code != http.StatusOK {
			return
		}
		var in, out admissionv1.AdmissionReview
		if json.Unmarshal(rec.body.Bytes(), &out) != nil || out.Response == nil {
			t.Fatalf("200 without a response: %s", rec.body.Bytes())
		}
		if out.Response.Patch == nil {
			return
		}
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatal(err)
		}
		patch, err := jsonpatch.DecodePatch(out.Response.Patch)
		if err != nil {
			t.Fatalf("patch does not decode: %v", err)
		}
		if _, err := patch.Apply(in.Request.Object.Raw); err != nil {
			t.Fatalf("patch does not apply: %v", err)
		}
	})
}

// recorder is a minimal http.ResponseWriter (httptest's is fine too, but
// this keeps the fuzz loop lean).
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(p []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(p)
}
func (r *recorder) WriteHeader(code int) { r.code = code }

// BenchmarkInjectOverHTTPS: one injection per iteration over HTTPS on
// loopback (kept-alive connections, as the apiserver uses); allocations
// are the whole round trip's, client included.
func BenchmarkInjectOverHTTPS(b *testing.B) {
	client, url := serveHTTPS(b)
	body := reviewOf(b, appPod(2))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if code, _ := send(b, client, url, body); code != http.StatusOK {
			b.Fatalf("HTTP %d", code)
		}
	}
}

// BenchmarkInjectHandler: the webhook's own cost per injection (decode,
// decide, render, patch, encode), without TLS and the network.
func BenchmarkInjectHandler(b *testing.B) {
	h, err := Handler(options(enabledNamespace))
	if err != nil {
		b.Fatal(err)
	}
	body := reviewOf(b, appPod(2))
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := &recorder{header: http.Header{}}
		h.ServeHTTP(rec, req)
		if rec.code != http.StatusOK {
			b.Fatalf("HTTP %d", rec.code)
		}
	}
}

// BenchmarkInjectAt500PerSecond sends b.N injections at a steady 500 per
// second over HTTPS (each on its own schedule, so a slow answer does not
// slow the offered rate) and reports the latency percentiles; run with
// -benchtime=5000x for 10 s.
func BenchmarkInjectAt500PerSecond(b *testing.B) {
	const rate = 500
	client, url := serveHTTPS(b)
	body := reviewOf(b, appPod(2))
	// Warm the connection pool.
	for range 16 {
		send(b, client, url, body)
	}
	latencies := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	var failed sync.Map
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / rate)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			resp, err := client.Post(url, "application/json", bytes.NewReader(body))
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("HTTP %d", resp.StatusCode)
				}
			}
			latencies[i] = time.Since(t0)
			if err != nil {
				failed.Store(i, err)
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	failed.Range(func(k, v any) bool { b.Fatalf("request %v: %v", k, v); return false })
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	pct := func(p float64) float64 {
		return float64(latencies[int(p*float64(len(latencies)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(slices.Max(latencies).Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
}

// TestIstiosDashboardsReadTheInjectionsUnderIstiosNames sends, over
// HTTPS, a pod to inject, one whose label opts out, a pod that is
// not one, and a request that is no review, then reads /metrics as
// Prometheus scrapes it: sidecar_injection_* as Istio's injector counts
// them.
func TestIstiosDashboardsReadTheInjectionsUnderIstiosNames(t *testing.T) {
	tel, err := telemetry.New(context.Background(), telemetry.Options{ServiceName: "flotilla-injector"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	o := options(enabledNamespace)
	o.IstioMeter = tel.Istio.Meter("istio")
	h, err := Handler(o)
	if err != nil {
		t.Fatal(err)
	}
	cc := kubeenv.ServeWebhook(t, h, Path)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(cc.CABundle)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}}}
	t.Cleanup(client.CloseIdleConnections)
	url := *cc.URL

	optedOut := appPod(1)
	optedOut.Labels = map[string]string{inject.InjectLabel: "false"}
	for _, body := range [][]byte{reviewOf(t, appPod(1)), reviewOf(t, appPod(2)), reviewOf(t, optedOut)} {
		if code, out := send(t, client, url, body); code != http.StatusOK {
			t.Fatalf("HTTP %d: %s", code, out)
		}
	}
	notAPod := reviewOf(t, appPod(1))
	notAPod = bytes.Replace(notAPod, []byte(`"spec":{`), []byte(`"spec":7,"x":{`), 1)
	send(t, client, url, notAPod)
	send(t, client, url, []byte(`{"apiVersion":`))

	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/metrics", nil))
	got := rec.Body.String()
	for _, want := range []string{
		"sidecar_injection_requests_total 5",
		"sidecar_injection_success_total 2",
		"sidecar_injection_skip_total 1",
		"sidecar_injection_failure_total 2",
		"sidecar_injection_time_seconds_count 5",
		`sidecar_injection_time_seconds_bucket{le="0.1"}`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
