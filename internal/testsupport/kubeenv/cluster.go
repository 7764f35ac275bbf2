package kubeenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// ClusterOptions asks Start for the rest of a cluster beside the apiserver:
// kube-controller-manager (Deployments, ReplicaSets, EndpointSlices,
// namespaces, service accounts, the kube-root-ca.crt ConfigMaps, garbage
// collection), kube-scheduler, and kwok's simulated nodes, which accept
// the pods scheduled on them, give them IPs and report them Running and
// Ready, with no container behind them. In the namespaces
// RunInNetworkNamespace makes (and only there: they program the network),
// kube-proxy (nftables mode) translates cluster IPs to the pods' IPs, and
// the Services' names (<name>.<namespace>.svc[.cluster.local]) are
// written into that namespace's /etc/hosts, the cluster's DNS.
type ClusterOptions struct {
	// Nodes is how many simulated nodes kwok runs. Default 1.
	Nodes int
	// MaxPodsPerNode is each node's pod capacity. Default 110, the
	// kubelet's.
	MaxPodsPerNode int
	// ControllerQPS, when set, is the controller manager's and the
	// scheduler's request rate to the apiserver (--kube-api-qps; burst
	// twice it). Default: theirs (20 and 50), which a cluster of
	// thousands of pods churning outruns.
	ControllerQPS int
}

// The pod network of the simulated nodes: node i has PodCIDR
// 10.244.i.0/24, as a cluster whose node IPAM hands out /24s of
// 10.244.0.0/16 (kubeadm's and flannel's default). Nothing routes these
// addresses unless a test runs in a network namespace of its own where
// they are local (see RunInNetworkNamespace).
const (
	PodNetwork = "10.244.0.0/16"
	// ServiceNetwork is the Services' cluster IP range. In the namespace
	// RunInNetworkNamespace makes it is local, and kube-proxy translates
	// it to the pods' IPs.
	ServiceNetwork = "10.96.0.0/16"
	// NodeAnnotation marks the nodes kwok manages.
	NodeAnnotation = "kwok.x-k8s.io/node"
	// kwokNodeIP is the InternalIP kwok reports for every node.
	kwokNodeIP = "10.243.0.1"
)

// clusterBinaries are what ClusterOptions needs besides the apiserver and
// etcd; kwok.yaml holds kwok's stages (its own fast node and pod stages,
// copied from its module by `make kube-assets`).
var clusterBinaries = []string{"kube-controller-manager", "kube-scheduler", "kube-proxy", "kwok", "kwok.yaml"}

// NodeName is the name of simulated node i.
func NodeName(i int) string { return "kwok-node-" + strconv.Itoa(i) }

