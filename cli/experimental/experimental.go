// Package experimental is `flotilla x`: istioctl experimental's commands
// that Flotilla serves, under the same names.
package experimental

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/cli/analyze"
	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/cli/describe"
	"github.com/flotilla-mesh/flotilla/cli/workload"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// NewCommand returns the x command; conn is the root's connection flags.
func NewCommand(conn *connect.Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "x",
		Aliases: []string{"experimental"},
		Short:   "istioctl experimental's commands, as Flotilla serves them",
		Example: `  flotilla x envoy-stats productpage-1.default
  flotilla x describe pod productpage-1.default
  flotilla x workload entry configure -f workloadgroup.yaml -o vm-files --autoregister`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(envoyStatsCommand(conn), describeCommand(conn), workload.NewCommand(conn))
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

func describeCommand(conn *connect.Options) *cobra.Command {
	var suffix string
	cmd := &cobra.Command{
		Use:   "describe pod POD.NAMESPACE",
		Short: "Say which Services, DestinationRules, VirtualServices and policies apply to a pod, and why",
		Long: `describe pod tells, as istioctl experimental describe pod does, what configuration applies to a
pod: the Services (and ServiceEntry hosts) it is an endpoint of with their ports; for each, the
DestinationRule its namespace's sidecars use (the subsets that select the pod, the TLS mode) and the
VirtualService (which routes reach the pod, which go to subsets that do not select it); the mTLS mode
its PeerAuthentications make and which do; the AuthorizationPolicies, RequestAuthentications and
Sidecar that apply to it. It is decided from galley's configuration and registry by the rules discovery
uses. The pod is read from the cluster with --kubeconfig, else found among galley's endpoints (a pod
behind a Service, a WorkloadEntry).`,
		Example: `  flotilla x describe pod productpage-v1-7d4b9c.bookinfo
  flotilla x describe pod greeter-v1.demo`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 || args[0] != "pod" {
				return fmt.Errorf("want: describe pod POD.NAMESPACE, got %q", args)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name, ns, ok := strings.Cut(connect.ProxyName(args[1]), ".")
			if !ok || name == "" || ns == "" {
				return fmt.Errorf("%q: want the pod as POD.NAMESPACE", args[1])
			}
			live, err := analyze.FetchLive(cmd.Context(), conn)
			if err != nil {
				return err
			}
			pc, _ := live.Store.Build(model.BuildOptions{DomainSuffix: suffix}, nil, 1)
			w, found := describe.FindWorkload(pc, name, ns)
			if conn.Kube.Enabled() {
				client, err := conn.Kube.Client()
				if err != nil {
					return err
				}
				pod, err := client.CoreV1().Pods(ns).Get(cmd.Context(), name, metav1.GetOptions{})
				if err != nil {
					return fmt.Errorf("pod %s.%s: %w", name, ns, err)
				}
				w = describe.Workload{Name: name, Namespace: ns, ServiceAccount: cmp.Or(pod.Spec.ServiceAccountName, "default"), IP: pod.Status.PodIP, Labels: pod.Labels}
			} else if !found {
				return fmt.Errorf("pod %s.%s is not among galley's endpoints: is it ready and behind a Service (or a WorkloadEntry)? With --kubeconfig the pod is read from the cluster", name, ns)
			}
			return describe.Describe(cmd.OutOrStdout(), pc, w)
		},
	}
	cmd.Flags().StringVar(&suffix, "domain-suffix", model.DefaultDomainSuffix, "the cluster's DNS suffix, that short hosts are qualified with")
	return cmd
}
