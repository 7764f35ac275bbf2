// Package proxystatus is `flotilla proxy-status`: every proxy on every
// discovery replica with each xDS type's sync state (istioctl
// proxy-status's table, with the replica that serves each proxy), and
// for one proxy the detail and the difference between what its replica
// would send it now and what it acknowledged.
package proxystatus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/internal/xdstype"
)

// NewCommand returns the proxy-status command; conn is the root's
// connection flags.
func NewCommand(conn *connect.Options) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "proxy-status [PROXY]",
		Short: "Show whether every proxy has taken the configuration its discovery replica sent",
		Long: `proxy-status asks every discovery replica which proxies it serves and, for each xDS type a proxy
watches, whether the proxy took what it was sent: SYNCED (acknowledged), NOT SENT (watched, nothing
sent yet), STALE (sent, not acknowledged yet) or NACKED (rejected; the proxy keeps its previous
version), and IGNORED for a type it does not watch. REVISION is the control-plane revision
(istio.io/rev) of the replica serving the proxy: during a canary upgrade, which proxies moved.
In a cluster (--kubeconfig) the replicas of every revision are asked.

With a PROXY (its node ID, or pod.namespace as istioctl names it), it shows that proxy's detail on
its replica: each type's acknowledged and sent versions, the proxy's error for a NACK, what
translation dropped for it, and the difference between what the replica would send it now and
what it acknowledged, type by type.`,
		Example: `  # every proxy, on every replica of the local control plane (make run)
  flotilla proxy-status

  # one proxy, and what it lacks
  flotilla proxy-status client-1.demo

  # two replicas over mTLS, with a certificate from ca
  flotilla proxy-status --discovery-address 10.0.0.5:15012,10.0.0.6:15012 \
    --ca-address 10.0.0.7:15013 --token-file token --cacert roots.pem -o json`,
		Args: cobra.MaximumNArgs(1),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return ProxyNames(cmd.Context(), conn), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			switch output {
			case "table", "json", "yaml":
			default:
				return fmt.Errorf("--output %q: want table, json or yaml", output)
			}
			ctx, cl, done, err := conn.Connect(cmd.Context())
			if err != nil {
				return err //nolint:wrapcheck // says which flag
			}
			defer done()
			if len(args) == 1 {
				return showProxy(ctx, cmd.OutOrStdout(), cl, args[0], output)
			}
			rows, failed := list(ctx, cl)
			if err := printRows(cmd.OutOrStdout(), rows, output, time.Now()); err != nil {
				return err
			}
			return failed
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}

// Row is one proxy on one replica.
type Row struct {
	Replica string `json:"replica"`
	// Revision is the control-plane revision of the replica serving the
	// proxy (istio.io/rev): the revision the proxy is on.
	Revision string             `json:"revision"`
	Address  string             `json:"address"`
	Proxy    debugapi.ProxySync `json:"proxy"`
}

// list asks every replica; a replica that does not answer is reported in
// the error, the others' proxies are listed.
func list(ctx context.Context, cl *connect.Client) ([]Row, error) {
	var rows []Row
	var errs []error
	for _, a := range cl.FetchAll(ctx, debugapi.Syncz) {
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
			rows = append(rows, Row{Replica: a.Replica.ID, Revision: revision(a.Replica), Address: a.Address, Proxy: p})
		}
	}
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(strings.Compare(Name(a.Proxy.ID), Name(b.Proxy.ID)), strings.Compare(a.Proxy.ID, b.Proxy.ID), strings.Compare(a.Replica, b.Replica))
	})
	return rows, errors.Join(errs...)
}

// revision is a replica's revision; a replica that names none (one from
// before revisions) is the default revision's.
func revision(r debugapi.Replica) string { return cmp.Or(r.Revision, controlplane.DefaultRevision) }

// columns are the types shown, in istioctl's order.
var columns = xdstype.InStatusOrder()

func printRows(w io.Writer, rows []Row, output string, now time.Time) error {
	switch output {
	case "json":
		return writeJSON(w, rows)
	case "yaml":
		return writeYAML(w, rows)
	}
	used := map[string]bool{}
	for _, r := range rows {
		for _, t := range r.Proxy.Types {
			used[t.TypeURL] = true
		}
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	header := []string{"NAME"}
	for _, c := range columns {
		if used[c.URL] || c.URL != resourcev3.SecretType {
			header = append(header, c.Short)
		}
	}
	header = append(header, "REPLICA", "REVISION", "VERSION")
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fields := []string{Name(r.Proxy.ID)}
		for _, c := range columns {
			if !used[c.URL] && c.URL == resourcev3.SecretType {
				continue
			}
			fields = append(fields, cell(r.Proxy, c.URL, now))
		}
		fields = append(fields, r.Replica, r.Revision, cmp.Or(r.Proxy.IstioVersion, "-"))
		fmt.Fprintln(tw, strings.Join(fields, "\t"))
	}
	return tw.Flush() //nolint:wrapcheck // a write error of the output
}

// cell is a type's state as the table prints it: SYNCED with how long
// ago the proxy acknowledged, NACKED, STALE, NOT SENT, or IGNORED.
func cell(p debugapi.ProxySync, typeURL string, now time.Time) string {
	for _, t := range p.Types {
		if t.TypeURL != typeURL {
			continue
		}
		if t.Status == debugapi.Synced && !t.AckedAt.IsZero() {
			return fmt.Sprintf("%s (%s)", t.Status, age(now.Sub(t.AckedAt)))
		}
		return string(t.Status)
	}
	return "IGNORED"
}

// age is a duration as kubectl prints ages: 5s, 3m, 2h, 4d.
func age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(0, int(d.Seconds())))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// ProxyNames are the proxies every replica serves, as the table names
// them, for shell completion (none when the control plane does not
// answer: completion must not fail loudly).
func ProxyNames(ctx context.Context, conn *connect.Options) []string {
	ctx, cl, done, err := conn.Connect(ctx)
	if err != nil {
		return nil
	}
	defer done()
	rows, _ := list(ctx, cl)
	var names []string
	for _, r := range rows {
		if n := Name(r.Proxy.ID); !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// Name is how the table names a proxy: pod.namespace from an Istio node
// ID (type~ip~pod.namespace~domain), as istioctl does; the ID itself
// otherwise.
func Name(id string) string {
	if n, ok := proxycontract.ParseNodeID(id); ok && n.ID != "" {
		return n.ID
	}
	return id
}

// matches reports whether a proxy is the one the user named.
func matches(id, name string) bool { return id == name || Name(id) == name }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v) //nolint:wrapcheck // a write error of the output
}

func writeYAML(w io.Writer, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	_, err = w.Write(b)
	return err //nolint:wrapcheck // a write error of the output
}
