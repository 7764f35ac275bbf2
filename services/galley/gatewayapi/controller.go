// Package gatewayapi is galley's Gateway API controller, the I/O shell of
// internal/gatewayapi: it watches the Gateway API kinds (once their CRDs
// exist), converts them with the rest of the cluster as galley's
// Kubernetes source sees it, publishes the Istio Gateways and
// VirtualServices the conversion makes beside the cluster's own, and —
// on the elected leader only — writes each object's status.
package gatewayapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	gw "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/platform/leader"
)

// ConfigSink receives the generated objects (publish.Publisher).
type ConfigSink interface {
	Apply(ctx context.Context, upserts []*istio.Object, deletes []istio.ID) error
}

// Options configures a Controller.
type Options struct {
	Client gwclient.Interface
	// Kube holds the leader Lease.
	Kube kubernetes.Interface
	// Cluster returns the rest of the cluster as it is now
	// (kubesource.Source.GatewayCluster).
	Cluster func() gatewayapi.Cluster
	Sink    ConfigSink
	// Published, when set, is told what was published (kubesource's
	// GeneratedChanged: the Secrets generated Gateways name).
	Published func(upserts []*istio.Object, deletes []istio.ID)
	// ConfigMapCAs, when set, is given after each conversion the CA
	// certificates of the ConfigMaps its listeners validate clients with
	// (gatewayapi.Output.ConfigMapCAs; kubesource's ConfigMapCAsChanged
	// publishes them).
	ConfigMapCAs func(map[string][]byte)
	DomainSuffix string
	// Controllers are the GatewayClass controllerNames served, the first
	// Flotilla's own; Classes the GatewayClasses served without an
	// object (name → controllerName).
	Controllers []gw.GatewayController
	Classes     map[string]gw.GatewayController
	Log         *slog.Logger
	// Identity, LeaseNamespace and LeaseName elect the status writer.
	Identity, LeaseNamespace, LeaseName string
	// Debounce is how long a change waits for others before the
	// conversion runs (default 100ms); CRDCheck how often galley looks
	// for the Gateway API's CRDs until they exist (default 10s).
	Debounce, CRDCheck time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Injection returns a revision's injection values
	// (kubesource.Source.InjectionValues): what the Gateways of a served
	// class are deployed with.
	Injection func(revision string) (inject.Values, bool)
	// SystemNamespace holds the GatewayClasses' defaults ConfigMaps.
	SystemNamespace string
}

// Controller converts and publishes the Gateway API.
type Controller struct {
	o    Options
	kick chan struct{}

	mu        sync.Mutex
	listers   *listers
	cms       *configMaps
	published map[istio.ID]*istio.Object
	latest    *gatewayapi.Output
	outputs   chan struct{} // a new output for the status writer
}

// New returns a controller; Run starts it.
func New(o Options) *Controller {
	if o.Debounce == 0 {
		o.Debounce = 100 * time.Millisecond
	}
	if o.CRDCheck == 0 {
		o.CRDCheck = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Log = o.Log.With("component", "gateway-api")
	return &Controller{o: o, kick: make(chan struct{}, 1), published: map[istio.ID]*istio.Object{}, outputs: make(chan struct{}, 1)}
}

// Changed asks for a conversion soon; it never blocks.
func (c *Controller) Changed() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// required are the kinds without which the Gateway API is not watched.
var required = []string{gatewayapi.KindGatewayClass, gatewayapi.KindGateway, gatewayapi.KindHTTPRoute}

// Run waits for the Gateway API's CRDs, watches the kinds, converts on
// every change and, while this replica leads, writes status. It returns
// when ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	served, err := c.waitForCRDs(ctx)
	if err != nil || served == nil {
		return err
	}
	f := gwinformers.NewSharedInformerFactory(c.o.Client, 0)
	l := newListers(f, served)
	for _, inf := range l.informers {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { c.Changed() },
			UpdateFunc: func(any, any) { c.Changed() },
			DeleteFunc: func(any) { c.Changed() },
		}); err != nil {
			return fmt.Errorf("watch the Gateway API: %w", err)
		}
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	for _, inf := range l.informers {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return nil
		}
	}
	cms, err := watchConfigMaps(ctx, c.o.Kube, c.Changed)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.listers, c.cms = l, cms
	c.mu.Unlock()
	c.o.Log.Info("watching the Gateway API", "kinds", served)
	go func() {
		if err := leader.Run(ctx, leader.Options{
			Client: c.o.Kube, Log: c.o.Log, Namespace: c.o.LeaseNamespace, Name: c.o.LeaseName, Identity: c.o.Identity,
		}, c.lead); err != nil {
			c.o.Log.Error("gateway api status writer", "error", err)
		}
	}()
	c.Changed()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		}
		// Let a burst of changes settle into one conversion.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.o.Debounce):
		}
		c.convert(ctx)
	}
}

