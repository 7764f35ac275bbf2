// Package kubesource is galley's Kubernetes source: informers for the Istio
// kinds (istio.io/client-go) and for Services, EndpointSlices, Pods,
// Namespaces (metadata only) and the mesh ConfigMap (client-go), feeding
// validated Istio objects to the config sink and normalised registry
// resources to the registry sink. Pods are cached
// trimmed to the few fields the registry needs: in large clusters they are
// most of an informer's memory.
package kubesource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/protobuf/proto"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	kubenorm "github.com/flotilla-mesh/flotilla/internal/normalize/kube"
	"github.com/flotilla-mesh/flotilla/internal/registry"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// ConfigSink receives Istio objects (publish.Publisher), within the
// change's span.
type ConfigSink interface {
	Apply(ctx context.Context, upserts []*istio.Object, deletes []istio.ID) error
}

// RegistrySink receives registry resources (mcp.Server).
type RegistrySink interface {
	Update(typeURL string, upserts []*mcp.Resource, deletes []string) (int, error)
}

// Options configures a Source.
type Options struct {
	Kube  kubernetes.Interface
	Istio istioclient.Interface
	// Metadata reads namespaces without their specs.
	Metadata metadata.Interface
	// SystemNamespace holds the mesh ConfigMap.
	SystemNamespace string
	Log             *slog.Logger
	DomainSuffix    string
	ClusterID       string
	// SecretNamespaces limits the Secrets watched (for Gateways' and
	// DestinationRules' credentialName) to these namespaces; empty
	// watches every namespace.
	SecretNamespaces []string
	// Tracer traces each change of an Istio object (a span "kube.change",
	// with "validate" and "publish" under it); none when nil.
	Tracer trace.TracerProvider
	// IgnoreAllocatedAddresses leaves ServiceEntries' status.addresses
	// unread (address allocation turned off, as Istio's
	// PILOT_ENABLE_IP_AUTOALLOCATE=false neither writes nor uses them).
	IgnoreAllocatedAddresses bool
	// ServiceEntriesChanged, when set, is called (with the source's lock
	// held: it must not block) after a ServiceEntry is published or
	// withdrawn, its status.addresses included (ipallocate.Controller).
	ServiceEntriesChanged func()
	// ClusterChanged, when set, is called (with the source's lock held:
	// it must not block) after a change of what GatewayCluster returns.
	ClusterChanged func()
}

// Source watches the cluster. Event handlers run on the informers'
// goroutines; Source serialises them so that sinks see one change at a time.
type Source struct {
	o        Options
	config   ConfigSink
	registry RegistrySink
	tracer   trace.Tracer

	mu           sync.Mutex
	pods         map[string]map[string]*corev1.Pod // namespace → name
	slices       map[string]*discoveryv1.EndpointSlice
	slicesByPod  map[string]map[string]bool
	externalName map[string]bool // services whose external-name set is published
	services     map[string]*corev1.Service
	weShards     map[string]bool // services whose WorkloadEntry set is published
	// sePodSets are the EndpointSets of pods published per ServiceEntry
	// (by object), by name, with their content.
	sePodSets map[istio.ID]map[string]*registryv1.EndpointSet
	// seSelecting are the ServiceEntries with a workloadSelector, by
	// namespace.
	seSelecting map[string]map[istio.ID]*istio.Object
	rejected    map[istio.ID]string
	// rejectedSince is when each rejected object was first refused as it
	// is now.
	rejectedSince map[istio.ID]time.Time
	gate          *gate                      // the mesh's discoverySelectors (discoveryselectors.go)
	published     map[istio.ID]*istio.Object // what was last sent per object
	synced        chan struct{}
	// secrets are the Secrets watched ("namespace/name"), trimmed to
	// their credential keys; credRefs counts the objects naming each
	// Secret name, credRefsBy what each object names; credPublished the
	// Secrets published.
	secrets       map[string]*corev1.Secret
	credRefs      map[string]int
	credRefsBy    map[istio.ID][]string
	credPublished map[string]bool
	// caPublished are the ConfigMap CA certificates published
	// ("namespace/name" → ca.crt; ConfigMapCAsChanged).
	caPublished map[string][]byte
	// injection are the valid injection configurations' values, by
	// revision.
	injection map[string]inject.Values

	// Registry changes wait here, coalesced, until the flusher sends them
	// as one update per collection: a burst of endpoint churn becomes a few
	// large MCP responses instead of one per EndpointSlice.
	pending map[string]map[string]proto.Message // type URL → name → body (nil: delete)
	kick    chan struct{}
	// nsStore is the namespaces' informer store (labels), once running.
	nsStore cache.Store
}

