package translate

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/flotilla-mesh/flotilla/internal/registry"
)

// Secrets returns the SDS secrets named that the proxy may have, sorted;
// SDS is asked by name only, so nil names gets none. They are the
// Secrets a Gateway's (or DestinationRule's) credentialName names, as
// Istio's SDS serves them: "kubernetes://<name>" (or
// "kubernetes://<namespace>/<name>") the certificate chain and key of
// Secret <name>, "kubernetes://<name>-cacert" its CA certificates (its
// ca.crt, else those of Secret <name>-cacert).
//
// A proxy gets only the Secrets of the namespace of its verified client
// certificate (Istio's lesson from CVE-2021-34824): none over a
// connection without one, none of another namespace whatever it asks
// but what a ReferenceGrant admits (below).
// A credentialName Secret also needs the proxy's service account to be
// allowed to read it (model.Proxy.SecretsRefused; Istio's
// CredentialsController.Authorize), which when refused is a problem
// reported. A Gateway API certificateRef ("kubernetes-gateway://") needs
// instead that a Gateway of the proxy's namespace selecting it name it,
// for a Secret of that namespace or of another whose ReferenceGrant
// admits it (flavour.gatewayCredentials; Istio's
// VerifiedCertificateReferences, checked so in its SecretGen for that
// type): the Gateway API's own rules, not RBAC, govern it, so a gateway
// deployed for a Gateway needs no Role. A CA certificate in a ConfigMap
// ("configmap://<namespace>/<name>-cacert", Istio's
// KubernetesConfigMapType: a Gateway's frontend validation, a
// BackendTLSPolicy's CA) is public, served to any proxy of any namespace
// as Istio's filterAuthorizedResources does (a client reads its server's
// CA across namespaces), from the ca.crt galley published; galley
// publishes only the ConfigMaps a Gateway API object names.
func (x *Generator) Secrets(names []string) []*tlsv3.Secret {
	g := x.g
	ns := g.p.VerifiedNamespace
	if ns == "" || len(names) == 0 {
		return nil
	}
	var out []*tlsv3.Secret
	var verified map[string]bool
	refusedReported := false
	for _, name := range uniqueSorted(names) {
		if rest, ok := strings.CutPrefix(name, registry.ConfigMapCredentialPrefix); ok {
			sns, sname, qualified := strings.Cut(rest, "/")
			base, isCA := strings.CutSuffix(sname, credentialCASuffix)
			if !qualified || !isCA {
				continue
			}
			if ca := g.pc.ConfigMapCACertificates(sns, base); len(ca) > 0 {
				out = append(out, caSecret(name, ca))
			}
			continue
		}
		if rest, ok := strings.CutPrefix(name, registry.GatewayCredentialPrefix); ok {
			if verified == nil {
				verified = g.fl.gatewayCredentials(g)
			}
			sns, sname, qualified := strings.Cut(rest, "/")
			if !qualified || !verified[name] {
				continue
			}
			if s := g.credentialSecret(name, sns, sname); s != nil {
				out = append(out, s)
			}
			continue
		}
		rest, ok := strings.CutPrefix(name, registry.CredentialPrefix)
		if !ok {
			continue
		}
		if why := g.p.SecretsRefused(); why != "" {
			if !refusedReported {
				g.problem("credentials withheld: %s", why)
				refusedReported = true
			}
			continue
		}
		if sns, sname, qualified := strings.Cut(rest, "/"); qualified {
			if sns != ns {
				continue
			}
			rest = sname
		}
		if s := g.credentialSecret(name, ns, rest); s != nil {
			out = append(out, s)
		}
	}
	return out
}

func (g *gen) credentialSecret(name, ns, cred string) *tlsv3.Secret {
	if c := g.pc.Credential(ns, cred); c != nil && len(c.GetCertificateChain()) > 0 && len(c.GetPrivateKey()) > 0 {
		return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inlineBytes(c.GetCertificateChain()),
			PrivateKey:       inlineBytes(c.GetPrivateKey()),
		}}}
	}
	base, ok := strings.CutSuffix(cred, credentialCASuffix)
	if !ok {
		return nil
	}
	var ca []byte
	if c := g.pc.Credential(ns, base); c != nil && len(c.GetCaCertificates()) > 0 {
		ca = c.GetCaCertificates()
	} else if c := g.pc.Credential(ns, cred); c != nil {
		// A separate "<name>-cacert" Secret: its ca.crt, else its cert.
		ca = c.GetCaCertificates()
		if len(ca) == 0 {
			ca = c.GetCertificateChain()
		}
	}
	if len(ca) == 0 {
		return nil
	}
	return caSecret(name, ca)
}

// caSecret is an SDS secret of CA certificates that validate peers.
func caSecret(name string, ca []byte) *tlsv3.Secret {
	return &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: inlineBytes(ca),
	}}}
}

func inlineBytes(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}
