// Package analyze is `flotilla analyze`: galley's validation of every
// object and the cross-object analyzers (package validation's Analyze)
// over local files, printed as istioctl analyze prints its messages, each
// with its code, severity, object and file:line.
package analyze

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// ExitFoundIssues is the exit code when a message reaches the failure
// threshold: istioctl analyze's (79), so CI scripts keep working.
const ExitFoundIssues = 79

// FoundIssuesError says that analysis found messages at or above the
// failure threshold; they have been printed.
type FoundIssuesError struct {
	Count     int
	Threshold validation.Severity
}

func (e *FoundIssuesError) Error() string {
	return fmt.Sprintf("%d message(s) at or above %s", e.Count, e.Threshold)
}

// ExitCode is ExitFoundIssues.
func (e *FoundIssuesError) ExitCode() int { return ExitFoundIssues }

// Options are the command's flags.
type Options struct {
	Files            []string
	Recursive        bool
	Namespace        string
	DomainSuffix     string
	Output           string
	FailureThreshold string
	OutputThreshold  string
	ListCodes        bool
	Live             bool
}

// NewCommand returns the analyze command; conn is the root's connection
// flags (galley's address and credentials, for --live).
func NewCommand(conn *connect.Options) *cobra.Command {
	o := &Options{}
	cmd := &cobra.Command{
		Use:   "analyze [FILE|DIR|- ...]",
		Short: "Find problems in Istio configuration: what galley rejects, and what breaks traffic across objects",
		Long: `analyze validates every Istio object as galley does (the webhook and file mode use the same
code) and then looks across objects, as istioctl analyze does: VirtualServices naming hosts,
subsets or gateways that do not exist, DestinationRule subsets that select no workload, two
DestinationRules for one host, Sidecar egress hosts that import nothing, DestinationRules whose TLS
a STRICT PeerAuthentication refuses, Gateways selecting no workload or listening on a port their
Service does not expose, selectors that match nothing, Service ports without a protocol,
EnvoyFilter patches that are ignored or order-dependent, and deprecated fields. The Kubernetes
objects in the files are checked as Istio's annotation, injection and Deployment analyzers check
them: unknown, misplaced, deprecated or (to the injector) invalid Istio annotations, applications
running as the proxy's user, istio-proxy containers left as image: auto where no injector selects
the pods, Services clashing in front of an injected workload. Kubernetes Gateway API objects in the files are converted as galley converts
them, and what the status galley would write says is wrong is reported: Gateways not accepted,
listeners in conflict, routes not attached to their parents, refs to another namespace without a
ReferenceGrant, backends and certificates not found (FLT03xx).

It reads files and directories (-f, or as arguments; a directory's .yaml, .yml and .json files,
with -R its subdirectories' too) and - for standard input. Kubernetes Services, Pods and the Pod
templates of Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs in the same
files are the Services and workloads the cross-object checks look at; without them, those checks
are skipped and a message says so.

With --live it reads the configuration and the registry galley serves (over MCP, as discovery
does: --galley-address, or --kubeconfig to find a galley pod, with the credentials the other
commands use; galley serves identities of the control plane's namespace) and overlays the files
given on it, as istioctl analyze overlays files on the cluster: a file's object replaces the live
one of the same kind and name. The registry's endpoints are the workloads then, so a selector is
checked against the Pods behind Services.

Each message has a code (--list-codes prints them), a severity (Info, Warning, Error), the object
and, from a file, the file and line. The exit code is 79 (istioctl's) when a message is at or
above --failure-threshold, 1 when the input cannot be read.`,
		Example: `  # a directory, recursively
  flotilla analyze -R -f deploy/

  # what kubectl would apply, from standard input
  kustomize build overlays/prod | flotilla analyze -

  # as JSON, failing CI on warnings too
  flotilla analyze -o json --failure-threshold Warning mesh.yaml

  # what galley serves, with a change not applied yet
  flotilla analyze --live --galley-address 127.0.0.1:15019 --plaintext -f reviews-v2.yaml

  # every code
  flotilla analyze --list-codes`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.ListCodes {
				return listCodes(cmd.OutOrStdout())
			}
			o.Files = append(o.Files, args...)
			return o.Run(cmd.Context(), conn, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&o.Files, "filename", "f", nil, "a file or directory to analyze (repeatable; - is standard input)")
	f.BoolVarP(&o.Recursive, "recursive", "R", false, "read directories' subdirectories too")
	f.StringVarP(&o.Namespace, "namespace", "n", "default", "namespace of objects that name none")
	f.StringVar(&o.DomainSuffix, "domain-suffix", model.DefaultDomainSuffix, "the cluster's DNS suffix, that short hosts are qualified with")
	f.StringVarP(&o.Output, "output", "o", "log", "output format: log, json or yaml")
	f.StringVar(&o.FailureThreshold, "failure-threshold", "Error", "the least severe message that fails the command (exit code 79): Info, Warning or Error")
	f.StringVar(&o.OutputThreshold, "output-threshold", "Info", "the least severe message printed: Info, Warning or Error")
	f.BoolVarP(&o.ListCodes, "list-codes", "L", false, "list every message code and exit")
	f.BoolVar(&o.Live, "live", false, "analyze galley's configuration and registry, with the files overlaid")
	return cmd
}

// Run analyzes the files (over galley's configuration with Live) and
// prints the messages.
func (o *Options) Run(ctx context.Context, conn *connect.Options, stdin io.Reader, out io.Writer) error {
	failAt, err := validation.ParseSeverity(o.FailureThreshold)
	if err != nil {
		return fmt.Errorf("--failure-threshold: %w", err)
	}
	showAt, err := validation.ParseSeverity(o.OutputThreshold)
	if err != nil {
		return fmt.Errorf("--output-threshold: %w", err)
	}
	switch o.Output {
	case "log", "json", "yaml":
	default:
		return fmt.Errorf("--output %q: want log, json or yaml", o.Output)
	}
	if len(o.Files) == 0 && !o.Live {
		return errNoInput
	}
	files, err := ReadFiles(o.Files, o.Recursive, stdin, o.Namespace, o.DomainSuffix)
	if err != nil {
		return err
	}
	in := Input(files, o.DomainSuffix)
	msgs := files.Messages
	if o.Live {
		live, err := FetchLive(ctx, conn)
		if err != nil {
			return err
		}
		in = LiveInput(live, files, o.DomainSuffix)
		msgs = append(msgs, rejectedMessages(live)...)
	}
	msgs = append(msgs, Analyze(in, files)...)
	failing := 0
	var shown []validation.Message
	for _, m := range msgs {
		if m.Severity() >= failAt {
			failing++
		}
		if m.Severity() >= showAt {
			shown = append(shown, m)
		}
	}
	if err := Print(out, o.Output, shown, files); err != nil {
		return err
	}
	if failing > 0 {
		return &FoundIssuesError{Count: failing, Threshold: failAt}
	}
	return nil
}

// Analyze is every check over in: validation's analyzers, and those of
// the files' Gateway API and Kubernetes objects (f's, which in includes).
func Analyze(in validation.Input, f *Files) []validation.Message {
	return slices.Concat(validation.Analyze(in), f.gateway.messages(in), f.kube.messages(in))
}

// Input is the analysis input of local files alone: what they hold is
// all there is.
func Input(f *Files, domainSuffix string) validation.Input {
	haveServices := len(f.Services) > 0
	haveWorkloads := len(f.Workloads) > 0
	for _, o := range f.Objects {
		switch o.Kind.Kind {
		case "ServiceEntry":
			haveServices = true
		case "WorkloadEntry":
			haveWorkloads = true
		}
	}
	return validation.Input{
		Objects: f.Objects, Services: f.Services, Workloads: f.Workloads, Namespaces: f.Namespaces, DomainSuffix: domainSuffix,
		HaveServices: haveServices, HaveWorkloads: haveWorkloads,
	}
}

// Output is one message as -o json and -o yaml print it.
type Output struct {
	Code     validation.Code `json:"code"`
	Name     string          `json:"name"`
	Severity string          `json:"severity"`
	Kind     string          `json:"kind"`
	Object   string          `json:"object"`
	Path     string          `json:"path,omitempty"`
	Origin   string          `json:"origin,omitempty"`
	Message  string          `json:"message"`
}

// Print writes messages in a format: log lines as istioctl analyze's
// ("Error [FLT0201] (VirtualService demo/greeter greeter.yaml:12) ..."),
// json or yaml.
func Print(w io.Writer, format string, msgs []validation.Message, files *Files) error {
	if format == "log" {
		if len(msgs) == 0 {
			_, err := fmt.Fprintln(w, "✔ No problems found.")
			return err
		}
		for _, m := range msgs {
			where := m.Object.String()
			if o := files.Origin(m); o != "" {
				where += " " + o
			}
			if m.Object.Kind == DocumentKind {
				where = m.Object.Name // it is the file and line
			}
			text := m.Text
			if m.Path != "" {
				text = m.Path + ": " + text
			}
			if _, err := fmt.Fprintf(w, "%s [%s] (%s) %s\n", m.Severity(), m.Code, where, text); err != nil {
				return err
			}
		}
		return nil
	}
	out := make([]Output, 0, len(msgs))
	for _, m := range msgs {
		info, _ := m.Code.Info()
		obj := m.Object.Name
		if m.Object.Namespace != "" {
			obj = m.Object.Namespace + "/" + obj
		}
		out = append(out, Output{
			Code: m.Code, Name: info.Name, Severity: m.Severity().String(), Kind: m.Object.Kind, Object: obj,
			Path: m.Path, Origin: files.Origin(m), Message: m.Text,
		})
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	if format == "yaml" {
		if data, err = yaml.JSONToYAML(data); err != nil {
			return fmt.Errorf("encode: %w", err)
		}
	} else {
		data = append(data, '\n')
	}
	_, err = w.Write(data)
	return err
}

func listCodes(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "CODE\tNAME\tSEVERITY\tISTIO\tMEANING")
	for _, c := range validation.Codes() {
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Code, c.Name, c.Severity, cmp.Or(c.Istio, "-"), c.Meaning)
	}
	return tw.Flush()
}