// New returns a source; Run starts it.
func New(o Options, config ConfigSink, reg RegistrySink) *Source {
	o.Log = o.Log.With("component", "kubesource")
	if o.Tracer == nil {
		o.Tracer = noop.NewTracerProvider()
	}
	return &Source{
		o: o, config: config, registry: reg, tracer: o.Tracer.Tracer("flotilla/kubesource"),
		pods:          map[string]map[string]*corev1.Pod{},
		slices:        map[string]*discoveryv1.EndpointSlice{},
		slicesByPod:   map[string]map[string]bool{},
		externalName:  map[string]bool{},
		services:      map[string]*corev1.Service{},
		weShards:      map[string]bool{},
		sePodSets:     map[istio.ID]map[string]*registryv1.EndpointSet{},
		seSelecting:   map[string]map[istio.ID]*istio.Object{},
		rejected:      map[istio.ID]string{},
		rejectedSince: map[istio.ID]time.Time{},
		gate:          newGate(),
		published:     map[istio.ID]*istio.Object{},
		synced:        make(chan struct{}),
		secrets:       map[string]*corev1.Secret{},
		credRefs:      map[string]int{},
		credRefsBy:    map[istio.ID][]string{},
		credPublished: map[string]bool{},
		caPublished:   map[string][]byte{},
		injection:     map[string]inject.Values{},
		pending:       map[string]map[string]proto.Message{},
		kick:          make(chan struct{}, 1),
	}
}

// Synced is closed once every informer has listed the cluster.
func (s *Source) Synced() <-chan struct{} { return s.synced }

