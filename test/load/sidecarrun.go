package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flotilla-mesh/flotilla/test/proc"
)

// SidecarOptions configures a sidecar-mode run.
type SidecarOptions struct {
	// BinDir holds flotilla-galley and flotilla-discovery; Self is the
	// xdsload binary (for the clients' process).
	BinDir, Self string
	Sidecars     int
	Services     int
	// Changes is how many route changes and how many endpoint changes
	// are measured (alternating).
	Changes int
	Delta   bool
	// Scoped gives every client namespace a Sidecar resource that limits
	// what its proxies see.
	Scoped bool
	// NackClients is how many clients reject every route configuration
	// sent after the initial sync (Envoy refusing a config): they are
	// counted apart, and the others must converge regardless.
	NackClients  int
	DiscoveryEnv []string
	Log          io.Writer
	// ProfileDir, when set, receives discovery's heap profile after the
	// initial sync (heap.pb.gz) and a CPU profile of each change
	// (cpu-<kind>-<n>.pb.gz), for go tool pprof.
	ProfileDir string
	// SyncTimeout bounds the initial sync and each change (default 10
	// minutes).
	SyncTimeout time.Duration
}

// TypeLatency is, for one type, what the clients received of a change.
type TypeLatency struct {
	Type string
	// Clients counts those that received a response of the type.
	Clients       int
	P50, P99, Max time.Duration
	// Responses and Resources are per client that received any.
	Responses, Resources float64
	// Nacked counts the clients that rejected what they received.
	Nacked int
}

// SidecarChange is one measured change.
type SidecarChange struct {
	Kind string // "route" or "endpoint"
	// Types are the types any client received, latencies from the file
	// write to each client's acknowledgement.
	Types []TypeLatency
	// Discovery is discovery's own time: from seeing the change (from
	// galley) to its last send of it, over every proxy. Seen is from the
	// write to discovery seeing it (galley's watch or file read, its
	// batching and MCP to the first replica that did); FirstSent from
	// seeing it to the first send (debounce, push context, one proxy's
	// generation). The rest of Discovery is the fan-out to the others; the
	// types' latencies less Seen and Discovery, the clients' part.
	Discovery, Seen, FirstSent time.Duration
	// DiscoveryCPU, GalleyCPU and ClientsCPU are the CPU seconds each
	// process used from the write until every client had acknowledged
	// (and a second of quiet after).
	DiscoveryCPU, GalleyCPU, ClientsCPU float64
}

// SidecarReport is a sidecar-mode run's result.
type SidecarReport struct {
	Sidecars, Services int
	Delta, Scoped      bool
	// Connected is from starting the clients to the last one holding all
	// four types.
	Connected time.Duration
	Changes   []SidecarChange
	// DiscoveryRSSMiB is discovery's resident memory with every client
	// connected, BaseRSSMiB before any connected; PerProxyKiB the
	// difference per client.
	DiscoveryRSSMiB, BaseRSSMiB, PerProxyKiB float64
	ClientsRSSMiB                            float64
	// Errors counts the clients whose stream failed at some point.
	Errors int
}

func (r *SidecarReport) String() string {
	var b strings.Builder
	mode := "sotw"
	if r.Delta {
		mode = "delta"
	}
	fmt.Fprintf(&b, "sidecars %d (%s", r.Sidecars, mode)
	if r.Scoped {
		fmt.Fprintf(&b, ", Sidecar-scoped")
	}
	fmt.Fprintf(&b, "), services %d: initial sync of all in %s\n", r.Services, r.Connected.Round(time.Millisecond))
	for _, c := range r.Changes {
		fmt.Fprintf(&b, "  %s change: %s, CPU discovery %.2fs galley %.2fs clients %.2fs\n", c.Kind, c.stages(), c.DiscoveryCPU, c.GalleyCPU, c.ClientsCPU)
		for _, t := range c.Types {
			fmt.Fprintf(&b, "    %s: %d clients  p50 %s  p99 %s  max %s  (%.1f responses, %.1f resources per client)", t.Type, t.Clients,
				t.P50.Round(time.Millisecond), t.P99.Round(time.Millisecond), t.Max.Round(time.Millisecond), t.Responses, t.Resources)
			if t.Nacked > 0 {
				fmt.Fprintf(&b, "; %d clients rejected it", t.Nacked)
			}
			b.WriteString("\n")
		}
	}
	fmt.Fprintf(&b, "  discovery RSS %.0f MiB (%.0f MiB before the clients: %.1f KiB per proxy); clients' process %.0f MiB; clients with stream errors: %d\n",
		r.DiscoveryRSSMiB, r.BaseRSSMiB, r.PerProxyKiB, r.ClientsRSSMiB, r.Errors)
	return b.String()
}

