package check

import (
	"cmp"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
)

// Status is how one check came out.
type Status int

// The statuses, from best to worst.
const (
	Passed Status = iota
	Skipped
	Warning
	Failed
)

// Result is one line of the report: what was found and, when it is not
// right, how to put it right.
type Result struct {
	Status Status
	Text   string
	Fix    string
}

func pass(format string, a ...any) Result {
	return Result{Status: Passed, Text: fmt.Sprintf(format, a...)}
}

func skip(format string, a ...any) Result {
	return Result{Status: Skipped, Text: fmt.Sprintf(format, a...)}
}

func warn(fix, format string, a ...any) Result {
	return Result{Status: Warning, Text: fmt.Sprintf(format, a...), Fix: fix}
}

func fail(fix, format string, a ...any) Result {
	return Result{Status: Failed, Text: fmt.Sprintf(format, a...), Fix: fix}
}

// inFlight is how long a response galley sent may stay unanswered before
// the subscriber counts as behind: applying a large change takes a
// moment.
const inFlight = 10 * time.Second

// Expiry thresholds: a root expiring within rootWarning warns; a
// serving certificate with less than a quarter of its life left warns
// (services renew theirs at half their life).
const rootWarning = 90 * 24 * time.Hour

// galleyResults reports galley and each subscriber that is not a
// discovery replica (the injectors); discovery replicas are reported with
// their own answers (discoveryResults).
func galleyResults(g debugapi.Replica, subs []debugapi.Subscriber, now time.Time) []Result {
	out := []Result{pass("galley %s (replica %s) answers, %d subscribers", cmp.Or(g.Info.Version, "unknown"), cmp.Or(g.ID, "unnamed"), len(subs))}
	injectors := 0
	for _, s := range subs {
		name, ok := strings.CutPrefix(s.ID, "injector~")
		if !ok {
			continue
		}
		injectors++
		out = append(out, subscription("injector "+name, s, now))
	}
	if injectors == 0 {
		out = append(out, warn("start the injector (make run starts it; in a cluster: kubectl -n <namespace> get deployment flotilla-injector); until then pods are created without sidecars",
			"no injector is subscribed to galley"))
	}
	return out
}

// maxRejectionsListed bounds the refusals check names one by one.
const maxRejectionsListed = 10

// rejectionResults fails once per configuration galley refuses to serve
// (the proxies keep its last valid state, or never get it), up to a
// bound, or passes when it refuses nothing.
func rejectionResults(rej []debugapi.Rejection, now time.Time) []Result {
	if len(rej) == 0 {
		return []Result{pass("galley serves all the configuration it reads")}
	}
	const fix = "mend it (flotilla analyze names every problem of a file); until then the proxies keep its last valid state"
	var out []Result
	for i, r := range rej {
		if i == maxRejectionsListed {
			out = append(out, fail(fix, "… and %d more configuration documents galley refuses", len(rej)-maxRejectionsListed))
			break
		}
		since := ""
		if !r.Since.IsZero() {
			since = fmt.Sprintf(" (for %s)", now.Sub(r.Since).Round(time.Second))
		}
		out = append(out, fail(fix, "galley refuses %s%s", r.Message, since))
	}
	return out
}

// subscription is whether the subscriber has applied galley's latest
// response of every collection.
func subscription(who string, s debugapi.Subscriber, now time.Time) Result {
	if len(s.Rejected) > 0 {
		t := slices.Sorted(maps.Keys(s.Rejected))[0]
		return fail("galley sent configuration it cannot apply: its log says why; mend the object (flotilla analyze --live) or upgrade the older of the two",
			"%s rejected galley's %s: %s", who, t, s.Rejected[t])
	}
	var behind []string
	for t, at := range s.Unanswered {
		if now.Sub(at) > inFlight {
			behind = append(behind, fmt.Sprintf("%s for %s", t, now.Sub(at).Round(time.Second)))
		}
	}
	if len(behind) > 0 {
		slices.Sort(behind)
		return fail("a subscriber that does not answer is stuck or overloaded: look at its CPU and log, and restart it if it stays so",
			"%s has not applied galley's latest %s", who, strings.Join(behind, ", "))
	}
	return pass("%s %s is subscribed to galley and current", who, cmp.Or(s.Version, "(version unknown)"))
}

// discoveryResults reports each replica: reachable, subscribed to galley
// (when galley answered) and current; and proxies that reject what they
// are sent.
func discoveryResults(answers []connect.Answer, subs []debugapi.Subscriber, galleyAnswered bool, now time.Time) []Result {
	var out []Result
	byID := map[string]debugapi.Subscriber{}
	for _, s := range subs {
		byID[s.ID] = s
	}
	for _, a := range answers {
		if a.Err != nil {
			out = append(out, fail(unreachable(a.Err, "is the replica running and reachable at this address? (make run starts two; in a cluster: kubectl -n <namespace> get pods -l app.kubernetes.io/name=flotilla-discovery)"),
				"discovery at %s does not answer: %v", a.Address, a.Err))
			continue
		}
		syncs, err := debugapi.Syncs(a.Resp)
		if err != nil {
			out = append(out, fail("the replica's answer did not decode: is it a Flotilla discovery of this version?", "discovery at %s: %v", a.Address, err))
			continue
		}
		who := "discovery " + cmp.Or(a.Replica.ID, a.Address)
		out = append(out, pass("%s %s answers at %s, %d proxies", who, cmp.Or(a.Replica.Info.Version, "unknown"), a.Address, len(syncs)))
		if galleyAnswered {
			if s, ok := byID["discovery~"+a.Replica.ID]; ok {
				out = append(out, subscription(who, s, now))
			} else {
				out = append(out, fail("the replica serves what it got before it lost galley: check its --galley-address and its log (\"subscription broken\")",
					"%s is not subscribed to galley", who))
			}
		}
		var rejecting []string
		for _, p := range syncs {
			for _, t := range p.Types {
				if t.Status == debugapi.Nacked {
					rejecting = append(rejecting, p.ID)
					break
				}
			}
		}
		if len(rejecting) > 0 {
			slices.Sort(rejecting)
			out = append(out, warn("flotilla proxy-status <proxy> shows what was rejected and why; the proxies keep their previous configuration",
				"%s: %d proxies rejected their configuration: %s", who, len(rejecting), strings.Join(first(rejecting, 5), ", ")))
		}
	}
	return out
}