// Run starts the informers and blocks until ctx ends.
func (s *Source) Run(ctx context.Context) error {
	istioFactory := istioinformers.NewSharedInformerFactory(s.o.Istio, 0)
	var syncs []cache.InformerSynced
	istioInfs, err := istioInformers(istioFactory)
	if err != nil {
		return err
	}
	for _, ki := range istioInfs {
		kind, inf := ki.kind, ki.informer
		if err := inf.SetTransform(dropManagedFields); err != nil {
			return fmt.Errorf("%s transform: %w", kind, err)
		}
		if _, err := inf.AddEventHandler(s.gate.gated(inf, s.istioHandler(kind))); err != nil {
			return fmt.Errorf("watch %s: %w", kind, err)
		}
		syncs = append(syncs, inf.HasSynced)
	}
	kubeFactory := informers.NewSharedInformerFactory(s.o.Kube, 0)
	svcInf := kubeFactory.Core().V1().Services().Informer()
	sliceInf := kubeFactory.Discovery().V1().EndpointSlices().Informer()
	podInf := kubeFactory.Core().V1().Pods().Informer()
	if err := podInf.SetTransform(trimPod); err != nil {
		return fmt.Errorf("pod transform: %w", err)
	}
	for name, inf := range map[string]cache.SharedIndexInformer{"services": svcInf, "endpointslices": sliceInf} {
		if err := inf.SetTransform(dropManagedFields); err != nil {
			return fmt.Errorf("%s transform: %w", name, err)
		}
	}
	for name, reg := range map[string]func() error{
		"services":       func() error { _, err := svcInf.AddEventHandler(s.gate.gated(svcInf, s.serviceHandler())); return err },
		"endpointslices": func() error { _, err := sliceInf.AddEventHandler(s.gate.gated(sliceInf, s.sliceHandler())); return err },
		"pods":           func() error { _, err := podInf.AddEventHandler(s.gate.gated(podInf, s.podHandler())); return err },
	} {
		if err := reg(); err != nil {
			return fmt.Errorf("watch %s: %w", name, err)
		}
	}
	syncs = append(syncs, svcInf.HasSynced, sliceInf.HasSynced, podInf.HasSynced)

	metaFactory := metadatainformer.NewSharedInformerFactory(s.o.Metadata, 0)
	nsInf := metaFactory.ForResource(corev1.SchemeGroupVersion.WithResource("namespaces")).Informer()
	s.mu.Lock()
	s.nsStore = nsInf.GetStore()
	s.mu.Unlock()
	if _, err := nsInf.AddEventHandler(s.namespaceHandler()); err != nil {
		return fmt.Errorf("watch namespaces: %w", err)
	}
	nsGate, err := nsInf.AddEventHandler(s.gate.namespaceHandler())
	if err != nil {
		return fmt.Errorf("watch namespaces: %w", err)
	}
	// The system namespace's ConfigMaps: mesh and injection configuration.
	meshFactory := informers.NewSharedInformerFactoryWithOptions(s.o.Kube, 0, informers.WithNamespace(s.o.SystemNamespace))
	meshInf := meshFactory.Core().V1().ConfigMaps().Informer()
	if err := meshInf.SetTransform(dropManagedFields); err != nil {
		return fmt.Errorf("configmaps transform: %w", err)
	}
	if _, err := meshInf.AddEventHandler(s.configMapHandler()); err != nil {
		return fmt.Errorf("watch configuration configmaps: %w", err)
	}
	meshGate, err := meshInf.AddEventHandler(s.gate.meshHandler())
	if err != nil {
		return fmt.Errorf("watch configuration configmaps: %w", err)
	}
	syncs = append(syncs, nsInf.HasSynced, meshInf.HasSynced)

	// Secrets, for the credentials configuration names: every namespace,
	// or the ones SecretNamespaces lists.
	secretFactories := []informers.SharedInformerFactory{kubeFactory}
	if len(s.o.SecretNamespaces) > 0 {
		secretFactories = nil
		for _, ns := range s.o.SecretNamespaces {
			secretFactories = append(secretFactories, informers.NewSharedInformerFactoryWithOptions(s.o.Kube, 0, informers.WithNamespace(ns)))
		}
	}
	for _, f := range secretFactories {
		inf := f.Core().V1().Secrets().Informer()
		if err := inf.SetTransform(trimSecret); err != nil {
			return fmt.Errorf("secrets transform: %w", err)
		}
		if _, err := inf.AddEventHandler(s.secretHandler()); err != nil {
			return fmt.Errorf("watch secrets: %w", err)
		}
		syncs = append(syncs, inf.HasSynced)
	}

	factories := []interface {
		Start(<-chan struct{})
		Shutdown()
	}{metaFactory, meshFactory, istioFactory, kubeFactory}
	if len(s.o.SecretNamespaces) > 0 {
		for _, f := range secretFactories {
			factories = append(factories, f)
		}
	}
	defer func() {
		for _, f := range factories {
			f.Shutdown()
		}
	}()
	// The namespaces and the mesh configuration first: which namespaces
	// are read (the mesh's discoverySelectors) is known before any of
	// their objects arrives, as Istio waits for its namespace filter.
	metaFactory.Start(ctx.Done())
	meshFactory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), nsGate.HasSynced, meshGate.HasSynced) {
		return nil // ctx ended first
	}
	for _, f := range factories[2:] {
		f.Start(ctx.Done())
	}
	flushed := make(chan struct{})
	go func() {
		s.flushLoop(ctx)
		close(flushed)
	}()
	defer func() { <-flushed }()
	start := time.Now()
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return nil // ctx ended first
	}
	s.o.Log.Info("synced with the cluster", "took", time.Since(start))
	close(s.synced)
	<-ctx.Done()
	return nil
}

