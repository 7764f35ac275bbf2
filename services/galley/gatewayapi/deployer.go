package gatewayapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	gw "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
	"github.com/flotilla-mesh/flotilla/internal/inject"
)

// fieldManager is the server-side apply manager of the objects galley
// deploys for Gateways.
const fieldManager = "flotilla-gateway-controller"

// deployer applies the deployment of every deployable Gateway of a served
// class (gatewayapi.Deploy) with server-side apply, as Istio's
// DeploymentController does: only fields it sets are its own, so another
// controller's additions (an HPA's replicas, an annotation) stay, and an
// object that exists without gatewayapi.LabelManaged is never touched.
// It runs on the leader only.
type deployer struct {
	kube kubernetes.Interface

	// managed are the objects carrying LabelManaged, by
	// "Kind/namespace/name": what is known to exist and be ours.
	managed map[string]cache.Store

	mu sync.Mutex
	// applied is what was last applied, by "Kind/namespace/name"; an
	// object is applied again when its rendering changes or it is gone.
	applied map[string][]byte
	// refused are the objects left alone because they are not ours,
	// logged once each.
	refused map[string]bool
}

// deployedKinds are the kinds a deployment is made of, with their
// managed-object informers.
var deployedKinds = []string{"ServiceAccount", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}

func newDeployer(kube kubernetes.Interface) *deployer {
	return &deployer{kube: kube, managed: map[string]cache.Store{}, applied: map[string][]byte{}, refused: map[string]bool{}}
}

// watch starts informers on the objects with LabelManaged (a label
// selector: only the gateways' objects are held); a deletion or a
// Deployment whose spec another hand changed is applied again.
func (d *deployer) watch(ctx context.Context, changed func()) error {
	f := informers.NewSharedInformerFactoryWithOptions(d.kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = gatewayapi.LabelManaged
	}))
	infs := map[string]cache.SharedIndexInformer{
		"ServiceAccount":          f.Core().V1().ServiceAccounts().Informer(),
		"Deployment":              f.Apps().V1().Deployments().Informer(),
		"Service":                 f.Core().V1().Services().Informer(),
		"HorizontalPodAutoscaler": f.Autoscaling().V2().HorizontalPodAutoscalers().Informer(),
		"PodDisruptionBudget":     f.Policy().V1().PodDisruptionBudgets().Informer(),
	}
	for _, kind := range deployedKinds {
		inf := infs[kind]
		forget := func(obj any) {
			if m, err := meta(obj); err == nil {
				d.mu.Lock()
				delete(d.applied, kind+"/"+m.GetNamespace()+"/"+m.GetName())
				d.mu.Unlock()
				changed()
			}
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			DeleteFunc: forget,
			UpdateFunc: func(old, cur any) {
				o, ok1 := old.(*appsv1.Deployment)
				n, ok2 := cur.(*appsv1.Deployment)
				if ok1 && ok2 && o.Generation != n.Generation {
					forget(cur)
				}
			},
		}); err != nil {
			return fmt.Errorf("watch the gateways' %ss: %w", kind, err)
		}
		d.managed[kind] = inf.GetStore()
	}
	f.Start(ctx.Done())
	for _, inf := range infs {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return ctx.Err()
		}
	}
	return nil
}

func meta(obj any) (metav1.Object, error) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("not an object: %T", obj)
	}
	return m, nil
}

// deployInput is one Gateway with what its deployment is rendered from.
type deployInput struct {
	gatewayapi.DeployInput
	// missing is why the Gateway cannot be rendered ("" when it can).
	missing string
}

// deploy applies the deployments; a failure is retried on the next
// round, a Gateway that cannot be rendered is logged and skipped.
func (d *deployer) deploy(ctx context.Context, c *Controller, gateways []deployInput) error {
	var errs []error
	rendered := map[string]bool{}
	defer func() {
		// Forget what no Gateway renders any more.
		d.mu.Lock()
		defer d.mu.Unlock()
		for key := range d.applied {
			if !rendered[key] {
				delete(d.applied, key)
			}
		}
		for key := range d.refused {
			if !rendered[key] {
				delete(d.refused, key)
			}
		}
	}()
	for _, in := range gateways {
		g := in.Gateway
		log := c.o.Log.With("gateway", g.Namespace+"/"+g.Name)
		if in.missing != "" {
			log.Warn("not deploying the gateway", "reason", in.missing)
			continue
		}
		objs, err := gatewayapi.Deploy(in.DeployInput)
		if err != nil {
			log.Warn("not deploying the gateway: its deployment does not render", "error", err)
			continue
		}
		for _, o := range objs {
			rendered[kindOf(o)+"/"+o.GetNamespace()+"/"+o.GetName()] = true
			errs = append(errs, d.apply(ctx, c, o))
		}
	}
	return errors.Join(errs...)
}

// apply server-side applies one object unless it is unchanged since the
// last apply, or exists without being ours.
func (d *deployer) apply(ctx context.Context, c *Controller, o metav1.Object) error {
	kind := kindOf(o)
	key := kind + "/" + o.GetNamespace() + "/" + o.GetName()
	body, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	_, ours, _ := d.managed[kind].GetByKey(o.GetNamespace() + "/" + o.GetName())
	d.mu.Lock()
	same := ours && slices.Equal(d.applied[key], body)
	d.mu.Unlock()
	if same {
		return nil
	}
	if !ours {
		exists, err := d.exists(ctx, kind, o.GetNamespace(), o.GetName())
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if exists {
			d.mu.Lock()
			first := !d.refused[key]
			d.refused[key] = true
			d.mu.Unlock()
			if first {
				c.o.Log.Warn("not deploying over an object the gateway controller did not make", "object", key, "missing_label", gatewayapi.LabelManaged)
			}
			return nil
		}
	}
	if err := d.patch(ctx, kind, o.GetNamespace(), o.GetName(), body); err != nil {
		return fmt.Errorf("apply %s: %w", key, err)
	}
	d.mu.Lock()
	d.applied[key] = body
	delete(d.refused, key)
	d.mu.Unlock()
	c.o.Log.Info("deployed", "object", key)
	return nil
}

