package load

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"

	"github.com/flotilla-mesh/flotilla/test/proc"
)

// The spread run measures proxies moving onto replicas added by a
// scale-out: sidecars all connected to one discovery replica, two more
// replicas started, and each proxy's connection ended at discovery's
// connection age (a GOAWAY), after which the proxy connects again to a
// replica picked at random, as a Service's virtual IP spreads new
// connections. Proxies resume with what they hold, so a replica they
// move to sends only what differs. Route changes made while they move
// show whether convergence suffers.

// SpreadOptions configures a spread run.
type SpreadOptions struct {
	BinDir, Self string
	Log          io.Writer
	Sidecars     int
	Services     int
	Delta        bool
	// Replicas is how many replicas there are after the scale-out (the
	// first runs from the start).
	Replicas int
	// ConnectionAge is discovery's --xds-max-connection-age; it must be
	// longer than the initial sync.
	ConnectionAge time.Duration
	// Changes is how many route changes are measured while the proxies
	// move (one more before the scale-out is the baseline).
	Changes int
	// Ramp starts the clients evenly over this long, as pods of a
	// rollout connect, rather than all at once; the initial sync is
	// counted from the first.
	Ramp time.Duration
}

// SpreadSample is how many proxies each replica serves at one moment.
type SpreadSample struct {
	At      time.Duration // since the scale-out
	Proxies []int
}

// SpreadReport is what a spread run measured.
type SpreadReport struct {
	Sidecars, Services, Replicas int
	Delta                        bool
	ConnectionAge                time.Duration
	// Connected is from starting the clients to the last one holding all
	// four types (on the first replica).
	Connected time.Duration
	// Before is the route change before the scale-out, During those made
	// while the proxies moved.
	Before *SidecarChange
	During []SidecarChange
	// Samples are the proxies per replica, every two seconds from the
	// scale-out. Spread is when every replica first served at least 80 %
	// of an even share; Settled when there had been as many
	// reconnections as proxies.
	Samples         []SpreadSample
	Spread, Settled time.Duration
	Reconnects      int64
	// ResourcesResumed is, per type, what all replicas sent from the
	// scale-out to the end, less the route changes' RDS as the clients
	// counted it.
	ResourcesResumed map[string]int64
	DiscoveryRSSMiB  []float64
}

func (r *SpreadReport) String() string {
	var b strings.Builder
	proto := "sotw"
	if r.Delta {
		proto = "delta"
	}
	fmt.Fprintf(&b, "spread: %d sidecars (%s), %d services, 1 → %d replicas, connection age %s\n",
		r.Sidecars, proto, r.Services, r.Replicas, r.ConnectionAge)
	fmt.Fprintf(&b, "  initial sync on one replica: %s\n", r.Connected.Round(time.Millisecond))
	spread := "not within the run"
	if r.Spread > 0 {
		spread = r.Spread.Round(time.Second).String()
	}
	settled := "not within the run"
	if r.Settled > 0 {
		settled = r.Settled.Round(time.Second).String()
	}
	fmt.Fprintf(&b, "  every replica serving ≥ 80 %% of its share %s after the scale-out; as many reconnections as proxies after %s (%d reconnections)\n",
		spread, settled, r.Reconnects)
	if len(r.Samples) > 0 {
		last := r.Samples[len(r.Samples)-1]
		fmt.Fprintf(&b, "  proxies per replica at the end: %v\n", last.Proxies)
	}
	fmt.Fprintf(&b, "  resources the replicas sent besides the route changes' (what the reconnections cost): cds %d, lds %d, eds %d, rds %d\n",
		r.ResourcesResumed["CDS"], r.ResourcesResumed["LDS"], r.ResourcesResumed["EDS"], r.ResourcesResumed["RDS"])
	line := func(name string, c *SidecarChange) {
		for _, t := range c.Types {
			if t.Type == "rds" {
				fmt.Fprintf(&b, "  %s: rds p50 %s p99 %s max %s (%d clients)\n", name, t.P50.Round(time.Millisecond), t.P99.Round(time.Millisecond), t.Max.Round(time.Millisecond), t.Clients)
			}
		}
	}
	if r.Before != nil {
		line("route change before the scale-out", r.Before)
	}
	for i := range r.During {
		line(fmt.Sprintf("route change %d while moving", i+1), &r.During[i])
	}
	fmt.Fprintf(&b, "  discovery RSS per replica: %.0f MiB\n", r.DiscoveryRSSMiB)
	return b.String()
}

