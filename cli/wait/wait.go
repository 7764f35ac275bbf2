// Package wait is `flotilla wait`: it returns once every proxy, on every
// discovery replica, holds a version of an Istio object (or its
// deletion), as istioctl's experimental wait did. A proxy holds it when
// it has acknowledged everything its replica sent it from a push that
// included that version (a proxy the change did not concern holds it as
// soon as its replica decided so); the replicas tell through the
// Distribution debug type (internal/debugapi).
package wait

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
	"github.com/flotilla-mesh/flotilla/internal/model"
)

// pollInterval is how often the replicas are asked.
const pollInterval = 500 * time.Millisecond

// replicaAnswerTimeout bounds one replica's answer to one poll.
const replicaAnswerTimeout = 3 * time.Second

// maxListed bounds the proxies named when the wait times out.
const maxListed = 20

// NewCommand returns the wait command; conn is the root's connection
// flags (whose --timeout bounds the wait).
func NewCommand(conn *connect.Options) *cobra.Command {
	var forFlag, version, proxy string
	var threshold float64
	cmd := &cobra.Command{
		Use:   "wait [--for=distribution|delete] KIND NAME[.NAMESPACE]",
		Short: "Wait until every proxy holds a change of an Istio object",
		Long: `wait returns once every proxy on every discovery replica holds a version of an Istio object
(--for=distribution, the default) or its deletion (--for=delete), and fails when --timeout
(default 30s) passes first, naming the proxies still behind. A proxy holds a version when it has
acknowledged everything its replica sent it from a push that included it; a proxy the change does
not concern holds it as soon as its replica decided so. A proxy that rejected (NACKed) the change
does not hold it. While it waits, wait prints how many proxies hold it and how many it waits for.

The version is, by default, the one galley serves now (reached as analyze --live reaches it;
without a galley address, the latest the replicas hold). --resource-version names one: an
object's metadata.generation in Kubernetes (istioctl's --generation), which a later generation
satisfies too, or the version galley gives an object read from files.`,
		Example: `  # after kubectl apply: wait until every proxy has the reviews VirtualService
  flotilla wait virtualservice reviews.bookinfo

  # a given generation, on 99% of the proxies, within two minutes
  flotilla wait vs reviews.bookinfo --resource-version 7 --threshold 0.99 --timeout 2m

  # until a deleted DestinationRule is gone from every proxy
  flotilla wait --for=delete destinationrule reviews.bookinfo`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if forFlag != "distribution" && forFlag != "delete" {
				return fmt.Errorf("--for %q: want distribution or delete", forFlag)
			}
			if threshold <= 0 || threshold > 1 {
				return fmt.Errorf("--threshold %v: want a ratio in (0, 1]", threshold)
			}
			kind, ok := istio.ByKubectlName(args[0])
			if !ok {
				return fmt.Errorf("%q is not an Istio kind Flotilla serves (%s)", args[0], kindNames())
			}
			name, ns, _ := strings.Cut(args[1], ".")
			t := target{kind: kind, namespace: cmp.Or(ns, "default"), name: name, want: debugapi.Want{Delete: forFlag == "delete"}}
			if name == "" || strings.Contains(t.namespace, ".") {
				return fmt.Errorf("%q: want NAME or NAME.NAMESPACE", args[1])
			}
			if version != "" && t.want.Delete {
				return errors.New("--resource-version names a version to wait for, not a deletion")
			}
			t.want.Version = version
			ctx, cancel := context.WithTimeout(cmd.Context(), conn.Timeout)
			defer cancel()
			if !t.want.Delete && conn.GalleyKnown() {
				// A change galley refuses never reaches a proxy: say why
				// now rather than wait for the old version or time out.
				if err := refused(ctx, conn, t); err != nil {
					return err
				}
			}
			if !t.want.Delete && t.want.Version == "" && conn.GalleyKnown() {
				v, err := galleyVersion(ctx, conn, t)
				if err != nil {
					return err
				}
				t.want.Version = v
			}
			cl, err := conn.Dial(ctx)
			if err != nil {
				return err
			}
			defer cl.Close()
			w := &waiter{t: t, cl: cl, proxy: proxy, threshold: threshold, out: cmd.OutOrStdout(), timeout: conn.Timeout}
			return w.run(ctx)
		},
	}
	cmd.Flags().StringVar(&forFlag, "for", "distribution", "what to wait for: distribution (of a version) or delete")
	cmd.Flags().StringVar(&version, "resource-version", "", "the version to wait for: a generation (or a later one), or the version galley gives a file's object (default: galley's current one)")
	cmd.Flags().StringVar(&proxy, "proxy", "", "wait for this proxy alone (its node ID, or pod.namespace)")
	cmd.Flags().Float64Var(&threshold, "threshold", 1, "the share of proxies that must hold it, in (0, 1]")
	return cmd
}

