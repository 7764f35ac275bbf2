package main

import (
	"time"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/dev/devjwt"
)

// newIdentities stands in for what a cluster gives the control plane: a
// token issuer (a new key each run) whose JWKS ca trusts, and an
// hour-long token per control-plane service account (and the operator's)
// in dir, replaced every 20 minutes (Dir.Refresh) as the kubelet replaces
// projected tokens.
func newIdentities(dir string) (*devjwt.Dir, error) {
	iss, err := devjwt.New("https://flotilla.local/devrun")
	if err != nil {
		return nil, err
	}
	ids := &devjwt.Dir{
		Path: dir, Issuer: iss, Namespace: controlplane.DefaultNamespace, Audience: "istio-ca",
		Accounts: append(controlplane.TokenAccounts(), controlplane.OperatorAccount),
		Lifetime: time.Hour,
	}
	if err := ids.Write(time.Now()); err != nil {
		return nil, err
	}
	return ids, nil
}

// demoIdentities are the demo workloads' tokens (namespace demo, one
// service account each), from the same issuer as ids, in dir.
func demoIdentities(ids *devjwt.Dir, dir string) (*devjwt.Dir, error) {
	demo := &devjwt.Dir{
		Path: dir, Issuer: ids.Issuer, Namespace: demoNamespace, Audience: ids.Audience,
		Accounts: []string{greeterV1Account, greeterV2Account, clientAccount, intruderAccount},
		Lifetime: ids.Lifetime,
	}
	if err := demo.Write(time.Now()); err != nil {
		return nil, err
	}
	return demo, nil
}
