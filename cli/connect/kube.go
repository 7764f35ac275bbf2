package connect

// This file is the way into a cluster (--kubeconfig, --context), as
// istioctl's: the replicas are the ready Pods behind the flotilla-discovery
// Services' EndpointSlices (of every revision), reached through the apiserver's port-forward on
// their mTLS xDS port; the CLI's certificate comes from ca (one of the
// flotilla-ca Service's Pods, port-forwarded too) for a token the
// apiserver issues to a service account of the control plane's namespace
// (--service-account), checked against the mesh's roots that ca publishes
// in every namespace (the istio-ca-root-cert ConfigMap).

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
)

// Ports the chart gives the control plane's containers.
const (
	secureXDSPort = 15012
	caPort        = 15013
	galleyMCPPort = 15019
)

// rootsConfigMap is where ca publishes the mesh's roots in every
// namespace (Istio's name), under rootsKey.
const (
	rootsConfigMap = "istio-ca-root-cert"
	rootsKey       = "root-cert.pem"
)

// KubeOptions are the flags of the way into a cluster.
type KubeOptions struct {
	Kubeconfig, Context string
	// ServiceAccount, of the control plane's namespace, is whose token
	// the CLI shows ca.
	ServiceAccount string
	// Galley reaches a galley pod's MCP port instead of the discovery
	// replicas (set by the commands that read galley).
	Galley bool
}

// Enabled reports whether the cluster is the way in.
func (k KubeOptions) Enabled() bool { return k.Kubeconfig != "" || k.Context != "" }

// Pods are the ready Pods behind the Services of a control-plane service,
// from their EndpointSlices, by name (an endpoint without a Pod behind it
// is left out: nothing to port-forward to): for discovery, the Services
// of every revision (flotilla-discovery, flotilla-discovery-canary).
func Pods(ctx context.Context, client kubernetes.Interface, namespace, service string) ([]string, error) {
	selector := discoveryv1.LabelServiceName + "=" + service
	if controlplane.Revisioned(service) {
		selector = discoveryv1.LabelServiceName // every Service's; filtered below
	}
	list, err := client.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("EndpointSlices of %s/%s: %w", namespace, service, err)
	}
	var pods []string
	for _, s := range list.Items {
		if of, _, ok := controlplane.Parse(s.Labels[discoveryv1.LabelServiceName]); !ok || of != service {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" && !slices.Contains(pods, e.TargetRef.Name) {
				pods = append(pods, e.TargetRef.Name)
			}
		}
	}
	slices.Sort(pods)
	if len(pods) == 0 {
		return nil, fmt.Errorf("no ready pod behind Service %s/%s (is Flotilla installed there? --istio-namespace names another namespace)", namespace, service)
	}
	return pods, nil
}

// kubeContext finds the replicas and ca in the cluster, forwards a local
// port to each, and returns the context that reaches them with a token
// for the service account; stop ends the forwards.
func (k KubeOptions) kubeContext(ctx context.Context, namespace string) (c Context, rootsPEM []byte, token func() (string, error), stop func(), err error) {
	cfg, err := k.restConfig()
	if err != nil {
		return c, nil, nil, nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return c, nil, nil, nil, fmt.Errorf("kubeconfig: %w", err)
	}
	target := controlplane.Discovery
	if k.Galley {
		target = controlplane.Galley
	}
	pods, err := Pods(ctx, client, namespace, target)
	if err != nil {
		return c, nil, nil, nil, err
	}
	cas, err := Pods(ctx, client, namespace, controlplane.CA)
	if err != nil {
		return c, nil, nil, nil, err
	}
	roots, err := readRoots(ctx, client, namespace)
	if err != nil {
		return c, nil, nil, nil, err
	}
	tok, err := client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, k.ServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"istio-ca"}, ExpirationSeconds: ptr(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		return c, nil, nil, nil, fmt.Errorf("a token for %s/%s (the CLI shows it ca; your kubeconfig needs create on serviceaccounts/token there): %w", namespace, k.ServiceAccount, err)
	}
	var forwards []*portforward.PortForwarder
	stop = func() {
		for _, f := range forwards {
			f.Close()
		}
	}
	forward := func(pod string, port int) (string, error) {
		f, err := portForward(ctx, cfg, namespace, pod, port)
		if err != nil {
			return "", err
		}
		forwards = append(forwards, f)
		ports, err := f.GetPorts()
		switch {
		case err != nil:
			return "", fmt.Errorf("port-forward to %s/%s: %w", namespace, pod, err)
		case len(ports) != 1:
			return "", fmt.Errorf("port-forward to %s/%s: %d local ports, want one", namespace, pod, len(ports))
		}
		return "127.0.0.1:" + strconv.Itoa(int(ports[0].Local)), nil
	}
	if k.Galley {
		if c.GalleyAddress, err = forward(pods[0], galleyMCPPort); err != nil {
			stop()
			return c, nil, nil, nil, err
		}
	} else {
		for _, pod := range pods {
			a, err := forward(pod, secureXDSPort)
			if err != nil {
				stop()
				return c, nil, nil, nil, err
			}
			c.DiscoveryAddresses = append(c.DiscoveryAddresses, a)
		}
	}
	if c.CAAddress, err = forward(cas[0], caPort); err != nil {
		stop()
		return c, nil, nil, nil, err
	}
	c.SystemNamespace = namespace
	return c, roots, func() (string, error) { return tok.Status.Token, nil }, stop, nil
}