func unwrap(obj any) any {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

// handler is the frame of every informer's handler here: an object added,
// or updated to a new version (see unchanged), is upserted; one deleted,
// also as the tombstone of a deletion the informer missed, is removed. An
// object that is not a T is ignored.
func handler[T any](upsert, remove func(T)) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := obj.(T); ok {
				upsert(o)
			}
		},
		UpdateFunc: func(old, obj any) {
			if o, ok := obj.(T); ok && !unchanged(old, obj) {
				upsert(o)
			}
		},
		DeleteFunc: func(obj any) {
			if o, ok := unwrap(obj).(T); ok {
				remove(o)
			}
		},
	}
}

func (s *Source) istioHandler(kind istio.Kind) cache.ResourceEventHandler {
	upsert := func(m metav1.Object) {
		o, ok := toObject(kind, m, !s.o.IgnoreAllocatedAddresses)
		if !ok {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		// Traced when it changes something (or is refused): resyncs and
		// status updates make no span.
		start := time.Now()
		res := validation.Validate(o, nil)
		validated := time.Now()
		traced := func() (context.Context, trace.Span) {
			ctx, span := s.tracer.Start(context.Background(), "kube.change", trace.WithTimestamp(start), trace.WithAttributes(
				attribute.String("kind", kind.Kind), attribute.String("object", o.Meta.Namespace+"/"+o.Meta.Name)))
			_, validate := s.tracer.Start(ctx, "validate", trace.WithTimestamp(start))
			validate.End(trace.WithTimestamp(validated))
			return ctx, span
		}
		if !res.OK() {
			// Invalid in the cluster (the webhook was bypassed or came
			// later): keep serving its last valid state.
			msg := res.Err().Error()
			if s.rejected[o.ID()] != msg {
				s.o.Log.Error("invalid object in the cluster; keeping its last valid state", "object", o.String(), "errors", msg)
			}
			if s.rejected[o.ID()] != msg {
				s.rejectedSince[o.ID()] = time.Now()
			}
			s.rejected[o.ID()] = msg
			_, span := traced()
			span.SetStatus(codes.Error, msg)
			span.End()
			return
		}
		delete(s.rejected, o.ID())
		delete(s.rejectedSince, o.ID())
		if prev := s.published[o.ID()]; prev != nil && prev.SameContent(o) {
			return // a status-only (or resync) update: nothing to push
		}
		ctx, span := traced()
		defer span.End()
		pctx, publish := s.tracer.Start(ctx, "publish")
		err := s.config.Apply(pctx, []*istio.Object{o}, nil)
		publish.End()
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			s.o.Log.Error("publish", "object", o.String(), "error", err)
			return
		}
		s.published[o.ID()] = o
		if kind.Kind == istio.WorkloadEntry {
			s.refreshWorkloadEntries(o.Meta.Namespace)
		}
		if kind.Kind == istio.ServiceEntry {
			s.publishServiceEntryPods(o.ID(), o)
			s.clusterChanged()
			s.serviceEntriesChanged()
		}
		if namesCredentials(kind.Kind) {
			s.refreshCredentialRefs(o.ID(), o)
		}
	}
	return handler(upsert, func(m metav1.Object) {
		id := istio.ID{Kind: kind.Kind, Name: m.GetNamespace() + "/" + m.GetName()}
		s.mu.Lock()
		defer s.mu.Unlock()
		ctx, span := s.tracer.Start(context.Background(), "kube.change", trace.WithAttributes(
			attribute.String("kind", kind.Kind), attribute.String("object", id.Name), attribute.Bool("deleted", true)))
		defer span.End()
		delete(s.rejected, id)
		delete(s.rejectedSince, id)
		delete(s.published, id)
		if err := s.config.Apply(ctx, nil, []istio.ID{id}); err != nil {
			s.o.Log.Error("publish deletion", "object", id, "error", err)
		}
		if kind.Kind == istio.WorkloadEntry {
			s.refreshWorkloadEntries(m.GetNamespace())
		}
		if kind.Kind == istio.ServiceEntry {
			s.publishServiceEntryPods(id, nil)
			s.clusterChanged()
			s.serviceEntriesChanged()
		}
		if namesCredentials(kind.Kind) {
			s.refreshCredentialRefs(id, nil)
		}
	})
}