// waitForCRDs returns the Gateway API kinds the apiserver serves, once it
// serves the required ones; nil when ctx ends first.
func (c *Controller) waitForCRDs(ctx context.Context) ([]string, error) {
	logged := false
	for {
		res, err := c.o.Client.Discovery().ServerResourcesForGroupVersion(gatewayapi.Group + "/v1")
		if err != nil && !apierrors.IsNotFound(err) {
			c.o.Log.Warn("cannot list the Gateway API's resources; retrying", "error", err)
		}
		var served []string
		if res != nil {
			for _, k := range gatewayapi.Kinds() {
				if slices.ContainsFunc(res.APIResources, func(r metav1.APIResource) bool { return r.Name == k.Plural }) {
					served = append(served, k.Kind)
				}
			}
		}
		if !slices.ContainsFunc(required, func(k string) bool { return !slices.Contains(served, k) }) {
			return served, nil
		}
		if !logged {
			c.o.Log.Info("the Gateway API's CRDs are not installed: not watching it until they are", "needs", required)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(c.o.CRDCheck):
		}
	}
}

// convert runs the conversion over the informers' objects and publishes
// what changed.
func (c *Controller) convert(ctx context.Context) {
	c.mu.Lock()
	l, cms := c.listers, c.cms
	c.mu.Unlock()
	get, read := cms.reading("conversion")
	in := gatewayapi.Input{
		Controllers: c.o.Controllers, DefaultClasses: c.o.Classes, DomainSuffix: c.o.DomainSuffix,
		Now: metav1.NewTime(c.o.Now().Truncate(time.Second)), Cluster: withConfigMaps{c.o.Cluster(), get},
	}
	l.fill(&in)
	out := gatewayapi.Convert(in)
	read()
	next := make(map[istio.ID]*istio.Object, len(out.Objects))
	var upserts []*istio.Object
	for _, o := range out.Objects {
		next[o.ID()] = o
		if prev := c.published[o.ID()]; prev == nil || !prev.SameContent(o) {
			upserts = append(upserts, o)
		}
	}
	var deletes []istio.ID
	for id := range c.published {
		if next[id] == nil {
			deletes = append(deletes, id)
		}
	}
	if len(upserts) > 0 || len(deletes) > 0 {
		if err := c.o.Sink.Apply(ctx, upserts, deletes); err != nil {
			c.o.Log.Error("publish the Gateway API's configuration", "error", err)
			c.Changed() // retried on the next round
			return
		}
		if c.o.Published != nil {
			c.o.Published(upserts, deletes)
		}
		c.o.Log.Debug("published the Gateway API's configuration", "upserts", len(upserts), "deletes", len(deletes))
	}
	c.published = next
	if c.o.ConfigMapCAs != nil {
		c.o.ConfigMapCAs(out.ConfigMapCAs)
	}
	c.mu.Lock()
	c.latest = out
	c.mu.Unlock()
	select {
	case c.outputs <- struct{}{}:
	default:
	}
}

// withConfigMaps is the cluster with the ConfigMaps galley's gateway
// controller watches (kubesource watches only the system namespace's).
type withConfigMaps struct {
	gatewayapi.Cluster
	get func(ns, name string) (map[string]string, bool)
}

func (w withConfigMaps) ConfigMap(ns, name string) (map[string]string, bool) { return w.get(ns, name) }

