package kubesource

import (
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// This file publishes the credentials: the Secrets that a Gateway's or a
// DestinationRule's tls.credentialName names, in the object's own
// namespace (and "<name>-cacert" beside them), as Istio reads them. A
// Secret nothing names is never published, whatever it holds.

// credentialKeys are the Secret keys a credential is read from, as Istio
// reads kubernetes.io/tls and generic Secrets.
var credentialKeys = []string{"tls.crt", "tls.key", "ca.crt", "cert", "key", "cacert"}

// trimSecret keeps only a Secret's identity and its credential keys: no
// annotations (kubectl's last-applied copy holds the data), no other data.
func trimSecret(obj any) (any, error) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil // a tombstone: keep as is
	}
	out := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: sec.Name, Namespace: sec.Namespace, ResourceVersion: sec.ResourceVersion},
		Type:       sec.Type,
	}
	for _, k := range credentialKeys {
		if v, ok := sec.Data[k]; ok {
			if out.Data == nil {
				out.Data = map[string][]byte{}
			}
			out.Data[k] = v
		}
	}
	return out, nil
}

// secretHandler keeps the Secrets the informer sees (trimmed), and
// publishes the named ones.
func (s *Source) secretHandler() cache.ResourceEventHandler {
	upsert := func(obj any) {
		sec, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		key := sec.Namespace + "/" + sec.Name
		s.mu.Lock()
		defer s.mu.Unlock()
		s.secrets[key] = sec
		s.syncCredential(key)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    upsert,
		UpdateFunc: func(_, obj any) { upsert(obj) },
		DeleteFunc: func(obj any) {
			m, err := metaOf(unwrap(obj))
			if err != nil {
				return
			}
			key := m.GetNamespace() + "/" + m.GetName()
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.secrets, key)
			s.syncCredential(key)
		},
	}
}

// refreshCredentialRefs records what a Gateway or DestinationRule names
// now (o; nil when deleted), and publishes or withdraws the Secrets whose
// naming changed. Called with s.mu held.
func (s *Source) refreshCredentialRefs(id istio.ID, o *istio.Object) {
	var now []string
	if o != nil {
		for _, n := range credentialNames(o) {
			now = append(now, o.Meta.Namespace+"/"+n)
		}
	}
	before := s.credRefsBy[id]
	if len(now) == 0 {
		delete(s.credRefsBy, id)
	} else {
		s.credRefsBy[id] = now
	}
	for _, k := range before {
		if s.credRefs[k]--; s.credRefs[k] <= 0 {
			delete(s.credRefs, k)
		}
	}
	for _, k := range now {
		s.credRefs[k]++
	}
	for _, k := range append(before, now...) {
		s.syncCredential(k)
	}
}

// syncCredential publishes the credential of a Secret that is named and
// holds one, and withdraws it otherwise. Called with s.mu held.
func (s *Source) syncCredential(key string) {
	name := key
	sec := s.secrets[key]
	var cred *registryv1.Credential
	if s.credRefs[key] > 0 && sec != nil {
		cred = credential(sec)
	}
	switch {
	case cred != nil:
		s.credPublished[name] = true
		s.publish(registry.CredentialTypeURL, name, cred)
	case s.credPublished[name]:
		delete(s.credPublished, name)
		s.remove(registry.CredentialTypeURL, name)
	}
}

// credential reads a Secret's key material: tls.crt/tls.key/ca.crt, else
// cert/key/cacert. nil when it holds none.
func credential(sec *corev1.Secret) *registryv1.Credential {
	pick := func(keys ...string) []byte {
		for _, k := range keys {
			if v := sec.Data[k]; len(v) > 0 {
				return v
			}
		}
		return nil
	}
	c := &registryv1.Credential{
		Namespace: sec.Namespace, Name: sec.Name,
		CertificateChain: pick("tls.crt", "cert"), PrivateKey: pick("tls.key", "key"), CaCertificates: pick("ca.crt", "cacert"),
	}
	if len(c.CertificateChain) == 0 && len(c.CaCertificates) == 0 {
		return nil
	}
	return c
}

// credentialNames are the Secrets an object names, in its namespace:
// each server's credentialName of a Gateway (and "<name>-cacert" for
// MUTUAL and OPTIONAL_MUTUAL servers, where Istio looks for the CA), each
// tls.credentialName of a DestinationRule. A "kubernetes://" prefix is
// dropped; a name with a namespace of its own is left out (a Secret of
// another namespace is never served).
func credentialNames(o *istio.Object) []string {
	var out []string
	add := func(n string, mutual bool) {
		n = strings.TrimPrefix(n, registry.CredentialPrefix)
		if n == "" || strings.Contains(n, "/") {
			return
		}
		out = append(out, n)
		if mutual {
			out = append(out, n+"-cacert")
		}
	}
	switch spec := o.Spec.(type) {
	case *networking.Gateway:
		for _, srv := range spec.GetServers() {
			t := srv.GetTls()
			mutual := t.GetMode() == networking.ServerTLSSettings_MUTUAL || t.GetMode() == networking.ServerTLSSettings_OPTIONAL_MUTUAL
			add(t.GetCredentialName(), mutual)
			for _, n := range t.GetCredentialNames() {
				add(n, mutual)
			}
		}
	case *networking.DestinationRule:
		policies := []*networking.TrafficPolicy{spec.GetTrafficPolicy()}
		for _, ss := range spec.GetSubsets() {
			policies = append(policies, ss.GetTrafficPolicy())
		}
		for _, p := range policies {
			add(p.GetTls().GetCredentialName(), false)
			for _, pl := range p.GetPortLevelSettings() {
				add(pl.GetTls().GetCredentialName(), false)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