func kindNames() string {
	var out []string
	for _, k := range istio.Kinds() {
		out = append(out, k.Kind)
	}
	return strings.Join(out, ", ")
}

// target is the object waited for.
type target struct {
	kind            istio.Kind
	namespace, name string
	want            debugapi.Want
}

func (t target) key() string { return model.ObjectKey(t.kind.Kind, t.namespace, t.name) }

func (t target) String() string {
	s := t.kind.Kind + " " + t.namespace + "/" + t.name
	switch {
	case t.want.Delete:
		s = "the deletion of " + s
	case t.want.Version != "":
		s += " version " + t.want.Version
	}
	return s
}

// refused is the error of a wait for an object galley refuses to serve
// as it is now (debugapi.Rejections): its proxies keep the last valid
// version. A galley that does not answer the question leaves the wait
// to go on.
func refused(ctx context.Context, conn *connect.Options, t target) error {
	rej, err := conn.GalleyRejections(ctx)
	if err != nil {
		return nil //nolint:nilerr // an older galley: nothing known refused
	}
	for _, r := range rej {
		if r.Object == t.kind.Kind+" "+t.namespace+"/"+t.name {
			return fmt.Errorf("galley refuses %s, so no proxy gets this change (they keep its last valid version): %s", r.Object, r.Message)
		}
	}
	return nil
}

// galleyVersion is the version galley serves of the object.
func galleyVersion(ctx context.Context, conn *connect.Options, t target) (string, error) {
	var version string
	found := false
	_, err := conn.ReadGalley(ctx, "flotilla-wait", []string{t.kind.TypeURL()}, func(_ string, updated []*mcp.Resource, _ []string) {
		for _, r := range updated {
			if r.Name == t.namespace+"/"+t.name {
				version, found = r.ObjectVersion(), true
			}
		}
	})
	if err != nil {
		return "", err
	}
	if !found {
		return "", fmt.Errorf("galley has no %s %s/%s (to wait for its deletion: --for=delete)", t.kind.Kind, t.namespace, t.name)
	}
	return version, nil
}

// waiter polls the replicas until the target is held widely enough.
type waiter struct {
	t         target
	cl        *connect.Client
	proxy     string
	threshold float64
	out       io.Writer
	timeout   time.Duration
}

// behind is a proxy (or a replica) not holding the target yet.
type behind struct {
	proxy, replica, why string
}

// tally is one poll of every replica.
type tally struct {
	done     int
	waiting  []behind
	replicas int
	// latest is each answering replica's latest version (when it has the
	// object), for a wait with no version to wait for.
	latest map[string]string
}

// proxiesWaiting counts the proxies behind (not the replicas).
func (t tally) proxiesWaiting() int {
	n := 0
	for _, b := range t.waiting {
		if b.proxy != "" {
			n++
		}
	}
	return n
}

func (w *waiter) run(ctx context.Context) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	lastDone, lastWaiting := -1, -1
	var last tally
	for {
		t, err := w.poll(ctx)
		if errors.Is(err, errCut) {
			if last.replicas == 0 && len(last.waiting) == 0 {
				last = t // no poll completed: the replicas this one waited on tell
			}
			return w.timedOut(last)
		}
		if err != nil {
			return err
		}
		last = t
		waiting := t.proxiesWaiting()
		total := t.done + waiting
		if t.replicas > 0 && (total == 0 || float64(t.done) >= w.threshold*float64(total)) && !replicaBehind(t) {
			_, err := fmt.Fprintf(w.out, "%s: held by %d of %d proxies, on %d replicas\n", w.t, t.done, total, t.replicas)
			return err
		}
		if t.done != lastDone || waiting != lastWaiting {
			if _, err := fmt.Fprintf(w.out, "%s: held by %d of %d proxies, waiting for %d\n", w.t, t.done, total, waiting); err != nil {
				return err
			}
			lastDone, lastWaiting = t.done, waiting
		}
		select {
		case <-ctx.Done():
			return w.timedOut(last)
		case <-tick.C:
		}
	}
}

// replicaBehind reports a replica that does not have the version: new
// proxies there would not get it.
func replicaBehind(t tally) bool {
	return slices.ContainsFunc(t.waiting, func(b behind) bool { return b.proxy == "" })
}

// errCut is a poll the timeout cut short.
var errCut = errors.New("the wait timed out during a poll")