// RunSpread measures.
func RunSpread(ctx context.Context, o SpreadOptions) (*SpreadReport, error) {
	if o.Sidecars <= 0 || o.Services <= 0 || o.Replicas < 2 || o.ConnectionAge <= 0 || o.Changes < 0 {
		return nil, errors.New("sidecars, services and the connection age must be positive, and replicas at least 2")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	dir, err := os.MkdirTemp("", "xdsload-spread-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	weight := 10
	if err := writeAtomic(dir, "services.yaml", sidecarServices(o.Services, 0)); err != nil {
		return nil, err
	}
	if err := writeAtomic(dir, "routing.yaml", sidecarRouting(o.Services, weight, false)); err != nil {
		return nil, err
	}
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	mcpAddr, galleyAdmin := addrs[0], addrs[1]
	galley, err := startGalley(ctx, o.Log, o.BinDir, dir, mcpAddr, galleyAdmin)
	if err != nil {
		return nil, err
	}
	defer stop(galley)
	age := []string{"--xds-max-connection-age", o.ConnectionAge.String()}
	replicas, err := startReplicas(ctx, o.Log, o.BinDir, mcpAddr, nil, 0, 1, age...)
	defer func() {
		for _, rp := range replicas {
			rp.close()
		}
	}()
	if err != nil {
		return nil, err
	}
	time.Sleep(time.Second) // the replica holds the mesh

	fmt.Fprintf(o.Log, "xdsload: galley and one discovery replica ready; starting %d sidecar clients\n", o.Sidecars)
	began := time.Now()
	clients, sc, err := startSidecarClients(ctx, o.Log, o.Self, replicas[0].xdsAddr, o.Sidecars, o.Services, o.Delta, o.Ramp, 0)
	if err != nil {
		return nil, err
	}
	defer stop(clients)
	r := &SpreadReport{Sidecars: o.Sidecars, Services: o.Services, Replicas: o.Replicas, Delta: o.Delta, ConnectionAge: o.ConnectionAge}
	for {
		s, err := sc.synced(ctx)
		if err == nil && s.Synced == o.Sidecars {
			r.Connected = time.Unix(0, s.Last).Sub(began)
			break
		}
		if time.Since(began) > o.ConnectionAge*9/10 {
			return nil, fmt.Errorf("initial sync: %d of %d clients hold all four types before the connection age", s.Synced, o.Sidecars)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(o.Log, "xdsload: %d sidecars in sync on one replica in %s\n", o.Sidecars, r.Connected)
	so := SidecarOptions{Services: o.Services, SyncTimeout: 2 * o.ConnectionAge}
	routeChange := func() (*SidecarChange, error) {
		weight = 100 - weight
		t0 := time.Now()
		if err := writeAtomic(dir, "routing.yaml", sidecarRouting(o.Services, weight, false)); err != nil {
			return nil, err
		}
		var ccs []*grpc.ClientConn
		for _, rp := range replicas {
			ccs = append(ccs, rp.cc)
		}
		return measureChange(ctx, sc, ccs, so, "route", resourcev3.RouteType, t0, func() {})
	}
	if r.Before, err = routeChange(); err != nil {
		return nil, fmt.Errorf("route change before the scale-out: %w", err)
	}

	// The scale-out: the other replicas start, and new connections go to
	// any of them.
	more, err := startReplicas(ctx, o.Log, o.BinDir, mcpAddr, nil, 1, o.Replicas-1, age...)
	replicas = append(replicas, more...)
	if err != nil {
		return nil, err
	}
	var servers []string
	for _, rp := range replicas {
		servers = append(servers, rp.xdsAddr)
	}
	if err := sc.post(ctx, "/servers?addrs="+strings.Join(servers, ",")); err != nil {
		return nil, err
	}
	scaled := time.Now()
	st0, err := sc.synced(ctx)
	if err != nil {
		return nil, err
	}
	sent0, err := resourcesSent(ctx, replicas)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Log, "xdsload: %d more replicas ready; waiting for the proxies to move\n", o.Replicas-1)

	// Route changes while the proxies move: from 80 % of the connection
	// age after the clients started (the first GOAWAYs come at 90 %), in
	// even steps over the next 30 % of it.
	changesAt := make([]time.Time, o.Changes)
	for i := range changesAt {
		changesAt[i] = began.Add(o.ConnectionAge*8/10 + o.ConnectionAge*3/10*time.Duration(i)/time.Duration(max(1, o.Changes-1)))
	}
	var rdsOfChanges int64
	// Every stream has passed its age (+10 %) and grace by then; a ramp
	// delays the last stream's start by as much.
	end := began.Add(o.Ramp + o.ConnectionAge*13/10 + 20*time.Second)
	for time.Now().Before(end) || len(r.During) < o.Changes {
		if len(r.During) < o.Changes && !time.Now().Before(changesAt[len(r.During)]) {
			c, err := routeChange()
			if err != nil {
				return nil, fmt.Errorf("route change %d while moving: %w", len(r.During)+1, err)
			}
			r.During = append(r.During, *c)
			for _, t := range c.Types {
				if t.Type == "rds" {
					rdsOfChanges += int64(t.Resources * float64(t.Clients))
				}
			}
			fmt.Fprintf(o.Log, "xdsload: route change %d while moving measured\n", len(r.During))
		}
		counts, err := proxiesPerReplica(ctx, replicas)
		if err != nil {
			return nil, err
		}
		at := time.Since(scaled)
		r.Samples = append(r.Samples, SpreadSample{At: at, Proxies: counts})
		if r.Spread == 0 && evenEnough(counts, o.Sidecars) {
			r.Spread = at
		}
		st, err := sc.synced(ctx)
		if err != nil {
			return nil, err
		}
		if r.Settled == 0 && st.Streams-st0.Streams >= int64(o.Sidecars) {
			r.Settled = at
		}
		r.Reconnects = st.Streams - st0.Streams
		if err := sleep(ctx, 2*time.Second); err != nil {
			return nil, err
		}
	}
	sent1, err := resourcesSent(ctx, replicas)
	if err != nil {
		return nil, err
	}
	r.ResourcesResumed = map[string]int64{}
	for t, n := range sent1 {
		r.ResourcesResumed[t] = n - sent0[t]
	}
	r.ResourcesResumed["RDS"] -= rdsOfChanges
	for _, rp := range replicas {
		m, err := proc.RSSMiB(rp.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		r.DiscoveryRSSMiB = append(r.DiscoveryRSSMiB, m)
	}
	return r, nil
}

// evenEnough reports whether every replica serves at least 80 % of an
// even share of n proxies.
func evenEnough(counts []int, n int) bool {
	for _, c := range counts {
		if c*len(counts)*10 < n*8 {
			return false
		}
	}
	return true
}

// proxiesPerReplica reads each replica's connected proxies from its
// metrics.
func proxiesPerReplica(ctx context.Context, replicas []replica) ([]int, error) {
	out := make([]int, len(replicas))
	for i, rp := range replicas {
		m, err := scrape(ctx, rp.admin)
		if err != nil {
			return nil, err
		}
		out[i] = int(m.sum("flotilla_discovery_proxies_connected", ""))
	}
	return out, nil
}

// resourcesSent is what all replicas sent so far, per type (CDS, LDS,
// EDS, RDS).
func resourcesSent(ctx context.Context, replicas []replica) (map[string]int64, error) {
	out := map[string]int64{}
	for _, rp := range replicas {
		m, err := scrape(ctx, rp.admin)
		if err != nil {
			return nil, err
		}
		for _, t := range []string{"CDS", "LDS", "EDS", "RDS"} {
			out[t] += int64(m.sum("flotilla_discovery_xds_resources_sent_total", `type="`+t+`"`))
		}
	}
	return out, nil
}

// metrics is a Prometheus text exposition, line by line.
type metrics []string

func scrape(ctx context.Context, admin string) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", admin, err)
	}
	defer resp.Body.Close()
	var out metrics
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// sum adds the values of the series of name whose labels contain label.
func (m metrics) sum(name, label string) float64 {
	var total float64
	for _, l := range m {
		rest, ok := strings.CutPrefix(l, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') || !strings.Contains(rest, label) {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			total += v
		}
	}
	return total
}
