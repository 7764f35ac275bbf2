// Package controlplane names Flotilla's control-plane services. Each runs
// in the system namespace (istio-system by default) under one name that is
// its Deployment's, its service account's and its Service's, as the Helm
// chart installs it; ca grants exactly these accounts certificates for
// their own Service names, and galley serves MCP to discovery's and the
// injector's.
package controlplane

import "slices"

// The services' names.
const (
	Galley    = "flotilla-galley"
	Discovery = "flotilla-discovery"
	Injector  = "flotilla-injector"
	CA        = "flotilla-ca"
)

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
