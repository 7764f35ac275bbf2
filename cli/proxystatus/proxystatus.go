// Package proxystatus is `flotilla proxy-status`: every proxy on every
// discovery replica with each xDS type's sync state (istioctl
// proxy-status's table, with the replica that serves each proxy), and
// for one proxy the detail and the difference between what its replica
// would send it now and what it acknowledged.
package proxystatus

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
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
			return conn.ProxyNames(cmd.Context()), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			switch output {
			case "table", "json", "yaml":
			default:
				return fmt.Errorf("--output %q: want table, json or yaml", output)
			}
			ctx, cl, done, err := conn.Connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if len(args) == 1 {
				return showProxy(ctx, cmd.OutOrStdout(), cl, args[0], output)
			}
			rows, failed := cl.Proxies(ctx)
			if err := printRows(cmd.OutOrStdout(), rows, output, time.Now()); err != nil {
				return err
			}
			return failed
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}

func printRows(w io.Writer, rows []connect.Row, output string, now time.Time) error {
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
	columns := xdstype.InStatusOrder()
	for _, c := range columns {
		if used[c.URL] || !c.Optional {
			header = append(header, c.Short)
		}
	}
	header = append(header, "REPLICA", "REVISION", "VERSION")
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fields := []string{connect.ProxyName(r.Proxy.ID)}
		for _, c := range columns {
			if !used[c.URL] && c.Optional {
				continue
			}
			fields = append(fields, cell(r.Proxy, c.URL, now))
		}
		fields = append(fields, r.Replica, r.Revision, cmp.Or(r.Proxy.IstioVersion, "-"))
		fmt.Fprintln(tw, strings.Join(fields, "\t"))
	}
	return tw.Flush()
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

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func writeYAML(w io.Writer, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	_, err = w.Write(b)
	return err
}
