package connect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// Row is one proxy on one replica.
type Row struct {
	Replica string `json:"replica"`
	// Revision is the control-plane revision of the replica serving the
	// proxy (istio.io/rev): the revision the proxy is on.
	Revision string             `json:"revision"`
	Address  string             `json:"address"`
	Proxy    debugapi.ProxySync `json:"proxy"`
}

// Proxies asks every replica which proxies it serves, sorted by name; a
// replica that does not answer is reported in the error, the others'
// proxies are listed.
func (c *Client) Proxies(ctx context.Context) ([]Row, error) {
	var rows []Row
	var errs []error
	for _, a := range c.FetchAll(ctx, debugapi.Syncz) {
		if a.Err != nil {
			errs = append(errs, fmt.Errorf("discovery %s: %w", a.Address, a.Err))
			continue
		}
		syncs, err := debugapi.Syncs(a.Resp)
		if err != nil {
			errs = append(errs, fmt.Errorf("discovery %s: %w", a.Address, err))
			continue
		}
		for _, p := range syncs {
			rows = append(rows, Row{Replica: a.Replica.ID, Revision: Revision(a.Replica), Address: a.Address, Proxy: p})
		}
	}
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(strings.Compare(ProxyName(a.Proxy.ID), ProxyName(b.Proxy.ID)), strings.Compare(a.Proxy.ID, b.Proxy.ID), strings.Compare(a.Replica, b.Replica))
	})
	return rows, errors.Join(errs...)
}

// Revision is a replica's revision; a replica that names none (one from
// before revisions) is the default revision's.
func Revision(r debugapi.Replica) string { return cmp.Or(r.Revision, controlplane.DefaultRevision) }

// Locate finds the proxy a user named (its node ID, or pod.namespace)
// on the replicas: the replica serving it, with its sync state.
func (c *Client) Locate(ctx context.Context, name string) (Row, error) {
	rows, failed := c.Proxies(ctx)
	rows = slices.DeleteFunc(rows, func(r Row) bool { return !IsProxy(r.Proxy.ID, name) })
	switch {
	case len(rows) == 0 && failed != nil:
		return Row{}, fmt.Errorf("no replica that answered serves a proxy %q: %w", name, failed)
	case len(rows) == 0:
		return Row{}, fmt.Errorf("no replica serves a proxy %q (flotilla proxy-status lists them)", name)
	case len(rows) > 1 && !sameProxy(rows):
		var ids []string
		for _, r := range rows {
			ids = append(ids, r.Proxy.ID+" on "+r.Replica)
		}
		return Row{}, fmt.Errorf("%q names %d proxies: %s; give the node ID", name, len(rows), strings.Join(ids, ", "))
	}
	// A proxy that moved replicas may show on both for a moment: the
	// newest stream is the one it uses.
	r := slices.MaxFunc(rows, func(a, b Row) int { return a.Proxy.ConnectedAt.Compare(b.Proxy.ConnectedAt) })
	// Its detail (what translation dropped for it) comes when asked for
	// by ID.
	a := c.Fetch(ctx, r.Address, debugapi.Syncz, r.Proxy.ID)
	if a.Err != nil {
		return Row{}, fmt.Errorf("syncz of %s on %s: %w", r.Proxy.ID, r.Address, a.Err)
	}
	syncs, err := debugapi.Syncs(a.Resp)
	switch {
	case err != nil:
		return Row{}, fmt.Errorf("syncz of %s on %s: %w", r.Proxy.ID, r.Address, err)
	case len(syncs) != 1:
		return Row{}, fmt.Errorf("%s is no longer on %s (it left, or moved replicas meanwhile)", r.Proxy.ID, r.Address)
	}
	r.Proxy = syncs[0]
	return r, nil
}

func sameProxy(rows []Row) bool {
	for _, r := range rows[1:] {
		if r.Proxy.ID != rows[0].Proxy.ID {
			return false
		}
	}
	return true
}

// ProxyNames are the proxies every replica serves, as proxy-status names
// them, for shell completion (none when the control plane does not
// answer: completion must not fail loudly).
func (o *Options) ProxyNames(ctx context.Context) []string {
	ctx, cl, done, err := o.Connect(ctx)
	if err != nil {
		return nil
	}
	defer done()
	rows, _ := cl.Proxies(ctx)
	var names []string
	for _, r := range rows {
		if n := ProxyName(r.Proxy.ID); !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// ProxyName is how the commands name a proxy: pod.namespace from an Istio
// node ID (type~ip~pod.namespace~domain), as istioctl does; the ID itself
// otherwise.
func ProxyName(id string) string {
	if n, ok := proxycontract.ParseNodeID(id); ok && n.ID != "" {
		return n.ID
	}
	return id
}

// IsProxy reports whether the proxy of node ID id is the one a user
// named (by its node ID, or as ProxyName names it).
func IsProxy(id, name string) bool { return id == name || ProxyName(id) == name }
