package kubeenv

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestHostsFileNamesEveryServiceWithAClusterIP(t *testing.T) {
	svc := func(ns, name, ip string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: ip}}
	}
	got := hostsFile([]*corev1.Service{
		svc("istio-system", "flotilla-galley", "10.96.0.20"),
		svc("bookinfo", "reviews", "10.96.0.30"),
		svc("bookinfo", "headless", corev1.ClusterIPNone),
		svc("bookinfo", "pending", ""),
	})
	want := baseHosts +
		"10.96.0.20 flotilla-galley.istio-system.svc.cluster.local flotilla-galley.istio-system.svc flotilla-galley.istio-system\n" +
		"10.96.0.30 reviews.bookinfo.svc.cluster.local reviews.bookinfo.svc reviews.bookinfo\n"
	if got != want {
		t.Errorf("hosts file:\n%s\nwant:\n%s", got, want)
	}
	if got := hostsFile(nil); got != baseHosts {
		t.Errorf("no Services: %q", got)
	}
}