// RunSidecars measures discovery under raw ADS sidecar clients.
func RunSidecars(ctx context.Context, o SidecarOptions) (*SidecarReport, error) {
	if o.Sidecars <= 0 || o.Services <= 0 || o.Changes < 0 {
		return nil, errors.New("sidecars and services must be positive, changes not negative")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 10 * time.Minute
	}
	dir, err := os.MkdirTemp("", "xdsload-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	weight, epoch := 10, 0
	if err := writeAtomic(dir, "services.yaml", sidecarServices(o.Services, epoch)); err != nil {
		return nil, err
	}
	if err := writeAtomic(dir, "routing.yaml", sidecarRouting(o.Services, weight, o.Scoped)); err != nil {
		return nil, err
	}
	st, err := startServices(ctx, o.Log, o.BinDir, dir, o.DiscoveryEnv)
	if err != nil {
		return nil, err
	}
	defer st.stop()
	time.Sleep(time.Second) // discovery holds the mesh
	r := &SidecarReport{Sidecars: o.Sidecars, Services: o.Services, Delta: o.Delta, Scoped: o.Scoped}
	if r.BaseRSSMiB, err = proc.RSSMiB(st.disc.Process.Pid); err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Log, "xdsload: galley and discovery ready; starting %d sidecar clients\n", o.Sidecars)
	began := time.Now()
	clients, sc, err := startSidecarClients(ctx, o.Log, o.Self, st.xdsAddr, o.Sidecars, o.Services, o.Delta, 0, 0)
	if err != nil {
		return nil, err
	}
	defer stop(clients)
	deadline := time.Now().Add(o.SyncTimeout)
	for {
		s, err := sc.synced(ctx)
		if err == nil && s.Synced == o.Sidecars {
			r.Connected = time.Unix(0, s.Last).Sub(began)
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("initial sync: %d of %d clients hold all four types after %s (last client error: %q)", s.Synced, o.Sidecars, o.SyncTimeout, s.Error)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(o.Log, "xdsload: %d sidecars in sync in %s\n", o.Sidecars, r.Connected)
	prof := profiler{dir: o.ProfileDir, admin: st.discAdmin}
	if err := prof.save(ctx, "heap.pb.gz", "heap?gc=1"); err != nil {
		return nil, err
	}
	if o.NackClients > 0 {
		if err := sc.nack(ctx, resourcev3.RouteType, o.NackClients); err != nil {
			return nil, err
		}
	}
	cc, err := grpc.NewClient(st.xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(512<<20)))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	for i := range 2 * o.Changes {
		if err := sleep(ctx, 2*time.Second); err != nil { // the previous change settles
			return nil, err
		}
		kind, expect := "route", resourcev3.RouteType
		write := func() error {
			weight = 100 - weight
			return writeAtomic(dir, "routing.yaml", sidecarRouting(o.Services, weight, o.Scoped))
		}
		if i%2 == 1 {
			kind, expect = "endpoint", resourcev3.EndpointType
			write = func() error {
				epoch++
				return writeAtomic(dir, "services.yaml", sidecarServices(o.Services, epoch))
			}
		}
		d0, _ := proc.CPUSeconds(st.disc.Process.Pid)
		g0, _ := proc.CPUSeconds(st.galley.Process.Pid)
		c0, _ := proc.CPUSeconds(clients.Process.Pid)
		profiled := prof.start(ctx, fmt.Sprintf("cpu-%s-%d.pb.gz", kind, i/2+1), 5*time.Second)
		t0 := time.Now()
		if err := write(); err != nil {
			return nil, err
		}
		var d1, g1, c1 float64
		c, err := measureChange(ctx, sc, []*grpc.ClientConn{cc}, o, kind, expect, t0, func() {
			d1, _ = proc.CPUSeconds(st.disc.Process.Pid)
			g1, _ = proc.CPUSeconds(st.galley.Process.Pid)
			c1, _ = proc.CPUSeconds(clients.Process.Pid)
		})
		if err != nil {
			return nil, fmt.Errorf("%s change %d: %w", kind, i/2+1, err)
		}
		if err := <-profiled; err != nil {
			return nil, err
		}
		c.DiscoveryCPU, c.GalleyCPU, c.ClientsCPU = d1-d0, g1-g0, c1-c0
		r.Changes = append(r.Changes, *c)
		fmt.Fprintf(o.Log, "xdsload: %s change measured\n", kind)
	}
	if r.DiscoveryRSSMiB, err = proc.RSSMiB(st.disc.Process.Pid); err != nil {
		return nil, err
	}
	r.PerProxyKiB = (r.DiscoveryRSSMiB - r.BaseRSSMiB) * 1024 / float64(o.Sidecars)
	if r.ClientsRSSMiB, err = proc.RSSMiB(clients.Process.Pid); err != nil {
		return nil, err
	}
	if s, err := sc.synced(ctx); err == nil {
		r.Errors = s.Errors
	}
	return r, nil
}

// startSidecarClients starts a sidecar clients' process: n clients (the
// mesh's clients first … first+n-1) of a mesh of services, connected to
// xdsAddr, started evenly over ramp (at once when zero), with the
// sidecars subcommand's extra flags; sc reads its status.
func startSidecarClients(ctx context.Context, log io.Writer, self, xdsAddr string, n, services int, delta bool, ramp time.Duration, first int, extra ...string) (*exec.Cmd, *statusClient, error) {
	addrs, err := freeAddrs(1)
	if err != nil {
		return nil, nil, err
	}
	args := []string{"sidecars", "--xds", xdsAddr, "--n", strconv.Itoa(n), "--first", strconv.Itoa(first), "--services", strconv.Itoa(services), "--status", addrs[0]}
	if delta {
		args = append(args, "--delta")
	}
	if ramp > 0 {
		args = append(args, "--ramp", ramp.String())
	}
	cmd, err := start(ctx, log, nil, self, append(args, extra...)...)
	if err != nil {
		return nil, nil, err
	}
	return cmd, &statusClient{base: "http://" + addrs[0]}, nil
}

// measureChange waits until every client acknowledged a response of the
// expected type after t0, then a second more for anything else the
// change sends, and reads what each type cost; it calls done before it
// reads discovery's sync status (whose cost is not the change's).
func measureChange(ctx context.Context, sc clientStatus, ccs []*grpc.ClientConn, o SidecarOptions, kind, expect string, t0 time.Time, done func()) (*SidecarChange, error) {
	deadline := time.Now().Add(o.SyncTimeout)
	for {
		a, err := sc.acks(ctx, expect, t0)
		if err != nil {
			return nil, err
		}
		// The changes are to svc-0: the clients that see it must follow.
		n, want := 0, 0
		for i, at := range a.Acked {
			if !sidecarSees(i, o.Services, 0, o.Scoped) {
				continue
			}
			want++
			if at != 0 || a.Nacked[i] > 0 {
				n++
			}
		}
		if n == want {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d clients that see svc-0 acknowledged %s within %s", n, want, ShortType(expect), o.SyncTimeout)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
	if err := sleep(ctx, time.Second); err != nil {
		return nil, err
	}
	c := &SidecarChange{Kind: kind}
	for _, t := range sidecarTypes {
		a, err := sc.acks(ctx, t, t0)
		if err != nil {
			return nil, err
		}
		var lat []time.Duration
		var responses, resources, nacked int
		for i, at := range a.Acked {
			if a.Nacked[i] > 0 {
				nacked++
			}
			if at == 0 {
				continue
			}
			lat = append(lat, time.Unix(0, at).Sub(t0))
			responses += a.Responses[i]
			resources += a.Resources[i]
		}
		if len(lat) == 0 && nacked == 0 {
			continue
		}
		c.Types = append(c.Types, TypeLatency{
			Type: ShortType(t), Clients: len(lat),
			P50: percentile(lat, 50), P99: percentile(lat, 99), Max: percentile(lat, 100),
			Responses: perClient(responses, len(lat)), Resources: perClient(resources, len(lat)), Nacked: nacked,
		})
	}
	done()
	c.Seen, c.FirstSent = -1, -1
	for _, cc := range ccs {
		ps, err := syncz(ctx, cc)
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			if p.PushSeenAt.Before(t0) {
				continue
			}
			for _, ts := range p.Types {
				if ts.TypeURL == expect {
					sent := ts.SentAt.Sub(p.PushSeenAt)
					c.Discovery = max(c.Discovery, sent)
					c.FirstSent = earliest(c.FirstSent, sent)
					c.Seen = earliest(c.Seen, p.PushSeenAt.Sub(t0))
				}
			}
		}
	}
	return c, nil
}

// earliest is the smaller of d and e, or e when d is -1 (none yet).
func earliest(d, e time.Duration) time.Duration {
	if d < 0 {
		return e
	}
	return min(d, e)
}

// stages is where the change's time went, as measured.
func (c *SidecarChange) stages() string {
	if c.Seen < 0 {
		return fmt.Sprintf("discovery %s", c.Discovery.Round(time.Millisecond))
	}
	return fmt.Sprintf("write → discovery saw it %s → first send %s → last send %s (discovery's own time)",
		c.Seen.Round(100*time.Microsecond), c.FirstSent.Round(100*time.Microsecond), c.Discovery.Round(100*time.Microsecond))
}

// profiler saves discovery's profiles (nothing without a directory).
type profiler struct{ dir, admin string }

func (p profiler) save(ctx context.Context, name, path string) error {
	if p.dir == "" {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+"/debug/pprof/"+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile %s: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: %s", name, resp.Status)
	}
	f, err := os.Create(filepath.Join(p.dir, name))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile %s: %w", name, err)
	}
	return f.Close()
}

// start takes a CPU profile of the next d in the background.
func (p profiler) start(ctx context.Context, name string, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() { done <- p.save(ctx, name, "profile?seconds="+strconv.Itoa(int(d.Seconds()))) }()
	if p.dir != "" {
		time.Sleep(50 * time.Millisecond) // the profile has started
	}
	return done
}

func perClient(total, clients int) float64 {
	if clients == 0 {
		return 0
	}
	return float64(total) / float64(clients)
}

// statusClient reads the sidecar clients' process's status endpoint.
type statusClient struct{ base string }

func (s *statusClient) synced(ctx context.Context) (SyncState, error) {
	var st SyncState
	return st, s.get(ctx, "/synced", &st)
}

func (s *statusClient) acks(ctx context.Context, t string, since time.Time) (ClientAcks, error) {
	var a ClientAcks
	return a, s.get(ctx, "/acks?type="+ShortType(t)+"&since="+strconv.FormatInt(since.UnixNano(), 10), &a)
}

// totals is, per client, the responses of type t applied so far and
// when the latest was.
func (s *statusClient) totals(ctx context.Context, t string) (ClientTotals, error) {
	var tt ClientTotals
	return tt, s.get(ctx, "/totals?type="+ShortType(t), &tt)
}

// stale counts the (client, cluster) pairs whose endpoints differ from
// want (cluster → EndpointDigest).
func (s *statusClient) stale(ctx context.Context, want map[string]string) (StaleEndpoints, error) {
	var st StaleEndpoints
	b, err := json.Marshal(want)
	if err != nil {
		return st, err
	}
	return st, s.do(ctx, http.MethodPost, "/stale", bytes.NewReader(b), &st)
}

func (s *statusClient) get(ctx context.Context, path string, v any) error {
	return s.do(ctx, http.MethodGet, path, nil, v)
}

func (s *statusClient) do(ctx context.Context, method, path string, body io.Reader, v any) error {
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, body)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("clients' status: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("clients' status %s: %s: %s", path, resp.Status, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// nack makes the first n clients reject every later response of type t
// (n = 0 stops it).
func (s *statusClient) nack(ctx context.Context, t string, n int) error {
	return s.post(ctx, "/nack?type="+ShortType(t)+"&n="+strconv.Itoa(n))
}

func (s *statusClient) post(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("clients' status: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("clients' status %s: %s", path, resp.Status)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
