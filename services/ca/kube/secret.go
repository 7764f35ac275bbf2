package kube

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-mesh/flotilla/services/ca/authority"
	"github.com/flotilla-mesh/flotilla/services/ca/store"
)

// Secret names, as Istio has them.
const (
	// PluggedSecret holds a plugged-in CA (ca-cert.pem, ca-key.pem,
	// cert-chain.pem, root-cert.pem).
	PluggedSecret = "cacerts"
	// SelfSignedSecret holds the self-signed root ca creates.
	SelfSignedSecret = "istio-ca-secret"
)

// Material loads the signing material from the control-plane namespace:
// the cacerts Secret when it exists, else the self-signed root in
// istio-ca-secret, which the first replica creates; replicas that start
// together converge on the one the apiserver accepted first.
func Material(ctx context.Context, client kubernetes.Interface, ns string, keyType authority.KeyType, org string, now time.Time) (*store.Material, error) {
	secrets := client.CoreV1().Secrets(ns)
	plugged, err := secrets.Get(ctx, PluggedSecret, metav1.GetOptions{})
	switch {
	case err == nil:
		d := plugged.Data
		return &store.Material{
			Signer: d[store.PluggedCert], Key: d[store.PluggedKey], Chain: d[store.PluggedChain], Roots: d[store.PluggedRoot], Plugged: true,
		}, nil
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("secret %s/%s: %w", ns, PluggedSecret, err)
	}
	s, err := secrets.Get(ctx, SelfSignedSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cert, key, gerr := authority.NewRoot(keyType, org, now)
		if gerr != nil {
			return nil, gerr
		}
		s, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: SelfSignedSecret, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/managed-by": "flotilla-ca"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{store.PluggedCert: cert, store.PluggedKey: key, store.PluggedRoot: cert},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			s, err = secrets.Get(ctx, SelfSignedSecret, metav1.GetOptions{}) // another replica won: use its root
		}
	}
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s: %w", ns, SelfSignedSecret, err)
	}
	d := s.Data
	if len(d[store.PluggedCert]) == 0 || len(d[store.PluggedKey]) == 0 {
		return nil, fmt.Errorf("secret %s/%s: no %s or %s", ns, SelfSignedSecret, store.PluggedCert, store.PluggedKey)
	}
	roots := d[store.PluggedRoot]
	if len(roots) == 0 {
		roots = d[store.PluggedCert]
	}
	return &store.Material{Signer: d[store.PluggedCert], Key: d[store.PluggedKey], Roots: roots}, nil
}
