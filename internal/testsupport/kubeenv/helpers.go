package kubeenv

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// RunTests is a TestMain body: it starts an environment, stores it in *env,
// runs the package's tests and stops the environment. A failure to start is
// a test failure (exit 1) with the reason, never a skip. It adds the test
// flag -kubeenv.verbose, which streams the servers' logs:
//
//	go test ./internal/testsupport/kubeenv -args -kubeenv.verbose
func RunTests(m *testing.M, env **Env, o Options) int {
	verbose := flag.Bool("kubeenv.verbose", false, "stream kube-apiserver and etcd logs to stderr")
	flag.Parse()
	if *verbose {
		o.Verbose = true
	}
	ctx := context.Background()
	e, err := Start(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubeenv:", err)
		return 1
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "kubeenv stop:", err)
	}
	return code
}

// CreateNamespace creates a namespace named after prefix with a random
// suffix, plus its "default" ServiceAccount (which the absent
// controller-manager would create, and which Pod admission requires).
// Deleted namespaces never finish terminating here, so use a fresh one per
// test.
func (e *Env) CreateNamespace(ctx context.Context, prefix string) (string, error) {
	ns, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create namespace %s-*: %w", prefix, err)
	}
	// In a cluster the controller manager creates it too: whichever is
	// first.
	if err := e.CreateServiceAccount(ctx, ns.Name, "default"); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	return ns.Name, nil
}

// CreateServiceAccount creates a ServiceAccount.
func (e *Env) CreateServiceAccount(ctx context.Context, namespace, name string) error {
	_, err := e.Client.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create service account %s/%s: %w", namespace, name, err)
	}
	return nil
}

// CreateToken mints a ServiceAccount token (TokenRequest API) for the given
// audiences, like a projected token volume does for a pod.
func (e *Env) CreateToken(ctx context.Context, namespace, serviceAccount string, audiences []string, ttl time.Duration) (string, error) {
	secs := int64(ttl.Seconds())
	tr, err := e.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s/%s: %w", namespace, serviceAccount, err)
	}
	return tr.Status.Token, nil
}

// InstallCRDs creates (or updates) CRDs and waits until each is Established
// and its names are accepted, so that clients can use it at once.
func (e *Env) InstallCRDs(ctx context.Context, crds ...*apiextv1.CustomResourceDefinition) error {
	c, err := apiextclient.NewForConfig(e.Config)
	if err != nil {
		return fmt.Errorf("apiextensions client: %w", err)
	}
	api := c.ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range crds {
		_, err := api.Create(ctx, crd, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = e.updateCRD(ctx, c, crd)
		}
		if err != nil {
			return fmt.Errorf("install CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range crds {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			established, named := false, false
			for _, cond := range got.Status.Conditions {
				switch {
				case cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue:
					established = true
				case cond.Type == apiextv1.NamesAccepted && cond.Status == apiextv1.ConditionTrue:
					named = true
				}
			}
			return established && named, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", crd.Name, err)
		}
	}
	return nil
}

func (e *Env) updateCRD(ctx context.Context, c apiextclient.Interface, crd *apiextv1.CustomResourceDefinition) error {
	api := c.ApiextensionsV1().CustomResourceDefinitions()
	cur, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	next := crd.DeepCopy()
	next.ResourceVersion = cur.ResourceVersion
	_, err = api.Update(ctx, next, metav1.UpdateOptions{})
	return err
}

// WriteKubeconfig writes a kubeconfig for the admin credentials, for
// programs under test that take --kubeconfig.
func (e *Env) WriteKubeconfig(path string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubeenv"] = &clientcmdapi.Cluster{Server: e.Config.Host, CertificateAuthorityData: e.CA.CertPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: e.Config.BearerToken}
	cfg.Contexts["kubeenv"] = &clientcmdapi.Context{Cluster: "kubeenv", AuthInfo: "admin"}
	cfg.CurrentContext = "kubeenv"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// ClientAs is a client of the apiserver that identifies itself as
// userAgent (so requests can be told apart), its transport wrapped by wrap
// when given (to count or alter requests).
func (e *Env) ClientAs(userAgent string, wrap func(http.RoundTripper) http.RoundTripper) (kubernetes.Interface, error) {
	cfg := rest.CopyConfig(e.Config)
	cfg.UserAgent = userAgent
	if wrap != nil {
		cfg.Wrap(wrap)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client %s: %w", userAgent, err)
	}
	return c, nil
}