// lead writes status and deploys the Gateways while this replica leads:
// after each conversion, and every few seconds for what failed.
func (c *Controller) lead(ctx context.Context) {
	c.o.Log.Info("leading: writing the Gateway API's status and deploying its gateways")
	c.ensureClasses(ctx)
	// The deployments' informers sync beside the status writing: status
	// never waits on them (their RBAC may be missing, say).
	d := newDeployer(c.o.Kube)
	synced := make(chan struct{})
	go func() {
		if err := d.watch(ctx, c.redeploy); err != nil {
			if ctx.Err() == nil {
				c.o.Log.Error("watching the gateways' deployments; not deploying them", "error", err)
			}
			return
		}
		close(synced)
		c.redeploy()
	}()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		c.writeStatus(ctx)
		select {
		case <-synced:
			c.deploy(ctx, d)
		default:
		}
		select {
		case <-ctx.Done():
			return
		case <-c.outputs:
		case <-tick.C:
		}
	}
}

// ensureClasses creates the GatewayClasses served without an object when
// they do not exist, as Istio creates its own (its ClassController); one
// that exists, whoever made it, is left alone.
func (c *Controller) ensureClasses(ctx context.Context) {
	api := c.o.Client.GatewayV1().GatewayClasses()
	for _, name := range slices.Sorted(maps.Keys(c.o.Classes)) {
		gc := &gw.GatewayClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: gw.GatewayClassSpec{
				ControllerName: c.o.Classes[name],
				Description:    new("Served by Flotilla (" + string(c.o.Classes[name]) + ")"),
			},
		}
		if _, err := api.Create(ctx, gc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
			c.o.Log.Warn("creating a GatewayClass", "class", name, "error", err)
		}
	}
}

// redeploy asks the leader for a deployment round soon.
func (c *Controller) redeploy() {
	select {
	case c.outputs <- struct{}{}:
	default:
	}
}

// deploy applies the deployable Gateways' deployments.
func (c *Controller) deploy(ctx context.Context, d *deployer) {
	c.mu.Lock()
	l, cms := c.listers, c.cms
	c.mu.Unlock()
	if l == nil {
		return
	}
	get, read := cms.reading("deployment")
	gateways := c.deployInputs(l, get, cms)
	read()
	if err := d.deploy(ctx, c, gateways); err != nil && ctx.Err() == nil {
		c.o.Log.Warn("deploying the gateways; retrying", "error", err)
	}
}

// writeStatus writes every status that differs from the object's. A
// write changes the object, which converts again to the same status: the
// conditions keep their transition time when nothing changed, so it
// stops there.
func (c *Controller) writeStatus(ctx context.Context) {
	c.mu.Lock()
	out, l := c.latest, c.listers
	c.mu.Unlock()
	if out == nil || l == nil {
		return
	}
	api := c.o.Client.GatewayV1()
	var errs []error
	opts := metav1.UpdateOptions{}
	for name, st := range out.GatewayClasses {
		errs = append(errs, writeStatus(st, func() (*gw.GatewayClass, error) { return l.classes.Get(name) },
			func(o *gw.GatewayClass) *gw.GatewayClassStatus { return &o.Status },
			func(o *gw.GatewayClass) error { _, err := api.GatewayClasses().UpdateStatus(ctx, o, opts); return err }))
	}
	for ref, st := range out.Gateways {
		errs = append(errs, writeStatus(st, func() (*gw.Gateway, error) { return l.gateways.Gateways(ref.Namespace).Get(ref.Name) },
			func(o *gw.Gateway) *gw.GatewayStatus { return &o.Status },
			func(o *gw.Gateway) error {
				_, err := api.Gateways(ref.Namespace).UpdateStatus(ctx, o, opts)
				return err
			}))
	}
	for ref, st := range out.Routes {
		errs = append(errs, l.writeRoute(ctx, api, ref, st))
	}
	for ref, st := range out.Policies {
		errs = append(errs, l.writePolicy(ctx, api, ref, st))
	}
	for ref, st := range out.ListenerSets {
		errs = append(errs, l.writeListenerSet(ctx, api, ref, st))
	}
	if err := errors.Join(errs...); err != nil && ctx.Err() == nil {
		c.o.Log.Warn("writing the Gateway API's status; retrying", "error", err)
	}
}
