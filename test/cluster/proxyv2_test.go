package cluster_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/test/build"
	"github.com/flotilla-mesh/flotilla/test/podproc"
)

// istioSidecarRevision: a second release in the system namespace, a
// revision ("istio") whose injector injects Istio's own sidecar, the
// proxyv2 image, sharing galley and ca — as a team moving from Istio
// installs Flotilla. A pod of a namespace labelled for it is injected
// with Istio's proxyless (grpc-agent) template, and its istio-proxy
// container runs Istio's own pilot-agent (built from Istio's module,
// tools/istio) with exactly what the pod gives it: it gets the pod's
// certificate (its token, through discovery's relay to ca, which asks
// the apiserver's TokenReview), connects to discovery as
// istiod-istio.istio-system.svc with that token, and relays the
// application's xDS: the test plays the gRPC application on the pod's
// xDS socket. (The sidecar flavour needs Envoy, which cannot run here;
// test/istioagent runs it with a stand-in.)
func istioSidecarRevision(t testing.TB, ctx context.Context, _ *controlPlane) { //nolint:thelper // a step: the subtest of its own
	const rev, ns, sa = "istio", "legacy", "legacy-client"
	rcp := installRelease(t, ctx, systemNamespace, "flotilla-"+rev,
		"revision="+rev, "galley.enabled=false", "ca.enabled=false", "injector.sidecar=proxyv2",
		"discovery.autoscaling.enabled=false", "discovery.replicaCount=1", "discovery.podDisruptionBudget.enabled=false",
		"injector.replicaCount=1", "injector.podDisruptionBudget.enabled=false")
	c := env.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{"istio.io/rev": rev},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The revision's injector serves once it has its certificate from ca
	// and its configuration from galley: until then the apiserver cannot
	// call it, and the pod is created again.
	var created *corev1.Pod
	rcp.eventually(t, ctx, time.Minute, "the pod created through the revision's injector", func(ctx context.Context) error {
		var err error
		created, err = c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: "client", Labels: map[string]string{"app": "client"},
				Annotations: map[string]string{"inject.istio.io/templates": "grpc-agent"},
			},
			Spec: corev1.PodSpec{
				ServiceAccountName: sa,
				Containers:         []corev1.Container{{Name: "app", Image: "example.test/grpc-client:1"}},
			},
		}, metav1.CreateOptions{})
		return err
	})
	i := slices.IndexFunc(created.Spec.Containers, func(c corev1.Container) bool { return c.Name == "istio-proxy" })
	if i < 0 || !strings.Contains(created.Spec.Containers[i].Image, "/proxyv2:") {
		t.Fatalf("the pod was not injected with Istio's proxyv2: %v", created.Spec.Containers)
	}
	var pod *corev1.Pod
	rcp.eventually(t, ctx, time.Minute, "the pod running with an IP", func(ctx context.Context) error {
		var err error
		if pod, err = c.CoreV1().Pods(ns).Get(ctx, "client", metav1.GetOptions{}); err != nil {
			return err
		}
		if pod.Status.PodIP == "" || pod.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s, IP %q", pod.Status.Phase, pod.Status.PodIP)
		}
		return nil
	})

	root, err := build.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(filepath.Join(root, "bin", "tools", "pilot-agent"), filepath.Join(bin, "proxyv2")); err != nil {
		t.Fatal(err)
	}
	// A short directory: the pod's xDS socket lies in it, and a unix
	// socket's path is at most 107 bytes.
	podDir, err := os.MkdirTemp("", "pv2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(podDir) })
	runner := &podproc.Runner{
		Client: c, APIServer: env.Config.Host, Bin: bin, Dir: podDir,
		Images: map[string]podproc.Image{"proxyv2": {WorkDir: "/"}}, // Istio's proxyv2 Dockerfile: WORKDIR /
	}
	agent, err := runner.StartContainer(ctx, pod, "istio-proxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := agent.Stop(10 * time.Second); err != nil {
			t.Errorf("pilot-agent: %v", err)
		}
	})
	agentUp := func(what string, limit time.Duration, cond func(context.Context) error) {
		t.Helper()
		rcp.eventually(t, ctx, limit, what, func(ctx context.Context) error {
			select {
			case <-agent.Exited():
				return fmt.Errorf("pilot-agent exited: %w\n%s", agent.Err(), tail(agent.Log(), 40))
			default:
			}
			if err := cond(ctx); err != nil {
				return fmt.Errorf("%w\n%s", err, tail(agent.Log(), 15))
			}
			return nil
		})
	}

	// The certificate, through discovery's relay to ca, for the pod's
	// account, written where the application reads it.
	data := filepath.Join(agent.Dir, "volumes", "istio-data")
	agentUp("pilot-agent's certificate files", time.Minute, func(context.Context) error {
		b, err := os.ReadFile(filepath.Join(data, "cert-chain.pem"))
		if err != nil {
			return err
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			return errors.New("cert-chain.pem holds no PEM")
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return err
		}
		if len(cert.URIs) != 1 || cert.URIs[0].String() != "spiffe://cluster.local/ns/"+ns+"/sa/"+sa {
			return fmt.Errorf("certificate for %v", cert.URIs)
		}
		return nil
	})
	agentUp("pilot-agent ready", time.Minute, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(pod.Status.PodIP, "15020")+"/healthz/ready", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})

	// The application's xDS, relayed by pilot-agent to discovery with the
	// pod's token: the node is the bootstrap's pilot-agent wrote.
	xdsDir := filepath.Join(agent.Dir, "volumes", "istio-xds")
	var node corev3.Node
	agentUp("pilot-agent's gRPC bootstrap", time.Minute, func(context.Context) error {
		b, err := os.ReadFile(filepath.Join(xdsDir, "grpc-bootstrap.json"))
		if err != nil {
			return err
		}
		var boot struct {
			Node json.RawMessage `json:"node"`
		}
		if err := json.Unmarshal(b, &boot); err != nil {
			return err
		}
		return (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(boot.Node, &node)
	})
	cc, err := grpc.NewClient("unix://"+filepath.Join(xdsDir, "XDS"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	const listener = "kubernetes.default.svc.cluster.local:443"
	agentUp("the application's listener, relayed from discovery", time.Minute, func(ctx context.Context) error {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ads, err := discoveryv3.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(sctx)
		if err != nil {
			return err
		}
		if err := ads.Send(&discoveryv3.DiscoveryRequest{Node: &node, TypeUrl: resourcev3.ListenerType, ResourceNames: []string{listener}}); err != nil {
			return err
		}
		resp, err := ads.Recv()
		if err != nil {
			return err
		}
		if len(resp.GetResources()) != 1 {
			return fmt.Errorf("%d listeners for %s", len(resp.GetResources()), listener)
		}
		return nil
	})
}
