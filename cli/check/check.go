// Package check is `flotilla check`, Linkerd's check and istioctl's
// verify-install for Flotilla: it asks each control-plane service it can
// reach how it is, and prints one line per finding — √ passed, ‼ warning,
// × failed, - skipped — with the way to put each wrong one right; it
// fails (exit 1) when any check failed.
//
// What it checks: galley answers, and each of its subscribers (discovery
// replicas, injectors) has applied galley's latest response of every
// collection; every discovery replica answers and is subscribed; the
// mesh's roots and the serving certificates of the replicas are not
// expired or about to; ca issued the CLI its certificate (when asked);
// in a cluster, the Deployments are ready, the Istio CRDs serve the
// versions Flotilla reads and the webhook configurations' caBundles hold
// the mesh's roots; the services run one version and the proxies one of
// theirs. The findings are made by pure functions (results.go) from what
// the services answered; this file gathers the answers.
package check

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/platform/pemcerts"
)

// NewCommand returns `flotilla check`.
func NewCommand(conn *connect.Options) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Check the control plane: services reachable and current, certificates, the cluster's CRDs and webhooks, versions",
		Long: `check asks each control-plane service it can reach how it is and prints a line per finding
(√ passed, ‼ warning, × failed, - skipped), each wrong one with how to put it right:

  galley        answers; each injector subscribed to it has applied its latest configuration;
                it refuses none of the configuration it reads (each refused file or object is
                named, with where and why: the proxies keep its last valid state)
  discovery     each replica answers, is subscribed to galley and current; proxies rejecting config
  certificates  the mesh's roots (--cacert, or the istio-ca-root-cert ConfigMap) not expired or
                expiring within 90 days; each replica's serving certificate; ca issued this client
                its certificate (with --ca-address)
  cluster       with --kubeconfig: the Deployments ready, the Istio CRDs serving the versions
                Flotilla reads, no object of an Istio kind Flotilla does not serve (each such one
                is named), each webhook configuration's caBundle holding the mesh's roots
  versions      the services on one version; proxies on a version the control plane runs

It exits 1 when a check failed (warnings do not fail it). Where the control plane is comes from
the connection flags, the context file make run writes, or --kubeconfig.`,
		Example: `  flotilla check                                   # make run's control plane
  flotilla check --kubeconfig ~/.kube/config --istio-namespace istio-system`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return Run(cmd.Context(), cmd.OutOrStdout(), conn, time.Now)
		},
	}
}

// failedError is returned when a check failed: exit code 1, with the
// count as its message.
type failedError struct{ failed, warned int }

func (e failedError) Error() string {
	return fmt.Sprintf("%d checks failed, %d warnings", e.failed, e.warned)
}

// ExitCode is 1: a check failed.
func (failedError) ExitCode() int { return 1 }

// report prints results as they come, under section titles.
type report struct {
	w                      io.Writer
	passed, warned, failed int
	err                    error
}

func (r *report) section(title string) {
	r.printf("\n%s\n%s\n", title, strings.Repeat("-", len(title)))
}

func (r *report) add(results ...Result) {
	for _, res := range results {
		mark := "√"
		switch res.Status {
		case Passed:
			r.passed++
		case Skipped:
			mark = "-"
		case Warning:
			mark = "‼"
			r.warned++
		case Failed:
			mark = "×"
			r.failed++
		}
		r.printf("%s %s\n", mark, res.Text)
		if res.Fix != "" && res.Status != Passed {
			r.printf("    fix: %s\n", res.Fix)
		}
	}
}

func (r *report) printf(format string, a ...any) {
	if r.err == nil {
		_, r.err = fmt.Fprintf(r.w, format, a...)
	}
}