// poll asks every replica once. Without a version to wait for, the
// first answers decide it: the latest the replicas hold.
func (w *waiter) poll(ctx context.Context) (tally, error) {
	// A replica that does not answer soon (hung, or overloaded) is
	// behind, named: the others' answers still count.
	pctx, cancel := context.WithTimeout(ctx, replicaAnswerTimeout)
	defer cancel()
	answers := w.cl.FetchAll(pctx, debugapi.Distribution, w.t.key())
	dists := make([]*debugapi.ObjectDistribution, len(answers))
	t := tally{latest: map[string]string{}}
	for i, a := range answers {
		if a.Err != nil {
			why := "it did not answer: " + a.Err.Error()
			// The deadline, not pctx.Err(): the RPC can end on it before
			// the context's own timer has fired.
			if dl, _ := pctx.Deadline(); !time.Now().Before(dl) {
				why = fmt.Sprintf("it did not answer within %s (hung or overloaded: flotilla check tells more)", replicaAnswerTimeout)
				if end, _ := ctx.Deadline(); !time.Now().Before(end) {
					why = "it did not answer before the wait timed out"
				}
			}
			t.waiting = append(t.waiting, behind{replica: a.Address, why: why})
			continue
		}
		d, err := debugapi.DistributionOf(a.Resp)
		if err != nil {
			return t, fmt.Errorf("discovery %s: %w", a.Address, err)
		}
		dists[i] = &d
		if v, ok := d.Latest(); ok {
			t.latest[replicaName(a)] = v
		}
	}
	// Cut short also when the deadline has passed but its timer has not
	// fired yet: a poll started at the deadline fails at once for every
	// replica, and must not stand for what they answered before.
	if end, ok := ctx.Deadline(); ctx.Err() != nil || (ok && !time.Now().Before(end)) {
		return t, errCut
	}
	if !w.t.want.Delete && w.t.want.Version == "" {
		v, err := latestVersion(w.t, t.latest)
		if err != nil {
			return t, err
		}
		w.t.want.Version = v
	}
	for i, d := range dists {
		if d == nil {
			continue
		}
		t.replicas++
		replica := replicaName(answers[i])
		push, ok, why := d.Required(w.t.want)
		if !ok {
			t.waiting = append(t.waiting, behind{replica: replica, why: "it " + why})
		}
		for _, p := range d.Proxies {
			if w.proxy != "" && !connect.IsProxy(p.ID, w.proxy) {
				continue
			}
			switch {
			case ok && p.Push >= push:
				t.done++
			case ok:
				t.waiting = append(t.waiting, behind{proxy: p.ID, replica: replica, why: fmt.Sprintf("holds push %d, the version came in push %d (flotilla proxy-status %s tells why)", p.Push, push, connect.ProxyName(p.ID))})
			default:
				t.waiting = append(t.waiting, behind{proxy: p.ID, replica: replica, why: "its replica does not have the version"})
			}
		}
	}
	return t, nil
}

func replicaName(a connect.Answer) string { return cmp.Or(a.Replica.ID, a.Address) }

// latestVersion is the version to wait for when none was named and galley
// was not asked: the one the replicas agree on, or the latest generation.
func latestVersion(t target, latest map[string]string) (string, error) {
	if len(latest) == 0 {
		return "", fmt.Errorf("no discovery replica has %s %s/%s", t.kind.Kind, t.namespace, t.name)
	}
	versions := slices.Compact(slices.Sorted(func(yield func(string) bool) {
		for _, v := range latest {
			if !yield(v) {
				return
			}
		}
	}))
	if len(versions) == 1 {
		return versions[0], nil
	}
	var best int64
	for _, v := range versions {
		g, ok := debugapi.ParseGeneration(v)
		if !ok {
			return "", fmt.Errorf("the replicas hold different versions of %s %s/%s (%s): name one with --resource-version, or give --galley-address",
				t.kind.Kind, t.namespace, t.name, strings.Join(versions, ", "))
		}
		best = max(best, g)
	}
	return fmt.Sprint(best), nil
}

// timedOut is the error of a wait that ran out of time, naming what is
// behind.
func (w *waiter) timedOut(t tally) error {
	var b strings.Builder
	fmt.Fprintf(&b, "timed out after %s: %s is held by %d of %d proxies; behind:", w.timeout, w.t, t.done, t.done+t.proxiesWaiting())
	slices.SortFunc(t.waiting, func(a, c behind) int {
		return cmp.Or(strings.Compare(a.proxy, c.proxy), strings.Compare(a.replica, c.replica))
	})
	for i, x := range t.waiting {
		if i == maxListed {
			fmt.Fprintf(&b, "\n  … and %d more", len(t.waiting)-maxListed)
			break
		}
		if x.proxy == "" {
			fmt.Fprintf(&b, "\n  replica %s: %s", x.replica, x.why)
		} else {
			fmt.Fprintf(&b, "\n  %s (on %s): %s", connect.ProxyName(x.proxy), x.replica, x.why)
		}
	}
	return errors.New(b.String())
}