// kindOf is a rendered object's kind (gatewayapi.Deploy sets it).
func kindOf(o metav1.Object) string {
	if r, ok := o.(runtime.Object); ok {
		return r.GetObjectKind().GroupVersionKind().Kind
	}
	return ""
}

func (d *deployer) patch(ctx context.Context, kind, ns, name string, body []byte) error {
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: new(true)}
	var err error
	switch kind {
	case "ServiceAccount":
		_, err = d.kube.CoreV1().ServiceAccounts(ns).Patch(ctx, name, types.ApplyPatchType, body, opts)
	case "Deployment":
		_, err = d.kube.AppsV1().Deployments(ns).Patch(ctx, name, types.ApplyPatchType, body, opts)
	case "Service":
		_, err = d.kube.CoreV1().Services(ns).Patch(ctx, name, types.ApplyPatchType, body, opts)
	case "HorizontalPodAutoscaler":
		_, err = d.kube.AutoscalingV2().HorizontalPodAutoscalers(ns).Patch(ctx, name, types.ApplyPatchType, body, opts)
	case "PodDisruptionBudget":
		_, err = d.kube.PolicyV1().PodDisruptionBudgets(ns).Patch(ctx, name, types.ApplyPatchType, body, opts)
	default:
		return fmt.Errorf("unexpected kind %q", kind)
	}
	return err
}

// exists reports whether an object is there, ours or not.
func (d *deployer) exists(ctx context.Context, kind, ns, name string) (bool, error) {
	opts := metav1.GetOptions{}
	var err error
	switch kind {
	case "ServiceAccount":
		_, err = d.kube.CoreV1().ServiceAccounts(ns).Get(ctx, name, opts)
	case "Deployment":
		_, err = d.kube.AppsV1().Deployments(ns).Get(ctx, name, opts)
	case "Service":
		_, err = d.kube.CoreV1().Services(ns).Get(ctx, name, opts)
	case "HorizontalPodAutoscaler":
		_, err = d.kube.AutoscalingV2().HorizontalPodAutoscalers(ns).Get(ctx, name, opts)
	case "PodDisruptionBudget":
		_, err = d.kube.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, name, opts)
	default:
		return false, fmt.Errorf("unexpected kind %q", kind)
	}
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// deployInputs are the deployable Gateways of the served classes, each
// with its class's controller, its revision's injection values and its
// overlays (Istio's Reconcile and configureIstioGateway).
func (c *Controller) deployInputs(l *listers, get func(ns, name string) (map[string]string, bool), cms *configMaps) []deployInput {
	if l.gateways == nil {
		return nil
	}
	gws, _ := l.gateways.List(labels.Everything())
	sortByKey(gws)
	var sets []*gw.ListenerSet
	if l.sets != nil {
		sets, _ = l.sets.List(labels.Everything())
	}
	setsByParent := gatewayapi.ListenerSetsByParent(sets)
	namespaces := c.o.Cluster().Namespaces()
	namespaceLabels := func(ns string) (map[string]string, bool) {
		l, ok := namespaces[ns]
		return l, ok
	}
	var out []deployInput
	for _, g := range gws {
		ctl, ok := c.classController(l, string(g.Spec.GatewayClassName))
		if !ok {
			continue
		}
		if ok, _ := gatewayapi.Deployable(g); !ok {
			continue
		}
		in := deployInput{DeployInput: gatewayapi.DeployInput{Gateway: g, Controller: ctl}}
		in.ListenerSets, _ = gatewayapi.AllowedListenerSets(g, setsByParent, namespaceLabels)
		rev := g.Labels[controlplane.RevisionLabel]
		if rev == "" {
			rev = controlplane.DefaultRevision
		}
		v, ok := c.o.Injection(rev)
		switch {
		case ok:
			in.Values = v
		case rev == controlplane.DefaultRevision:
			in.Values = inject.DefaultValues()
		default:
			in.missing = "revision " + rev + " has no injection configuration"
		}
		in.ClassDefaults = cms.classDefaults(c.o.SystemNamespace, string(g.Spec.GatewayClassName))
		if inf := g.Spec.Infrastructure; inf != nil && inf.ParametersRef != nil {
			p := inf.ParametersRef
			data, found := get(g.Namespace, p.Name)
			switch {
			case p.Group != "" || p.Kind != "ConfigMap":
				in.missing = fmt.Sprintf("parametersRef %s/%s is not a ConfigMap", p.Group, p.Kind)
			case !found:
				in.missing = "parametersRef ConfigMap " + g.Namespace + "/" + p.Name + " does not exist"
			}
			in.Parameters = data
		}
		out = append(out, in)
	}
	return out
}

// classController is the controllerName of a class this controller
// serves: the GatewayClass object's, or a built-in class's.
func (c *Controller) classController(l *listers, class string) (gw.GatewayController, bool) {
	var ctl gw.GatewayController
	if l.classes != nil {
		if gc, err := l.classes.Get(class); err == nil {
			ctl = gc.Spec.ControllerName
		}
	}
	if ctl == "" {
		ctl = c.o.Classes[class]
	}
	return ctl, ctl != "" && slices.Contains(c.o.Controllers, ctl)
}
