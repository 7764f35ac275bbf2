// Package controlplane names Flotilla's control-plane services. Each runs
// in the system namespace (istio-system by default) under one name that is
// its Deployment's, its service account's and its Service's, as the Helm
// chart installs it; ca grants exactly these accounts certificates for
// their own Service names, and galley serves MCP to discovery's and the
// injector's.
//
// discovery and the injector run once per revision (Istio's canary
// upgrades: istiod-<revision>): the default revision's keep the plain
// name, revision r's are named <name>-r. galley and ca are shared by every
// revision.
package controlplane

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// The services' names.
const (
	Galley    = "flotilla-galley"
	Discovery = "flotilla-discovery"
	Injector  = "flotilla-injector"
	CA        = "flotilla-ca"
)

// The mesh's defaults, as Istio's: the system namespace the control plane
// runs in, the trust domain of its SPIFFE identities, and the DNS suffix
// of its Services' hostnames.
const (
	DefaultNamespace    = "istio-system"
	DefaultTrustDomain  = "cluster.local"
	DefaultDomainSuffix = "cluster.local"
	// DefaultClusterID is Istio's name of the cluster when none is given.
	DefaultClusterID = "Kubernetes"
)

// DefaultRevision is the revision of a service given none, as Istio names
// it (istio.io/rev=default).
const DefaultRevision = "default"

// MaxRevisionLength keeps every name made of a revision a valid Service
// name (63 characters): flotilla-discovery-<revision>.
const MaxRevisionLength = 40

var revisionPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// CheckRevision reports whether revision can name a revision: a DNS label
// of at most MaxRevisionLength characters, as it becomes part of object
// names and the istio.io/rev label's value.
func CheckRevision(revision string) error {
	if len(revision) > MaxRevisionLength || !revisionPattern.MatchString(revision) {
		return fmt.Errorf("revision %q: want lower-case letters, digits and '-', starting and ending with a letter or digit, at most %d characters", revision, MaxRevisionLength)
	}
	return nil
}

// RevisionLabel selects a revision (Istio's istio.io/rev): on a namespace
// or pod, which revision injects it; on Istio configuration, which
// revision's discovery uses it.
const RevisionLabel = "istio.io/rev"

// TagLabel names the revision tag (Istio's istio.io/tag) a tag's webhook
// configuration is for; its RevisionLabel names the revision the tag
// points at.
const TagLabel = "istio.io/tag"

// InRevision reports whether an object with labels is revision's, as
// istiod decides for its configuration (pkg/revisions' LabelsInRevision):
// an object without the label is every revision's; one with it is the
// named revision's only.
func InRevision(labels map[string]string, revision string) bool {
	r, ok := labels[RevisionLabel]
	return !ok || r == cmp.Or(revision, DefaultRevision)
}

// Revisioned reports whether service runs once per revision.
func Revisioned(service string) bool { return service == Discovery || service == Injector }

// Name is the name of revision's service (its Deployment, account and
// Service): the service's own name for the default revision (or none
// given), <service>-<revision> for another one.
func Name(service, revision string) string {
	if revision == "" || revision == DefaultRevision || !Revisioned(service) {
		return service
	}
	return service + "-" + revision
}

// Istiod is the name Istio gives the Service of revision's istiod
// (istiod, or istiod-<revision>: Istio's chart, istiod's Service), the
// name Istio's agent dials by default (pilot-agent's discoveryAddress,
// istiod.istio-system.svc:15012) and checks the server's certificate
// against. discovery plays istiod's part, so its certificate carries this
// name too, and the chart can serve discovery under it: pods injected by
// Istio reach discovery unchanged.
func Istiod(revision string) string {
	if revision == "" || revision == DefaultRevision {
		return "istiod"
	}
	return "istiod-" + revision
}

// ServiceNames are the names of the Services a control-plane account's
// service is reached by, and so the DNS names its certificate carries:
// its own (Name), and for discovery Istio's name for the same part
// (Istiod). ok is false for an account that is not the control plane's.
func ServiceNames(account string) (names []string, ok bool) {
	service, revision, ok := Parse(account)
	if !ok {
		return nil, false
	}
	names = []string{account}
	if service == Discovery {
		names = append(names, Istiod(revision))
	}
	return names, true
}

// Parse reports which service and revision an account (or Service) name is
// of, and whether it is one of the control plane's at all.
func Parse(name string) (service, revision string, ok bool) {
	for _, s := range Accounts() {
		if name == s {
			return s, DefaultRevision, true
		}
		if !Revisioned(s) {
			continue
		}
		if rev, cut := strings.CutPrefix(name, s+"-"); cut && rev != DefaultRevision && CheckRevision(rev) == nil {
			return s, rev, true
		}
	}
	return "", "", false
}

// OperatorAccount is the system namespace's service account whose token
// the flotilla CLI shows ca by default (--service-account in a cluster;
// make run and compose write a token of it): its certificate sees every
// proxy.
const OperatorAccount = "default"

// Accounts are the control-plane service accounts: ca issues each a
// certificate that may carry its Service's DNS names.
func Accounts() []string { return []string{Galley, Discovery, Injector, CA} }

// TokenAccounts are the accounts that authenticate to ca with a service
// account token (every one but ca's own, which ca signs itself): the
// accounts a local run writes development tokens for.
func TokenAccounts() []string {
	return slices.DeleteFunc(Accounts(), func(a string) bool { return a == CA })
}
