// Package experimental is `flotilla x`: istioctl experimental's commands
// that Flotilla serves, under the same names.
package experimental

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
)

// NewCommand returns the x command; conn is the root's connection flags.
func NewCommand(conn *connect.Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "x",
		Aliases: []string{"experimental"},
		Short:   "istioctl experimental's commands, as Flotilla serves them",
		Example: `  flotilla x envoy-stats productpage-1.default`,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(envoyStatsCommand(conn))
	return cmd
}

// maxStatsBytes bounds what is read of a proxy's stats.
const maxStatsBytes = 64 << 20

// StatsPath is where, on the agent's status port, envoy-stats reads the
// stats of kind (server or clusters) in output (short, json, yaml, prom,
// prom-merged), as istioctl's setupEnvoyServerStatsConfig and
// setupEnvoyClusterStatsConfig ask Envoy; prom-merged is the agent's own
// merge of Envoy's, its own and the application's metrics, which is
// what Prometheus scrapes.
func StatsPath(kind, output string) (string, error) {
	relay := debugapi.AgentEnvoyPath
	switch kind {
	case "", "server":
		switch output {
		case "short":
			return relay + debugapi.EnvoyStats, nil
		case "json", "yaml":
			return relay + debugapi.EnvoyStats + "?format=json", nil
		case "prom":
			return relay + debugapi.EnvoyStatsProm, nil
		case "prom-merged":
			return "/stats/prometheus", nil
		}
		return "", fmt.Errorf("--output %q: want short, json, yaml, prom or prom-merged", output)
	case "cluster", "clusters":
		switch output {
		case "short":
			return relay + debugapi.EnvoyClusters, nil
		case "json", "yaml":
			return relay + debugapi.EnvoyClusters + "?format=json", nil
		}
		return "", fmt.Errorf("--output %q: want short, json or yaml for clusters", output)
	}
	return "", fmt.Errorf("--type %q: want server or clusters", kind)
}

func envoyStatsCommand(conn *connect.Options) *cobra.Command {
	var kind, output, agent string
	cmd := &cobra.Command{
		Use:     "envoy-stats PROXY",
		Aliases: []string{"es"},
		Short:   "Show the metrics Envoy in a pod emits",
		Long: `envoy-stats shows the metrics of the Envoy of PROXY (pod.namespace, or its node ID), as istioctl
experimental envoy-stats does: its server's (--type server: Envoy's /stats, or with -o prom its
Prometheus text, or with -o prom-merged what the agent serves Prometheus, Envoy's metrics with the
agent's and the application's) or its clusters' (--type clusters: Envoy's /clusters). They are read
from Envoy's admin through the agent's status port: in a cluster through the apiserver's
port-forward to the pod (15020), under make run from the context file, or at --agent-address.`,
		Example: `  flotilla x envoy-stats productpage-1.default
  flotilla x envoy-stats productpage-1.default -o prom
  flotilla x envoy-stats productpage-1.default --type clusters -o json`,
		Args: cobra.ExactArgs(1),
		ValidArgsFunction: func(cmd *cobra.Command, _ []string, _ string) ([]string, cobra.ShellCompDirective) {
			return conn.ProxyNames(cmd.Context()), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := StatsPath(kind, output)
			if err != nil {
				return err
			}
			body, err := conn.AgentDo(cmd.Context(), agent, args[0], http.MethodGet, path, maxStatsBytes)
			if err != nil {
				return err
			}
			switch output {
			case "json":
				var b bytes.Buffer
				if err := json.Indent(&b, body, "", "    "); err != nil {
					return fmt.Errorf("the stats of %s: %w", args[0], err)
				}
				body = append(b.Bytes(), '\n')
			case "yaml":
				if body, err = yaml.JSONToYAML(body); err != nil {
					return fmt.Errorf("the stats of %s: %w", args[0], err)
				}
			}
			_, err = cmd.OutOrStdout().Write(body)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&kind, "type", "server", "the stats of the server or of its clusters")
	fl.StringVarP(&output, "output", "o", "short", "output format: short, json, yaml, prom or prom-merged (server only)")
	fl.StringVar(&agent, "agent-address", "", "the proxy's agent's status port, host:port (default: the context file's, or in a cluster the pod's through port-forward)")
	return cmd
}