// serviceEntriesChanged tells Options.ServiceEntriesChanged. Called with
// s.mu held.
func (s *Source) serviceEntriesChanged() {
	if s.o.ServiceEntriesChanged != nil {
		s.o.ServiceEntriesChanged()
	}
}

// clusterChanged tells Options.ClusterChanged. Called with s.mu held.
func (s *Source) clusterChanged() {
	if s.o.ClusterChanged != nil {
		s.o.ClusterChanged()
	}
}

// unchanged reports whether an update is the same version of the object
// as before: what an informer delivers for every object when it relists
// (after its watch could not resume, an apiserver restart say) or
// resyncs. Nothing changed, so nothing is published again: republishing
// would push every proxy the same endpoints.
func unchanged(old, obj any) bool {
	o, err1 := metaOf(old)
	n, err2 := metaOf(obj)
	return err1 == nil && err2 == nil && o.GetResourceVersion() != "" && o.GetResourceVersion() == n.GetResourceVersion()
}

func metaOf(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, errors.New("not a Kubernetes object")
	}
	return m, nil
}

// Objects returns the valid Istio objects currently published.
func (s *Source) Objects() []*istio.Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*istio.Object, 0, len(s.published))
	for _, o := range s.published {
		out = append(out, o)
	}
	return out
}

// Rejected lists the objects in the cluster that failed validation, with
// why, for the status writer.
func (s *Source) Rejected() map[istio.ID]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[istio.ID]string, len(s.rejected))
	for k, v := range s.rejected {
		out[k] = v
	}
	return out
}

// Rejections lists the objects in the cluster that failed validation, as
// debugapi.Rejections serves them, oldest refusal first.
func (s *Source) Rejections() []debugapi.Rejection {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]debugapi.Rejection, 0, len(s.rejected))
	for id, msg := range s.rejected {
		out = append(out, debugapi.Rejection{Object: id.Kind + " " + id.Name, Message: msg, Since: s.rejectedSince[id]})
	}
	slices.SortFunc(out, func(a, b debugapi.Rejection) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Object, b.Object))
	})
	return out
}

func (s *Source) serviceHandler() cache.ResourceEventHandler {
	upsert := func(svc *corev1.Service) {
		s.mu.Lock()
		defer s.mu.Unlock()
		rs := kubenorm.Service(svc, s.o.DomainSuffix, s.o.ClusterID)
		s.publish(registry.ServiceTypeURL, registry.ServiceName(rs.GetNamespace(), rs.GetHostname()), rs)
		key := svc.Namespace + "/" + svc.Name
		s.services[key] = svc
		s.publishWorkloadEntries(svc)
		extName := registry.EndpointSetName(svc.Namespace, rs.GetHostname(), kubenorm.ExternalNameShard)
		switch {
		case svc.Spec.Type == corev1.ServiceTypeExternalName:
			s.publish(registry.EndpointSetTypeURL, extName, kubenorm.ExternalNameEndpoints(svc, s.o.DomainSuffix))
			s.externalName[key] = true
		case s.externalName[key]:
			s.remove(registry.EndpointSetTypeURL, extName)
			delete(s.externalName, key)
		}
		s.clusterChanged()
	}
	return handler(upsert, func(svc *corev1.Service) {
		s.mu.Lock()
		defer s.mu.Unlock()
		host := kubenorm.Hostname(svc.Name, svc.Namespace, s.o.DomainSuffix)
		s.remove(registry.ServiceTypeURL, registry.ServiceName(svc.Namespace, host))
		key := svc.Namespace + "/" + svc.Name
		delete(s.services, key)
		if s.weShards[key] {
			s.remove(registry.EndpointSetTypeURL, registry.EndpointSetName(svc.Namespace, host, kubenorm.WorkloadEntryShard))
			delete(s.weShards, key)
		}
		if s.externalName[key] {
			s.remove(registry.EndpointSetTypeURL, registry.EndpointSetName(svc.Namespace, host, kubenorm.ExternalNameShard))
			delete(s.externalName, key)
		}
		s.clusterChanged()
	})
}

