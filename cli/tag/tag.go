// Package tag is `flotilla tag`: revision tags, as istioctl tag makes
// them. A tag is a MutatingWebhookConfiguration, istio-revision-tag-<tag>,
// labelled istio.io/tag=<tag> and istio.io/rev=<revision>, whose webhooks
// select namespaces and pods labelled istio.io/rev=<tag> (the default
// tag: istio-injection=enabled too) and call the revision's injector,
// which injects them as its own. Moving a tag moves every namespace that
// uses it to another revision at once.
package tag

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	admregv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/controlplane"
	"github.com/flotilla-mesh/flotilla/internal/inject"
)

// NewCommand returns the tag command; conn is the root's connection flags
// (--kubeconfig, --context).
func NewCommand(conn *connect.Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tag",
		Short: "Create, list and remove revision tags (istio.io/rev labels that point at a revision)",
		Long: `tag manages revision tags as istioctl tag does: a tag is a stable name (prod, stable, default) for a
control-plane revision. Namespaces labelled istio.io/rev=<tag> (and, for the default tag, those labelled
istio-injection=enabled and pods labelled sidecar.istio.io/inject=true) are injected by the revision the
tag points at; "tag set --overwrite" moves them all to another revision at once (their pods take it when
they are restarted). Each tag is a MutatingWebhookConfiguration istio-revision-tag-<tag>, made from the
revision's own (flotilla-sidecar-injector[-<revision>]), whose caBundle the revision's injector keeps.
Setting the default tag deactivates the default revision's own webhooks, as istioctl does, so that one
revision injects those namespaces. Needs a cluster (--kubeconfig or --context).
Planned, not done: the tag's Service (istiod-<tag>) and, for the default tag, a validating webhook;
Istio configuration labelled istio.io/rev=<tag> is not yet read as the revision's.`,
		Example: `  flotilla tag set prod --revision canary
  flotilla tag set prod --revision stable --overwrite
  flotilla tag list
  flotilla tag remove prod`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	var revision string
	var overwrite, skip bool
	set := &cobra.Command{
		Use:   "set TAG --revision REVISION",
		Short: "Create a revision tag, or with --overwrite point one at another revision",
		Example: `  flotilla tag set prod --revision canary
  flotilla tag set default --revision canary --overwrite`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, err := kubeClient(conn)
			if err != nil {
				return err
			}
			cfg, err := Generate(cmd.Context(), client, args[0], revision, overwrite)
			if err != nil {
				return err
			}
			if err := Apply(cmd.Context(), client, cfg); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "Revision tag %q created, referencing control plane revision %q. To enable injection using this\nrevision tag, use 'kubectl label namespace <NAMESPACE> istio.io/rev=%s'\n", args[0], cfg.Labels[controlplane.RevisionLabel], args[0])
			return err
		},
	}
	set.Flags().StringVarP(&revision, "revision", "r", "", "the revision the tag points at")
	set.Flags().BoolVar(&overwrite, "overwrite", false, "point an existing tag at this revision")
	_ = set.MarkFlagRequired("revision")

	var genRevision string
	var genOverwrite bool
	generate := &cobra.Command{
		Use:     "generate TAG --revision REVISION",
		Short:   "Print the webhook configuration of a revision tag, without applying it",
		Example: `  flotilla tag generate prod --revision canary | kubectl apply -f -`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, err := kubeClient(conn)
			if err != nil {
				return err
			}
			cfg, err := Generate(cmd.Context(), client, args[0], genRevision, genOverwrite)
			if err != nil {
				return err
			}
			cfg.TypeMeta = metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"}
			out, err := yaml.Marshal(cfg)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	generate.Flags().StringVarP(&genRevision, "revision", "r", "", "the revision the tag points at")
	generate.Flags().BoolVar(&genOverwrite, "overwrite", false, "generate even when the tag exists")
	_ = generate.MarkFlagRequired("revision")

	var output string
	list := &cobra.Command{
		Use:     "list",
		Aliases: []string{"show"},
		Short:   "List the revision tags, the revision each points at and the namespaces using each",
		Example: `  flotilla tag list
  flotilla tag list -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := kubeClient(conn)
			if err != nil {
				return err
			}
			tags, err := List(cmd.Context(), client)
			if err != nil {
				return err
			}
			return printTags(cmd.OutOrStdout(), tags, output)
		},
	}
	list.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")

	remove := &cobra.Command{
		Use:   "remove TAG",
		Short: "Remove a revision tag",
		Long: `remove deletes the tag's webhook configuration. Namespaces still labelled istio.io/rev=<tag> are
then injected by no revision: remove names them and asks first (-y: do not ask).`,
		Example: `  flotilla tag remove prod
  flotilla tag remove prod -y`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, err := kubeClient(conn)
			if err != nil {
				return err
			}
			return Remove(cmd.Context(), client, args[0], skip, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	remove.Flags().BoolVarP(&skip, "skip-confirmation", "y", false, "remove without asking, even when namespaces use the tag")
	cmd.AddCommand(set, generate, list, remove)
	return cmd
}

func kubeClient(conn *connect.Options) (kubernetes.Interface, error) {
	if !conn.Kube.Enabled() {
		return nil, errors.New("revision tags live in a cluster: give --kubeconfig or --context")
	}
	return conn.Kube.Client()
}

// revisionWebhooks are the revision's own webhook configurations (as
// istioctl's GetWebhooksWithRevision: labelled with the revision, not a
// tag).
func revisionWebhooks(ctx context.Context, client kubernetes.Interface, revision string) ([]admregv1.MutatingWebhookConfiguration, error) {
	l, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{
		LabelSelector: controlplane.RevisionLabel + "=" + revision + ",!" + controlplane.TagLabel,
	})
	if err != nil {
		return nil, fmt.Errorf("the webhook configurations of revision %s: %w", revision, err)
	}
	return l.Items, nil
}

// tagWebhooks are the webhook configurations of tag.
func tagWebhooks(ctx context.Context, client kubernetes.Interface, tag string) ([]admregv1.MutatingWebhookConfiguration, error) {
	l, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: controlplane.TagLabel + "=" + tag})
	if err != nil {
		return nil, fmt.Errorf("the webhook configurations of tag %s: %w", tag, err)
	}
	return l.Items, nil
}

// Generate makes tag's webhook configuration pointing at revision, from
// the revision's own, checked as istioctl's Generate checks: the revision
// has exactly one; a tag other than default is not the name of a
// revision; an existing tag is changed only with overwrite.
func Generate(ctx context.Context, client kubernetes.Interface, tag, revision string, overwrite bool) (*admregv1.MutatingWebhookConfiguration, error) {
	if err := controlplane.CheckRevision(tag); err != nil {
		return nil, fmt.Errorf("tag: %w", err)
	}
	if err := controlplane.CheckRevision(revision); err != nil {
		return nil, err
	}
	if tag != controlplane.DefaultRevision && !overwrite {
		same, err := revisionWebhooks(ctx, client, tag)
		if err != nil {
			return nil, err
		}
		if len(same) > 0 {
			return nil, fmt.Errorf("cannot create revision tag %q: found existing control plane revision with same name", tag)
		}
	}
	own, err := revisionWebhooks(ctx, client, revision)
	if err != nil {
		return nil, err
	}
	switch {
	case len(own) == 0:
		return nil, fmt.Errorf("cannot modify tag: cannot find MutatingWebhookConfiguration with revision %q (labelled %s=%s)", revision, controlplane.RevisionLabel, revision)
	case len(own) > 1:
		return nil, fmt.Errorf("cannot modify tag: found multiple canonical webhooks with revision %q", revision)
	case len(own[0].Webhooks) == 0:
		return nil, fmt.Errorf("cannot modify tag: %s has no webhooks", own[0].Name)
	}
	if !overwrite {
		existing, err := tagWebhooks(ctx, client, tag)
		if err != nil {
			return nil, err
		}
		if len(existing) > 0 {
			return nil, fmt.Errorf("revision tag %q already exists, and --overwrite is false", tag)
		}
	}
	hooks, err := inject.TagWebhooks(tag, own[0].Webhooks[0])
	if err != nil {
		return nil, err
	}
	return &admregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{
			Name: inject.TagWebhookName(tag),
			Labels: map[string]string{
				controlplane.TagLabel: tag, controlplane.RevisionLabel: revision,
				"app.kubernetes.io/part-of": "flotilla", "app.kubernetes.io/managed-by": "flotilla-tag",
			},
		},
		Webhooks: hooks,
	}, nil
}

// Apply creates or replaces cfg; for the default tag it first deactivates
// the default revision's own webhooks (istioctl's
// DeactivateIstioInjectionWebhook), which would otherwise inject the same
// pods.
func Apply(ctx context.Context, client kubernetes.Interface, cfg *admregv1.MutatingWebhookConfiguration) error {
	hooks := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if cfg.Labels[controlplane.TagLabel] == controlplane.DefaultRevision {
		own, err := revisionWebhooks(ctx, client, controlplane.DefaultRevision)
		if err != nil {
			return err
		}
		if len(own) > 1 {
			return errors.New("expected a single webhook configuration of the default revision")
		}
		for _, c := range own {
			for i := range c.Webhooks {
				c.Webhooks[i].NamespaceSelector, c.Webhooks[i].ObjectSelector = inject.NeverMatch(), inject.NeverMatch()
			}
			if _, err := hooks.Update(ctx, &c, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("deactivating the default revision's webhooks (%s): %w", c.Name, err)
			}
		}
	}
	old, err := hooks.Get(ctx, cfg.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = hooks.Create(ctx, cfg, metav1.CreateOptions{})
	case err == nil:
		cfg.ResourceVersion = old.ResourceVersion
		_, err = hooks.Update(ctx, cfg, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("applying %s: %w", cfg.Name, err)
	}
	return nil
}

// Tag is one revision tag.
type Tag struct {
	Tag        string   `json:"tag"`
	Revision   string   `json:"revision"`
	Namespaces []string `json:"namespaces"`
}

// List is every tag, with the namespaces labelled with it, by revision
// then tag (istioctl's listTags).
func List(ctx context.Context, client kubernetes.Interface) ([]Tag, error) {
	l, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: controlplane.TagLabel})
	if err != nil {
		return nil, fmt.Errorf("revision tags: %w", err)
	}
	seen := map[[2]string]bool{}
	var out []Tag
	for _, c := range l.Items {
		t := Tag{Tag: c.Labels[controlplane.TagLabel], Revision: c.Labels[controlplane.RevisionLabel]}
		if seen[[2]string{t.Tag, t.Revision}] {
			continue
		}
		seen[[2]string{t.Tag, t.Revision}] = true
		if t.Namespaces, err = namespacesOf(ctx, client, t.Tag); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Tag) int {
		return strings.Compare(a.Revision+"\x00"+a.Tag, b.Revision+"\x00"+b.Tag)
	})
	return out, nil
}

func namespacesOf(ctx context.Context, client kubernetes.Interface, tag string) ([]string, error) {
	l, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: controlplane.RevisionLabel + "=" + tag})
	if err != nil {
		return nil, fmt.Errorf("the namespaces of tag %s: %w", tag, err)
	}
	names := []string{}
	for _, n := range l.Items {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	return names, nil
}

func printTags(w io.Writer, tags []Tag, output string) error {
	switch output {
	case "json":
		b, err := json.MarshalIndent(tags, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(tags)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case "table":
	default:
		return fmt.Errorf("--output %q: want table, json or yaml", output)
	}
	if len(tags) == 0 {
		_, err := fmt.Fprintln(w, "No Istio revision tags found.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	fmt.Fprintln(tw, "TAG\tREVISION\tNAMESPACES")
	for _, t := range tags {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Tag, t.Revision, strings.Join(t.Namespaces, ","))
	}
	return tw.Flush()
}

// Remove deletes tag's webhook configurations, asking first (on in, the
// question on out) when namespaces still use it, unless skip.
func Remove(ctx context.Context, client kubernetes.Interface, tag string, skip bool, in io.Reader, out io.Writer) error {
	cfgs, err := tagWebhooks(ctx, client, tag)
	if err != nil {
		return err
	}
	if len(cfgs) == 0 {
		return fmt.Errorf("cannot remove tag %q: cannot find MutatingWebhookConfiguration for tag", tag)
	}
	using, err := namespacesOf(ctx, client, tag)
	if err != nil {
		return err
	}
	if len(using) > 0 && !skip {
		fmt.Fprintf(out, "Caution, found %d namespace(s) still injected by tag %q: %s\nProceed with operation? [y/N]", len(using), tag, strings.Join(using, " "))
		answer, _ := bufio.NewReader(io.LimitReader(in, 64)).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			_, err := fmt.Fprintln(out, "Aborting operation.")
			return err
		}
	}
	for _, c := range cfgs {
		if err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("removing %s: %w", c.Name, err)
		}
	}
	_, err = fmt.Fprintf(out, "Revision tag %s removed\n", tag)
	return err
}
