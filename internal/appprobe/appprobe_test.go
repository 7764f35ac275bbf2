package appprobe

import (
	"encoding/json"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The copies must read and write what Kubernetes' own types do: Istio's
// injector writes ISTIO_KUBE_APP_PROBERS from those, and ours is read by
// Istio's agent (proxyv2).
func TestProbersHaveKubernetesJSON(t *testing.T) {
	svc := "grpc.health"
	kube := map[string]kubeProber{
		"/app-health/web/livez": {HTTPGet: &corev1.HTTPGetAction{
			Path: "/healthz", Port: intstr.FromInt32(8080), Host: "10.0.0.1", Scheme: corev1.URISchemeHTTPS,
			HTTPHeaders: []corev1.HTTPHeader{{Name: "Host", Value: "app.local"}, {Name: "X-Empty", Value: ""}},
		}, TimeoutSeconds: 3},
		"/app-health/web/readyz":   {HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("http")}},
		"/app-health/db/livez":     {TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("5432")}},
		"/app-health/grpc/livez":   {GRPC: &corev1.GRPCAction{Port: 9000, Service: &svc}},
		"/app-health/grpc/readyz":  {GRPC: &corev1.GRPCAction{Port: 9000}},
		"/app-health/empty/livez":  {},
		"/app-health/zero/startup": {TCPSocket: &corev1.TCPSocketAction{}},
	}
	kubeJSON, err := json.Marshal(kube)
	if err != nil {
		t.Fatal(err)
	}
	var ours map[string]Prober
	if err := json.Unmarshal(kubeJSON, &ours); err != nil {
		t.Fatal(err)
	}
	oursJSON, err := json.Marshal(ours)
	if err != nil {
		t.Fatal(err)
	}
	if string(oursJSON) != string(kubeJSON) {
		t.Errorf("written back differently:\n ours %s\n kube %s", oursJSON, kubeJSON)
	}
	var back map[string]kubeProber
	if err := json.Unmarshal(oursJSON, &back); err != nil || !reflect.DeepEqual(back, kube) {
		t.Errorf("Kubernetes reads ours as %+v (%v)", back, err)
	}
	for path, want := range map[string]int{"/app-health/web/livez": 8080, "/app-health/db/livez": 5432} {
		p := ours[path]
		got := 0
		if p.HTTPGet != nil {
			got = p.HTTPGet.Port.Number()
		} else if p.TCPSocket != nil {
			got = p.TCPSocket.Port.Number()
		}
		if got != want || got != kube[path].port() {
			t.Errorf("%s: port %d, want %d as IntOrString.IntValue", path, got, want)
		}
	}
	if n := ours["/app-health/web/readyz"].HTTPGet.Port.Number(); n != 0 {
		t.Errorf("a named port's number: %d, want 0", n)
	}
}

// kubeProber is Prober over Kubernetes' own types.
type kubeProber struct {
	HTTPGet        *corev1.HTTPGetAction   `json:"httpGet,omitempty"`
	TCPSocket      *corev1.TCPSocketAction `json:"tcpSocket,omitempty"`
	GRPC           *corev1.GRPCAction      `json:"grpc,omitempty"`
	TimeoutSeconds int32                   `json:"timeoutSeconds,omitempty"`
}

func (p kubeProber) port() int {
	if p.HTTPGet != nil {
		return p.HTTPGet.Port.IntValue()
	}
	return p.TCPSocket.Port.IntValue()
}

func TestPortRefusesWhatIsNeitherANumberNorAName(t *testing.T) {
	for _, in := range []string{`{"port": true}`, `{"port": [80]}`, `{"port": 1.5}`, `{"port": 99999999999}`, `{"port": "unterminated}`} {
		var a TCPSocketAction
		if err := json.Unmarshal([]byte(in), &a); err == nil {
			t.Errorf("%s: accepted as %+v", in, a)
		}
	}
}