func (s *Source) sliceHandler() cache.ResourceEventHandler {
	upsert := func(slice *discoveryv1.EndpointSlice) {
		s.mu.Lock()
		defer s.mu.Unlock()
		key := slice.Namespace + "/" + slice.Name
		s.unindex(key)
		s.slices[key] = slice
		for _, e := range slice.Endpoints {
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				pk := slice.Namespace + "/" + e.TargetRef.Name
				if s.slicesByPod[pk] == nil {
					s.slicesByPod[pk] = map[string]bool{}
				}
				s.slicesByPod[pk][key] = true
			}
		}
		s.publishSlice(slice)
		s.clusterChanged()
	}
	return handler(upsert, func(slice *discoveryv1.EndpointSlice) {
		s.mu.Lock()
		defer s.mu.Unlock()
		key := slice.Namespace + "/" + slice.Name
		s.unindex(key)
		delete(s.slices, key)
		if svc := slice.Labels[discoveryv1.LabelServiceName]; svc != "" {
			host := kubenorm.Hostname(svc, slice.Namespace, s.o.DomainSuffix)
			s.remove(registry.EndpointSetTypeURL, registry.EndpointSetName(slice.Namespace, host, slice.Name))
		}
		s.clusterChanged()
	})
}

// publishWorkloadEntries publishes (or withdraws) the endpoints a Service
// selects among WorkloadEntries. Must hold s.mu.
func (s *Source) publishWorkloadEntries(svc *corev1.Service) {
	var wes []*istio.Object
	for id, o := range s.published {
		if id.Kind == istio.WorkloadEntry && o.Meta.Namespace == svc.Namespace {
			wes = append(wes, o)
		}
	}
	key := svc.Namespace + "/" + svc.Name
	name := registry.EndpointSetName(svc.Namespace, kubenorm.Hostname(svc.Name, svc.Namespace, s.o.DomainSuffix), kubenorm.WorkloadEntryShard)
	set, ok := kubenorm.WorkloadEntries(svc, wes, s.o.DomainSuffix)
	switch {
	case ok:
		s.publish(registry.EndpointSetTypeURL, name, set)
		s.weShards[key] = true
	case s.weShards[key]:
		s.remove(registry.EndpointSetTypeURL, name)
		delete(s.weShards, key)
	}
}

// refreshWorkloadEntries re-derives WorkloadEntry endpoints of every
// Service in namespace. Must hold s.mu.
func (s *Source) refreshWorkloadEntries(namespace string) {
	for _, svc := range s.services {
		if svc.Namespace == namespace {
			s.publishWorkloadEntries(svc)
		}
	}
}

// unindex forgets which pods a slice referenced. Must hold s.mu.
func (s *Source) unindex(sliceKey string) {
	old := s.slices[sliceKey]
	if old == nil {
		return
	}
	for _, e := range old.Endpoints {
		if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
			pk := old.Namespace + "/" + e.TargetRef.Name
			delete(s.slicesByPod[pk], sliceKey)
			if len(s.slicesByPod[pk]) == 0 {
				delete(s.slicesByPod, pk)
			}
		}
	}
}

func (s *Source) podHandler() cache.ResourceEventHandler {
	changed := func(pod *corev1.Pod, deleted bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		key := pod.Namespace + "/" + pod.Name
		switch {
		case deleted:
			delete(s.pods[pod.Namespace], pod.Name)
			if len(s.pods[pod.Namespace]) == 0 {
				delete(s.pods, pod.Namespace)
			}
		case s.pods[pod.Namespace] == nil:
			s.pods[pod.Namespace] = map[string]*corev1.Pod{pod.Name: pod}
		default:
			s.pods[pod.Namespace][pod.Name] = pod
		}
		for sk := range s.slicesByPod[key] {
			if slice := s.slices[sk]; slice != nil {
				s.publishSlice(slice)
			}
		}
		s.refreshServiceEntryPods(pod.Namespace)
	}
	return handler(
		func(p *corev1.Pod) { changed(p, false) },
		func(p *corev1.Pod) { changed(p, true) },
	)
}