// unreachable is the fix for a service that did not answer with err:
// an expired certificate's, else fix.
func unreachable(err error, fix string) string {
	if strings.Contains(err.Error(), "expired") {
		return "the service's certificate has expired: each service renews it from ca at half its life, so ca has been unreachable from it (or refuses its token); restart it once ca answers"
	}
	return fix
}

func first(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("and %d more", len(s)-n))
}

// rootResults reports the trust bundle's roots: expired, expiring soon or
// fine.
func rootResults(roots []*x509.Certificate, now time.Time) []Result {
	if len(roots) == 0 {
		return []Result{fail("give the mesh's roots (--cacert, or the istio-ca-root-cert ConfigMap in a cluster)", "the mesh's trust bundle holds no certificate")}
	}
	out := make([]Result, 0, len(roots))
	for _, r := range roots {
		left := r.NotAfter.Sub(now)
		switch {
		case left <= 0:
			out = append(out, fail("rotate the root: give ca a new signing root (its state directory, or the cacerts Secret in a cluster) and keep the old one in the bundle until every workload has a new certificate",
				"root %q expired on %s", r.Subject.String(), r.NotAfter.UTC().Format(time.DateOnly)))
		case left < rootWarning:
			out = append(out, warn("plan the root's rotation now: workloads whose certificates chain to it stop trusting each other on that day",
				"root %q expires on %s, in %d days", r.Subject.String(), r.NotAfter.UTC().Format(time.DateOnly), int(left.Hours()/24)))
		default:
			out = append(out, pass("root %q valid until %s", r.Subject.String(), r.NotAfter.UTC().Format(time.DateOnly)))
		}
	}
	return out
}

// servingResult reports a service's serving certificate: how much of its
// life is left.
func servingResult(who string, chain []*x509.Certificate, now time.Time) Result {
	if len(chain) == 0 {
		return skip("%s serves no certificate (plain text)", who)
	}
	leaf := chain[0]
	life, left := leaf.NotAfter.Sub(leaf.NotBefore), leaf.NotAfter.Sub(now)
	if left < life/4 {
		return warn("services renew their certificates from ca at half their life: this one has not; is ca reachable from it?",
			"%s's certificate expires at %s, %s from now", who, leaf.NotAfter.UTC().Format(time.RFC3339), left.Round(time.Minute))
	}
	return pass("%s's certificate valid until %s", who, leaf.NotAfter.UTC().Format(time.RFC3339))
}

// versions are the versions the check saw, by who runs them.
type versions struct {
	services map[string][]string // version → "galley", "discovery r1", …
	proxies  map[string]int      // version → proxies
}

func (v *versions) service(version, who string) {
	if v.services == nil {
		v.services = map[string][]string{}
	}
	v.services[version] = append(v.services[version], who)
}

// skewResults reports the services on more than one version, and proxies
// on a version no service runs.
func skewResults(v versions) []Result {
	var out []Result
	switch len(v.services) {
	case 0:
		return []Result{skip("no service said its version")}
	case 1:
		for version, who := range v.services {
			out = append(out, pass("the control plane runs one version, %s (%d services and replicas)", version, len(who)))
		}
	default:
		var parts []string
		for _, version := range slices.Sorted(maps.Keys(v.services)) {
			parts = append(parts, fmt.Sprintf("%s: %s", version, strings.Join(v.services[version], ", ")))
		}
		out = append(out, warn("services of different versions run together only while an upgrade rolls out: finish it (kubectl -n <namespace> rollout status deployment)",
			"the control plane runs %d versions: %s", len(v.services), strings.Join(parts, "; ")))
	}
	var odd []string
	n := 0
	for _, version := range slices.Sorted(maps.Keys(v.proxies)) {
		if _, ok := v.services[version]; !ok && version != "" {
			odd = append(odd, fmt.Sprintf("%s (%d)", version, v.proxies[version]))
			n += v.proxies[version]
		}
	}
	switch {
	case len(v.proxies) == 0:
		out = append(out, skip("no proxies connected"))
	case len(odd) > 0:
		out = append(out, warn("restart their workloads to get the current sidecar (kubectl rollout restart deployment/<name>)",
			"%d proxies run a version no control-plane service runs: %s", n, strings.Join(odd, ", ")))
	default:
		out = append(out, pass("every proxy runs a version of the control plane's"))
	}
	return out
}