// Run checks the control plane conn reaches and writes the report to w.
func Run(ctx context.Context, w io.Writer, conn *connect.Options, clock func() time.Time) error {
	r := &report{w: w}
	var v versions

	r.section("galley")
	var subs []debugapi.Subscriber
	galleyAnswered := false
	if !conn.GalleyKnown() {
		r.add(skip("galley's address is not known: give --galley-address, a context file that names it (make run's), or --kubeconfig"))
	} else {
		g, s, err := conn.GalleySubscribers(ctx)
		if err != nil {
			r.add(fail(unreachable(err, "is galley running and reachable? (make run starts it; in a cluster: kubectl -n <namespace> get deployment flotilla-galley); are --galley-address and the credentials right?"),
				"galley does not answer: %v", err))
		} else {
			galleyAnswered, subs = true, s
			r.add(galleyResults(g, s, clock())...)
			v.service(g.Info.Version, "galley "+g.ID)
			for _, sub := range s {
				if name, ok := strings.CutPrefix(sub.ID, "injector~"); ok && sub.Version != "" {
					v.service(sub.Version, "injector "+name)
				}
			}
			rej, err := conn.GalleyRejections(ctx)
			if err != nil {
				r.add(warn("an older galley does not say what it refuses: upgrade it", "galley's refusals: %v", err))
			} else {
				r.add(rejectionResults(rej, clock())...)
			}
		}
	}

	r.section("discovery")
	dctx, cl, done, err := conn.Connect(ctx)
	var answers []connect.Answer
	if err != nil {
		r.add(fail("check the connection flags (flotilla --help) or the context file; with --ca-address, ca must answer and accept the token", "the discovery replicas cannot be reached: %v", err))
	} else {
		defer done()
		answers = cl.FetchAll(dctx, debugapi.Syncz)
		r.add(discoveryResults(answers, subs, galleyAnswered, clock())...)
		for _, a := range answers {
			if a.Err != nil {
				continue
			}
			v.service(a.Replica.Info.Version, "discovery "+a.Replica.ID)
			syncs, _ := debugapi.Syncs(a.Resp) // reported above when it does not decode
			for _, p := range syncs {
				if v.proxies == nil {
					v.proxies = map[string]int{}
				}
				v.proxies[p.IstioVersion]++
			}
		}
	}

	r.section("certificates")
	rootsPEM, err := conn.Roots(ctx)
	switch {
	case err != nil:
		r.add(fail("give the mesh's roots with --cacert (make run writes .flotilla/roots.pem), or in a cluster check the istio-ca-root-cert ConfigMap", "the mesh's roots: %v", err))
	case rootsPEM == nil:
		r.add(skip("the mesh's roots are not given (plain text without --cacert)"))
	default:
		roots, err := pemcerts.Parse(rootsPEM)
		if err != nil {
			r.add(fail("give the mesh's roots as PEM certificates", "the mesh's roots: %v", err))
		} else {
			r.add(rootResults(roots, clock())...)
		}
	}
	if cl != nil {
		for _, a := range answers {
			if a.Err != nil {
				continue // reported with discovery
			}
			// Its own --timeout: the replicas' answers may have used up
			// dctx's waiting for one that hangs.
			cctx, cancel := context.WithTimeout(ctx, conn.Timeout)
			chain, err := cl.PeerCertificates(cctx, a.Address)
			cancel()
			if err != nil {
				r.add(fail("the replica answered a moment ago: retry; if it persists, look at its log", "discovery %s's certificate: %v", a.Replica.ID, err))
				continue
			}
			r.add(servingResult("discovery "+a.Replica.ID, chain, clock()))
		}
	}
	if ca, ok := conn.CA(); ok {
		r.add(pass("ca %s (replica %s) issued this client its certificate", ca.Info.Version, ca.ID))
		v.service(ca.Info.Version, "ca "+ca.ID)
	}

	r.section("cluster")
	if !conn.Kube.Enabled() {
		r.add(skip("no cluster: with --kubeconfig, the Deployments, the Istio CRDs and the webhook configurations are checked"))
	} else {
		r.add(clusterResults(ctx, conn, rootsPEM)...)
	}

	r.section("versions")
	r.add(skewResults(v)...)

	r.printf("\n%d passed, %d warnings, %d failed\n", r.passed, r.warned, r.failed)
	if r.err != nil {
		return fmt.Errorf("write the report: %w", r.err)
	}
	if r.failed > 0 {
		return failedError{r.failed, r.warned}
	}
	return nil
}
