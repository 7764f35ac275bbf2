package kubeenv

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// hostsWriter is the cluster's DNS in the tests' namespace: it keeps the
// namespace's /etc/hosts (path, bind-mounted there) naming every Service
// with a cluster IP as <name>.<namespace>.svc.cluster.local,
// <name>.<namespace>.svc and <name>.<namespace>, which Go's resolver (and
// every process started in the namespace) reads before asking DNS.
// Headless Services are not named.
type hostsWriter struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func startHostsWriter(c kubernetes.Interface, path string) *hostsWriter {
	ctx, cancel := context.WithCancel(context.Background())
	w := &hostsWriter{cancel: cancel, done: make(chan struct{})}
	factory := informers.NewSharedInformerFactory(c, 0)
	services := factory.Core().V1().Services()
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	_, _ = services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
	})
	factory.Start(ctx.Done())
	go func() {
		defer close(w.done)
		defer factory.Shutdown()
		var last string
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
			list, err := services.Lister().List(labels.Everything())
			if err != nil {
				continue
			}
			if next := hostsFile(list); next != last {
				// One write of the whole file: the bind mount pins the
				// inode, so it cannot be renamed over.
				if err := os.WriteFile(path, []byte(next), 0o644); err == nil { //nolint:gosec // /etc/hosts is world-readable
					last = next
				}
			}
			// Coalesce a burst of Service changes.
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *hostsWriter) stop() {
	w.cancel()
	<-w.done
}

// hostsFile is /etc/hosts for services.
func hostsFile(services []*corev1.Service) string {
	var lines []string
	for _, s := range services {
		ip := s.Spec.ClusterIP
		if ip == "" || ip == corev1.ClusterIPNone {
			continue
		}
		n := s.Name + "." + s.Namespace
		lines = append(lines, fmt.Sprintf("%s %s.svc.cluster.local %s.svc %s", ip, n, n, n))
	}
	if len(lines) == 0 {
		return baseHosts
	}
	slices.Sort(lines)
	return baseHosts + strings.Join(lines, "\n") + "\n"
}

// baseHosts starts the namespace's /etc/hosts.
const baseHosts = "127.0.0.1 localhost\n::1 localhost\n"
