package kubesource

import (
	"bytes"
	"slices"
	"strings"

	extensions "istio.io/api/extensions/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	registryv1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/registry/v1"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// This file publishes the credentials: the Secrets that a Gateway's or a
// DestinationRule's tls.credentialName names (and "<name>-cacert" beside
// them), and a WasmPlugin's or TrafficExtension's imagePullSecret, as
// Istio reads them. A name is looked up in every namespace: as
// in Istio, a gateway reads the Secret of that name in its own
// namespace, which need not be the Gateway resource's, and discovery
// serves each Secret only to proxies of its namespace. A Secret whose
// name nothing names is never published, whatever it holds.

// credentialKeys are the Secret keys a credential is read from, as Istio
// reads kubernetes.io/tls and generic Secrets, and the registry
// credentials of a kubernetes.io/dockerconfigjson Secret.
var credentialKeys = []string{"tls.crt", "tls.key", "ca.crt", "cert", "key", "cacert", corev1.DockerConfigJsonKey}

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
	upsert := func(sec *corev1.Secret) {
		key := sec.Namespace + "/" + sec.Name
		s.mu.Lock()
		defer s.mu.Unlock()
		s.secrets[key] = sec
		s.syncCredential(key)
		s.clusterChanged()
	}
	return handler(upsert, func(sec *corev1.Secret) {
		key := sec.Namespace + "/" + sec.Name
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.secrets, key)
		s.syncCredential(key)
		s.clusterChanged()
	})
}

// GeneratedChanged records the credentials the Gateways generated from the
// Gateway API name (they are published beside this source's objects, not
// through it), so that the Secrets they name are published.
func (s *Source) GeneratedChanged(upserts []*istio.Object, deletes []istio.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range upserts {
		if namesCredentials(o.Kind.Kind) {
			s.refreshCredentialRefs(o.ID(), o)
		}
	}
	for _, id := range deletes {
		if namesCredentials(id.Kind) {
			s.refreshCredentialRefs(id, nil)
		}
	}
}

// ConfigMapCAsChanged publishes the CA certificates of the ConfigMaps the
// Gateway API's listeners validate clients with (the conversion's
// gatewayapi.Output.ConfigMapCAs: "namespace/name" → ca.crt, read and
// checked by the conversion) as Credentials with config_map, named
// registry.ConfigMapCredentialName, and withdraws those no listener reads
// any more. Only what changed is sent.
func (s *Source) ConfigMapCAsChanged(cas map[string][]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, pem := range cas {
		if old, ok := s.caPublished[key]; ok && bytes.Equal(old, pem) {
			continue
		}
		ns, name, _ := strings.Cut(key, "/")
		s.caPublished[key] = pem
		s.publish(registry.CredentialTypeURL, registry.ConfigMapCredentialName(ns, name),
			&registryv1.Credential{Namespace: ns, Name: name, CaCertificates: pem, ConfigMap: true})
	}
	for key := range s.caPublished {
		if _, ok := cas[key]; !ok {
			delete(s.caPublished, key)
			ns, name, _ := strings.Cut(key, "/")
			s.remove(registry.CredentialTypeURL, registry.ConfigMapCredentialName(ns, name))
		}
	}
}

// refreshCredentialRefs records what a Gateway or DestinationRule names
// now (o; nil when deleted), and publishes or withdraws the Secrets whose
// naming changed. Called with s.mu held.
func (s *Source) refreshCredentialRefs(id istio.ID, o *istio.Object) {
	var now []string
	if o != nil {
		now = credentialNames(o)
	}
	before := s.credRefsBy[id]
	if len(now) == 0 {
		delete(s.credRefsBy, id)
	} else {
		s.credRefsBy[id] = now
	}
	changed := map[string]bool{}
	for _, n := range before {
		if s.credRefs[n]--; s.credRefs[n] <= 0 {
			delete(s.credRefs, n)
			changed[n] = true
		}
	}
	for _, n := range now {
		if s.credRefs[n]++; s.credRefs[n] == 1 {
			changed[n] = true
		}
	}
	if len(changed) == 0 {
		return
	}
	for key, sec := range s.secrets {
		if changed[sec.Name] {
			s.syncCredential(key)
		}
	}
	for key := range s.credPublished {
		if _, name, _ := strings.Cut(key, "/"); changed[name] {
			s.syncCredential(key)
		}
	}
}

// syncCredential publishes the credential of a Secret ("namespace/name")
// whose name is named and that holds one, and withdraws it otherwise.
// Called with s.mu held.
func (s *Source) syncCredential(key string) {
	sec := s.secrets[key]
	var cred *registryv1.Credential
	if sec != nil && s.credRefs[sec.Name] > 0 {
		cred = credential(sec)
	}
	switch {
	case cred != nil:
		s.credPublished[key] = true
		s.publish(registry.CredentialTypeURL, key, cred)
	case s.credPublished[key]:
		delete(s.credPublished, key)
		s.remove(registry.CredentialTypeURL, key)
	}
}

// credential reads a Secret's key material: tls.crt/tls.key/ca.crt, else
// cert/key/cacert, and the registry credentials of a
// kubernetes.io/dockerconfigjson Secret (Istio's GetDockerCredential
// reads no other type). nil when it holds none.
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
	if sec.Type == corev1.SecretTypeDockerConfigJson {
		c.DockerConfig = pick(corev1.DockerConfigJsonKey)
	}
	if len(c.CertificateChain) == 0 && len(c.CaCertificates) == 0 && len(c.DockerConfig) == 0 {
		return nil
	}
	return c
}

// namesCredentials reports whether objects of a kind may name Secrets
// (credentialNames).
func namesCredentials(kind string) bool {
	switch kind {
	case istio.Gateway, istio.DestinationRule, istio.WasmPlugin, istio.TrafficExtension:
		return true
	}
	return false
}

// credentialNames are the Secret names an object names: each server's
// credentialName of a Gateway (and "<name>-cacert" for MUTUAL and
// OPTIONAL_MUTUAL servers, where Istio looks for the CA), each
// tls.credentialName of a DestinationRule, the imagePullSecret of a
// WasmPlugin or TrafficExtension. A "kubernetes://" prefix is dropped; a
// name with a namespace of its own is left out (a proxy only ever gets
// its own namespace's Secrets, and Istio reads a module's pull secret in
// the extension's namespace).
func credentialNames(o *istio.Object) []string {
	var out []string
	add := func(n string, mutual bool) {
		n = strings.TrimPrefix(n, registry.CredentialPrefix)
		// The Gateway API's "kubernetes-gateway://<namespace>/<name>":
		// the name (a proxy gets only its own namespace's Secrets).
		if rest, ok := strings.CutPrefix(n, registry.GatewayCredentialPrefix); ok {
			_, n, _ = strings.Cut(rest, "/")
		}
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
			// The Gateway API's frontend CA, "<secret>-cacert": the
			// Secret's ca.crt.
			if ca, ok := strings.CutSuffix(t.GetCaCertCredentialName(), "-cacert"); ok && strings.HasPrefix(ca, registry.GatewayCredentialPrefix) {
				add(ca, false)
			}
		}
	case *extensions.WasmPlugin:
		add(spec.GetImagePullSecret(), false)
	case *extensions.TrafficExtension:
		add(spec.GetWasm().GetImagePullSecret(), false)
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