func ptr[T any](v T) *T { return &v }

// readRoots is the mesh's roots (PEM) as ca publishes them in namespace.
func readRoots(ctx context.Context, client kubernetes.Interface, namespace string) ([]byte, error) {
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, rootsConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the mesh's roots (ConfigMap %s/%s): %w", namespace, rootsConfigMap, err)
	}
	if cm.Data[rootsKey] == "" {
		return nil, fmt.Errorf("ConfigMap %s/%s has no %s", namespace, rootsConfigMap, rootsKey)
	}
	return []byte(cm.Data[rootsKey]), nil
}

// Client is a client of the cluster the options name.
func (k KubeOptions) Client() (kubernetes.Interface, error) {
	cfg, err := k.restConfig()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return client, nil
}

func (k KubeOptions) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.Kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: k.Context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// ForwardPod forwards a local port to a pod's port through the
// apiserver; stop ends the forward.
func (k KubeOptions) ForwardPod(ctx context.Context, namespace, pod string, port int) (addr string, stop func(), err error) {
	cfg, err := k.restConfig()
	if err != nil {
		return "", nil, err
	}
	f, err := portForward(ctx, cfg, namespace, pod, port)
	if err != nil {
		return "", nil, err
	}
	ports, err := f.GetPorts()
	switch {
	case err != nil:
		f.Close()
		return "", nil, fmt.Errorf("port-forward to %s/%s: %w", namespace, pod, err)
	case len(ports) != 1:
		f.Close()
		return "", nil, fmt.Errorf("port-forward to %s/%s: %d local ports, want one", namespace, pod, len(ports))
	}
	return "127.0.0.1:" + strconv.Itoa(int(ports[0].Local)), f.Close, nil
}

// portForward forwards a local port on 127.0.0.1 to a pod's port through
// the apiserver, as kubectl port-forward does, and waits until it is
// ready (or fails).
func portForward(ctx context.Context, cfg *rest.Config, namespace, pod string, port int) (*portforward.PortForwarder, error) {
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("port-forward: %w", err)
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return nil, fmt.Errorf("port-forward: apiserver %q: %w", cfg.Host, err)
	}
	u.Path, _ = url.JoinPath(u.Path, "api/v1/namespaces", namespace, "pods", pod, "portforward")
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	ready := make(chan struct{})
	f, err := portforward.NewOnAddressesWithContext(ctx, dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, ready, io.Discard, io.Discard)
	if err != nil {
		return nil, fmt.Errorf("port-forward to %s/%s: %w", namespace, pod, err)
	}
	failed := make(chan error, 1)
	go func() { failed <- f.ForwardPorts() }()
	select {
	case <-ready:
		return f, nil
	case err := <-failed:
		return nil, fmt.Errorf("port-forward to %s/%s:%d: %w", namespace, pod, port, err)
	case <-ctx.Done():
		f.Close()
		return nil, fmt.Errorf("port-forward to %s/%s:%d: %w", namespace, pod, port, ctx.Err())
	case <-time.After(30 * time.Second):
		f.Close()
		return nil, fmt.Errorf("port-forward to %s/%s:%d: not ready in 30s", namespace, pod, port)
	}
}
