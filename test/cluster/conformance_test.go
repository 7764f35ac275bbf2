package cluster_test

import (
	"context"
	"io/fs"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1alpha2 "sigs.k8s.io/gateway-api/apis/v1alpha2"
	gwv1alpha3 "sigs.k8s.io/gateway-api/apis/v1alpha3"
	gwv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	"sigs.k8s.io/gateway-api/conformance"
	conformancetests "sigs.k8s.io/gateway-api/conformance/tests"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"
)

// statusConformance are the Gateway API conformance tests (module
// sigs.k8s.io/gateway-api/conformance v1.6.3, the release of the CRDs the
// chart installs) whose every assertion is on the status the controller
// writes: they run here unchanged, through the suite itself. Every other
// conformance test of a feature Flotilla serves also sends traffic
// through the gateway's Envoy, which cannot run here:
// docs/gateway-api-conformance.md lists them and how to run the whole
// suite against a real cluster.
var statusConformance = []string{
	"BackendTLSPolicyObservedGenerationBump",
	"GatewayClassObservedGenerationBump",
	"GatewayInfrastructureMetadata",
	"GatewayInvalidParametersRef",
	"GatewayInvalidRouteKind",
	"GatewayInvalidTLSConfiguration",
	"GatewayListenerUnsupportedProtocol",
	"GatewayModifyListeners",
	"GatewayObservedGenerationBump",
	"GatewayOptionalAddressValue",
	"GatewaySecretInvalidReferenceGrant",
	"GatewaySecretMissingReferenceGrant",
	"GatewaySecretReferenceGrantAllInNamespace",
	"GatewaySecretReferenceGrantSpecific",
	"GatewayStaticAddresses",
	"GatewayWithAttachedRoutes",
	"GatewayWithAttachedRoutesWithPort8080",
	"GatewayInvalidFrontendClientCertificateValidation",
	"HTTPRouteDisallowedKind",
	"HTTPRouteInvalidCrossNamespaceParentRef",
	"HTTPRouteInvalidParentRefNotMatchingListenerPort",
	"HTTPRouteInvalidParentRefNotMatchingSectionName",
	"HTTPRouteInvalidParentRefSectionNameNotMatchingPort",
	"HTTPRouteObservedGenerationBump",
	"ListenerSetAllowedNamespaceNone",
	"ListenerSetAllowedNamespaceSame",
	"ListenerSetAllowedNamespaceSelector",
	"ListenerSetAllowedRoutesSupportedKinds",
	"ListenerSetDefaultNotAllowed",
	"ListenerSetHostnameConflict",
	"ListenerSetProtocolConflict",
	"ListenerSetReferenceGrant",
	"ListenerSetRouteStatusScopedToParentRef",
	"TCPRouteInvalidBackendRefNonexistent",
	"TCPRouteInvalidCrossNamespaceBackendRef",
	"TCPRouteInvalidNonTCPListener",
	"TLSRouteInvalidNoMatchingListenerHostname",
	"TLSRouteInvalidNoMatchingListener",
	"TLSRouteInvalidReferenceGrant",
	"TLSRouteListenerMixedTerminationNotSupported",
	"TLSRouteListenerPassthroughSupportedKinds",
	"TLSRouteListenerTerminateNotSupported",
	"TLSRouteListenerTerminateSupportedKinds",
}

// unsupportedFeatures are the features of the release Flotilla does not
// serve: those Istio 1.32 leaves out (pilot/pkg/config/kube/gateway's
// skippedExtendedFeatures), and the mesh, whose conformance tests all
// send traffic.
var unsupportedFeatures = []features.Feature{
	features.GatewayBackendClientCertificateFeature,
	features.GatewayHTTPSListenerDetectMisdirectedRequestsFeature,
	features.UDPRouteFeature,
}

// gatewayConformance: the Gateway API's own conformance suite, with its
// base manifests (backends, Gateways of every kind, the certificates it
// makes), applies each test's YAML to the cluster and polls the status
// galley's leader writes until it is what the test expects. Gateways of
// Flotilla's class are deployed by galley as any other; the class's
// defaults ConfigMap makes their Services ClusterIP, since there is no
// load balancer here, as a user without one does.
func gatewayConformance(t testing.TB, ctx context.Context, _ *controlPlane) { //nolint:thelper // a step: the subtest of its own
	tt, ok := t.(*testing.T)
	if !ok {
		t.Fatal("the conformance suite runs as a test")
	}
	if _, err := env.Client.CoreV1().ConfigMaps(systemNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "flotilla-gateway-class-defaults", Labels: map[string]string{"gateway.istio.io/defaults-for-class": "flotilla"}},
		Data:       map[string]string{"service": "spec:\n  type: ClusterIP\n"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A scheme of its own: client-go's global one is read by the other
	// clients of the test as it runs.
	scheme := runtime.NewScheme()
	for _, install := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, gwv1.Install, gwv1beta1.Install, gwv1alpha2.Install, gwv1alpha3.Install, apiextv1.AddToScheme} {
		if err := install(scheme); err != nil {
			t.Fatal(err)
		}
	}
	options := client.Options{Scheme: scheme}
	c, err := client.New(env.Config, options)
	if err != nil {
		t.Fatal(err)
	}

	supported := features.SetsToNamesSet(features.AllFeatures.Clone().
		Delete(unsupportedFeatures...).
		Delete(features.MeshCoreFeatures.UnsortedList()...).
		Delete(features.MeshExtendedFeatures.UnsortedList()...))
	var run []suite.ConformanceTest
	for _, ct := range conformancetests.ConformanceTests {
		if !slices.Contains(statusConformance, ct.ShortName) {
			continue
		}
		// A test of a feature not in the set would be skipped by the
		// suite, silently: refuse it here instead.
		if missing := sets.New(ct.Features...).Difference(supported); missing.Len() > 0 {
			t.Fatalf("%s needs %v, not supported", ct.ShortName, sets.List(missing))
		}
		run = append(run, ct)
	}
	if len(run) != len(statusConformance) {
		t.Fatalf("%d of the %d tests listed are in the conformance release", len(run), len(statusConformance))
	}

	hostname := gwv1.HostnameAddressType
	cs, err := suite.NewConformanceTestSuite(suite.ConformanceOptions{
		ConfigurableOptions: suite.ConfigurableOptions{
			GatewayClassName:     "flotilla",
			CleanupBaseResources: false,
			CleanupTestResources: true,
			SupportedFeatures:    sets.List(supported),
			// A hostname address names the Service to use instead of
			// deploying one (Istio's manual deployment), as Istio's own
			// conformance run gives them.
			UsableNetworkAddresses:   []gwv1.GatewaySpecAddress{{Type: &hostname, Value: "infra-backend-v1.gateway-conformance-infra.svc.cluster.local"}},
			UnusableNetworkAddresses: []gwv1.GatewaySpecAddress{{Type: &hostname, Value: "foo"}},
			Mode:                     "default",
		},
		Client:        c,
		ClientOptions: options,
		Clientset:     env.Client,
		// The suite sets a user agent per test on the config it is given.
		RestConfig: rest.CopyConfig(env.Config),
		ManifestFS: []fs.FS{&conformance.Manifests},
	})
	if err != nil {
		t.Fatal(err)
	}
	cs.Setup(tt, run)
	if err := cs.Run(tt, run); err != nil {
		t.Fatal(err)
	}
}