// publishSlice normalises and publishes one slice. Must hold s.mu.
func (s *Source) publishSlice(slice *discoveryv1.EndpointSlice) {
	set, _, ok := kubenorm.EndpointSlice(slice, func(ns, name string) *corev1.Pod { return s.pods[ns][name] }, s.o.DomainSuffix)
	if !ok {
		return
	}
	s.publish(registry.EndpointSetTypeURL, registry.EndpointSetName(set.GetServiceNamespace(), set.GetServiceHostname(), set.GetShard()), set)
}

// publish queues an upsert; the sink drops it if its content did not
// change. Must hold s.mu.
func (s *Source) publish(typeURL, name string, body proto.Message) {
	s.queue(typeURL, name, body)
}

// remove queues a deletion. Must hold s.mu.
func (s *Source) remove(typeURL, name string) {
	s.queue(typeURL, name, nil)
}

func (s *Source) queue(typeURL, name string, body proto.Message) {
	if s.pending[typeURL] == nil {
		s.pending[typeURL] = map[string]proto.Message{}
	}
	s.pending[typeURL][name] = body
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// flushBatchDelay is how long the flusher lets a burst accumulate.
const flushBatchDelay = 5 * time.Millisecond

// flushLoop sends queued registry changes until ctx ends, then once more.
// A change that comes flushBatchDelay or more after the last flush goes
// out at once (a lone pod's change is not held back); one that comes
// sooner, inside a burst, waits flushBatchDelay for the rest of it.
func (s *Source) flushLoop(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			s.flush()
			return
		case <-s.kick:
		}
		if time.Since(last) < flushBatchDelay {
			select {
			case <-ctx.Done():
			case <-time.After(flushBatchDelay):
			}
		}
		s.flush()
		last = time.Now()
	}
}

// flush sends everything queued, one update per collection.
func (s *Source) flush() {
	s.mu.Lock()
	batch := s.pending
	s.pending = map[string]map[string]proto.Message{}
	s.mu.Unlock()
	for typeURL, items := range batch {
		var ups []*mcp.Resource
		var dels []string
		for name, body := range items {
			if body == nil {
				dels = append(dels, name)
				continue
			}
			r, err := mcp.NewResource(name, body, nil, nil)
			if err != nil {
				s.o.Log.Error("publish", "type_url", typeURL, "name", name, "error", err)
				continue
			}
			ups = append(ups, r)
		}
		if _, err := s.registry.Update(typeURL, ups, dels); err != nil {
			s.o.Log.Error("publish", "type_url", typeURL, "resources", len(ups), "deletions", len(dels), "error", err)
		}
	}
}

// dropManagedFields removes server-side-apply bookkeeping, often the
// largest part of an object's metadata, before the informer caches it.
func dropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// trimPod keeps only what the registry reads from a pod.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: keep as is
	}
	// What ServiceEntries selecting pods read too (kubenorm.ServiceEntryPods):
	// readiness, deletion, and the named container ports.
	var ready []corev1.PodCondition
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			ready = append(ready, corev1.PodCondition{Type: c.Type, Status: c.Status})
		}
	}
	ports := func(cs []corev1.Container) []corev1.Container {
		var out []corev1.Container
		for _, c := range cs {
			if len(c.Ports) > 0 {
				out = append(out, corev1.Container{Name: c.Name, Ports: c.Ports, RestartPolicy: c.RestartPolicy})
			}
		}
		return out
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, Labels: pod.Labels,
			UID: pod.UID, ResourceVersion: pod.ResourceVersion, DeletionTimestamp: pod.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: pod.Spec.ServiceAccountName, NodeName: pod.Spec.NodeName,
			Containers: ports(pod.Spec.Containers), InitContainers: ports(pod.Spec.InitContainers),
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, PodIP: pod.Status.PodIP, PodIPs: pod.Status.PodIPs, Conditions: ready},
	}, nil
}
