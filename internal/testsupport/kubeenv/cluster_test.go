package kubeenv

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// TestAClusterRunsADeploymentOnKwokNodesAndServesItsWebhookAtThePodsIPs
// runs the whole cluster: the controller manager, the scheduler and three
// kwok nodes. A Deployment becomes Ready pods with IPs of their nodes' pod
// ranges, spread over the nodes; the EndpointSlice controller publishes
// them; the apiserver calls a webhook through its Service at those IPs
// (local in the tests' network namespace), and a client by its name and
// port through kube-proxy; a scale-down and the namespace's deletion are
// carried out by the controllers and kwok.
func TestAClusterRunsADeploymentOnKwokNodesAndServesItsWebhookAtThePodsIPs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	cl, err := Start(ctx, Options{Cluster: &ClusterOptions{Nodes: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cl.Stop(); err != nil {
			t.Error(err)
		}
	}()
	c := cl.Client
	var lastErr error
	t.Logf("the cluster started in %s", time.Since(start).Round(time.Millisecond))
	poll := func(what string, cond func(context.Context) (bool, error)) {
		t.Helper()
		start := time.Now()
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, cond); err != nil {
			t.Fatalf("%s: %v (last error: %v)", what, err, lastErr)
		}
		t.Logf("%s: %s", what, time.Since(start).Round(time.Millisecond))
	}

	// The namespace's default ServiceAccount and the apiserver's CA come
	// from the controllers, not from the test.
	ns, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cluster-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll("the default ServiceAccount and kube-root-ca.crt", func(ctx context.Context) (bool, error) {
		_, saErr := c.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		cm, cmErr := c.CoreV1().ConfigMaps(ns.Name).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return saErr == nil && cmErr == nil && cm.Data["ca.crt"] == string(cl.CA.CertPEM), nil
	})

	const replicas = 6
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "web", Image: "web:1", Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 8443}},
				}}},
			},
		},
	}
	if _, err := c.AppsV1().Deployments(ns.Name).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{
			Name: "https", Port: 443, TargetPort: intstr.FromString("https"),
		}}},
	}
	if _, err := c.CoreV1().Services(ns.Name).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var pods []corev1.Pod
	poll("the Deployment's pods Running and Ready", func(ctx context.Context) (bool, error) {
		pods = readyPods(ctx, t, c, ns.Name, "app=web")
		return len(pods) == replicas, nil
	})
	nodes := map[string]bool{}
	var ips []string
	for _, p := range pods {
		node, err := c.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, podCIDR, err := net.ParseCIDR(node.Spec.PodCIDR)
		if err != nil || !podCIDR.Contains(net.ParseIP(p.Status.PodIP)) {
			t.Errorf("pod %s on %s has IP %q, outside the node's pod range %s", p.Name, node.Name, p.Status.PodIP, node.Spec.PodCIDR)
		}
		if !strings.HasPrefix(p.OwnerReferences[0].Name, "web-") || p.OwnerReferences[0].Kind != "ReplicaSet" {
			t.Errorf("pod %s is owned by %v, want the Deployment's ReplicaSet", p.Name, p.OwnerReferences)
		}
		nodes[p.Spec.NodeName] = true
		ips = append(ips, p.Status.PodIP)
	}
	if len(nodes) < 2 {
		t.Errorf("the scheduler put all %d pods on %v, want them spread over the nodes", replicas, nodes)
	}
	slices.Sort(ips)

	// The EndpointSlice controller publishes the pods' IPs and port.
	sliceIPs := func(ctx context.Context) []string {
		list, err := c.DiscoveryV1().EndpointSlices(ns.Name).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=web," + discoveryv1.LabelManagedBy + "=endpointslice-controller.k8s.io",
		})
		if err != nil {
			return nil
		}
		var got []string
		for _, s := range list.Items {
			if len(s.Ports) != 1 || s.Ports[0].Port == nil || *s.Ports[0].Port != 8443 {
				continue
			}
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					got = append(got, ep.Addresses...)
				}
			}
		}
		slices.Sort(got)
		return got
	}
	poll("the pods' IPs in the Service's EndpointSlices", func(ctx context.Context) (bool, error) {
		return slices.Equal(sliceIPs(ctx), ips), nil
	})

	// The apiserver reaches a webhook through its Service at a pod's IP,
	// as in a cluster: every pod's address answers (the apiserver picks
	// one), with a certificate for web.<ns>.svc.
	var addrs []string
	for _, ip := range ips {
		addrs = append(addrs, net.JoinHostPort(ip, "8443"))
	}
	caBundle := ServeServiceWebhook(t, denyConfigMapsNamedDenied(), ns.Name, "web", addrs...)
	fail, none := admregv1.Fail, admregv1.SideEffectClassNone
	_, err = c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-" + ns.Name},
		Webhooks: []admregv1.ValidatingWebhook{{
			Name: "deny.flotilla.test",
			ClientConfig: admregv1.WebhookClientConfig{
				Service:  &admregv1.ServiceReference{Namespace: ns.Name, Name: "web", Path: ptr("/validate"), Port: ptr(int32(443))},
				CABundle: caBundle,
			},
			Rules: []admregv1.RuleWithOperations{{
				Operations: []admregv1.OperationType{admregv1.Create},
				Rule:       admregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns.Name}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(context.Background(), "deny-"+ns.Name, metav1.DeleteOptions{})
	}()
	denied := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "denied"}}
	poll("the webhook behind the Service", func(ctx context.Context) (bool, error) {
		_, lastErr = c.CoreV1().ConfigMaps(ns.Name).Create(ctx, denied, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return lastErr != nil && strings.Contains(lastErr.Error(), "configmaps named denied are denied here"), nil
	})
	if _, err := c.CoreV1().ConfigMaps(ns.Name).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "allowed"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a ConfigMap the webhook allows: %v", err)
	}

	// A client in the cluster reaches the Service by its name and port:
	// the name from the cluster's DNS, the cluster IP translated to a
	// pod's IP and the target port by kube-proxy.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caBundle)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	host := "web." + ns.Name + ".svc"
	review, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  &admissionv1.AdmissionRequest{UID: "1", Name: "denied"},
	})
	poll("a call to https://"+host+" (port 443) answered by a pod", func(ctx context.Context) (bool, error) {
		resp, err := hc.Post("https://"+host+"/validate", "application/json", bytes.NewReader(review))
		if err != nil {
			lastErr = err
			return false, nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), "configmaps named denied are denied here (served at \\\"10.244."), nil
	})

	// Scaled down: the ReplicaSet deletes pods, kwok finishes deleting
	// them, and the EndpointSlice follows.
	if _, err := c.AppsV1().Deployments(ns.Name).Patch(ctx, "web", types.MergePatchType, []byte(`{"spec":{"replicas":2}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("two pods left, and two endpoints", func(ctx context.Context) (bool, error) {
		all, err := c.CoreV1().Pods(ns.Name).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		return err == nil && len(all.Items) == 2 && len(sliceIPs(ctx)) == 2, nil
	})

	// The namespace controller empties a deleted namespace and removes it.
	if err := c.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the namespace gone", func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// readyPods lists the pods matching selector that are Running and Ready
// with an IP.
func readyPods(ctx context.Context, t *testing.T, c kubernetes.Interface, ns, selector string) []corev1.Pod {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil
	}
	var ready []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				ready = append(ready, p)
			}
		}
	}
	return ready
}

// denyConfigMapsNamedDenied is a validating webhook that denies
// ConfigMaps named "denied".
func denyConfigMapsNamedDenied() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: review.Request.Name != "denied"}
		if !resp.Allowed {
			resp.Result = &metav1.Status{Message: "configmaps named denied are denied here (served at " + strconv.Quote(r.Context().Value(http.LocalAddrContextKey).(net.Addr).String()) + ")"}
		}
		review.Response, review.Request = resp, nil
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(review)
	})
}

func ptr[T any](v T) *T { return &v }