// startCluster runs the controller manager, the scheduler and kwok against
// the running apiserver, creates the nodes and waits until they are Ready.
func (e *Env) startCluster(ctx context.Context, bin string, o *ClusterOptions, verbose bool) error {
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.MaxPodsPerNode == 0 {
		o.MaxPodsPerNode = 110
	}
	kubeconfig := filepath.Join(e.dir, "admin.kubeconfig")
	if err := e.WriteKubeconfig(kubeconfig); err != nil {
		return err
	}
	certs := filepath.Join(e.dir, "certs")
	rootCA := filepath.Join(certs, "apiserver-ca.crt")
	if err := os.WriteFile(rootCA, e.CA.CertPEM, 0o600); err != nil {
		return fmt.Errorf("write the apiserver's CA: %w", err)
	}
	kcmPort, err := freePort()
	if err != nil {
		return err
	}
	e.controllerManager, err = startProcess(filepath.Join(bin, "kube-controller-manager"), filepath.Join(e.dir, "kube-controller-manager.log"), verbose,
		append([]string{
			"--kubeconfig", kubeconfig,
			"--authentication-kubeconfig", kubeconfig,
			"--authorization-kubeconfig", kubeconfig,
			"--bind-address", "127.0.0.1",
			"--secure-port", strconv.Itoa(kcmPort),
			"--leader-elect=false",
			// Each controller with its own service account's credentials,
			// as kubeadm runs it, so the apiserver sees them apart.
			"--use-service-account-credentials=true",
			"--service-account-private-key-file", filepath.Join(certs, "sa.key"),
			"--root-ca-file", rootCA,
			"--v", "0",
		}, o.apiRate()...)...,
	)
	if err != nil {
		return err
	}
	schedPort, err := freePort()
	if err != nil {
		return err
	}
	e.scheduler, err = startProcess(filepath.Join(bin, "kube-scheduler"), filepath.Join(e.dir, "kube-scheduler.log"), verbose,
		append([]string{
			"--kubeconfig", kubeconfig,
			"--authentication-kubeconfig", kubeconfig,
			"--authorization-kubeconfig", kubeconfig,
			"--bind-address", "127.0.0.1",
			"--secure-port", strconv.Itoa(schedPort),
			"--leader-elect=false",
			"--v", "0",
		}, o.apiRate()...)...,
	)
	if err != nil {
		return err
	}
	e.kwok, err = startProcess(filepath.Join(bin, "kwok"), filepath.Join(e.dir, "kwok.log"), verbose,
		"--kubeconfig", kubeconfig,
		"--config", filepath.Join(bin, "kwok.yaml"),
		"--manage-nodes-with-annotation-selector", NodeAnnotation+"=fake",
		"--node-ip", kwokNodeIP,
		"--cidr", PodNetwork,
		"--node-lease-duration-seconds", "40",
	)
	if err != nil {
		return err
	}
	for i := range o.Nodes {
		if err := e.createNode(ctx, i, o.MaxPodsPerNode); err != nil {
			return err
		}
	}
	if err := e.waitNodesReady(ctx, o.Nodes); err != nil {
		return err
	}
	if !inNetworkNamespace() {
		return nil
	}
	metricsPort, err := freePort()
	if err != nil {
		return err
	}
	healthPort, err := freePort()
	if err != nil {
		return err
	}
	e.proxy, err = startProcess(filepath.Join(bin, "kube-proxy"), filepath.Join(e.dir, "kube-proxy.log"), verbose,
		"--kubeconfig", kubeconfig,
		"--hostname-override", NodeName(0),
		"--proxy-mode", "nftables",
		// No --cluster-cidr: kube-proxy then leaves the source of
		// connections to cluster IPs from outside the pod network (the
		// tests, the apiserver) as it is; masqueraded to the loopback's
		// address they would find no way back.
		// The namespace's conntrack settings are left as they are.
		"--conntrack-max-per-core", "0",
		"--conntrack-tcp-timeout-established", "0",
		"--conntrack-tcp-timeout-close-wait", "0",
		"--metrics-bind-address", "127.0.0.1:"+strconv.Itoa(metricsPort),
		"--healthz-bind-address", "127.0.0.1:"+strconv.Itoa(healthPort),
		"--v", "0",
	)
	if err != nil {
		return err
	}
	e.dns = startHostsWriter(e.Client, os.Getenv(hostsEnv))
	return nil
}

// apiRate is the controllers' flags for ControllerQPS.
func (o *ClusterOptions) apiRate() []string {
	if o.ControllerQPS <= 0 {
		return nil
	}
	return []string{"--kube-api-qps", strconv.Itoa(o.ControllerQPS), "--kube-api-burst", strconv.Itoa(2 * o.ControllerQPS)}
}

func (e *Env) createNode(ctx context.Context, i, maxPods int) error {
	_, cidr, err := net.ParseCIDR(fmt.Sprintf("10.244.%d.0/24", i))
	if err != nil || i > 255 {
		return fmt.Errorf("node %d: no /24 of %s left for it", i, PodNetwork)
	}
	name := NodeName(i)
	pods := resource.MustParse(strconv.Itoa(maxPods))
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{NodeAnnotation: "fake"},
			Labels: map[string]string{
				"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
				"type": "kwok", "topology.kubernetes.io/zone": "zone-" + strconv.Itoa(i%3),
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: cidr.String(), PodCIDRs: []string{cidr.String()}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourcePods: pods, corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("256Gi")},
			Allocatable: corev1.ResourceList{corev1.ResourcePods: pods, corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("256Gi")},
		},
	}
	if _, err := e.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	return nil
}

// waitNodesReady waits until n kwok nodes report Ready.
func (e *Env) waitNodesReady(ctx context.Context, n int) error {
	var ready int
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := e.clusterExited(); err != nil {
			return false, err
		}
		nodes, err := e.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // polled again
		}
		ready = 0
		for _, node := range nodes.Items {
			if node.Annotations[NodeAnnotation] != "fake" {
				continue
			}
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready >= n, nil
	})
	if err != nil {
		return fmt.Errorf("%d of %d kwok nodes Ready: %w; kwok's log tail:\n%s", ready, n, err, e.kwok.logTail())
	}
	return nil
}

// clusterExited says which of the cluster's processes has exited, with its
// log's tail, or nil while all run.
func (e *Env) clusterExited() error {
	for _, p := range []*process{e.controllerManager, e.scheduler, e.kwok, e.proxy} {
		if p == nil {
			continue
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited (%w); log tail:\n%s", p.name, p.err, p.logTail())
		default:
		}
	}
	return nil
}
