package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// Options configures a run.
type Options struct {
	// BinDir holds flotilla-galley and flotilla-discovery; Self is the
	// xdsload binary (for the clients' process).
	BinDir, Self string
	Clients      int
	Services     int
	Changes      int
	// DiscoveryEnv is added to discovery's environment (e.g. GOMEMLIMIT).
	DiscoveryEnv []string
	// Log receives progress and the services' output.
	Log io.Writer
}

// Change is one measured configuration change.
type Change struct {
	// P50, P99 and Max are over the clients: from writing the file (galley
	// reads it, discovery pushes) to each client's acknowledgement.
	P50, P99, Max time.Duration
	// SentP50 and SentMax are from writing the file to discovery sending
	// each client its new routes: the rest is the clients' own time.
	SentP50, SentMax time.Duration
}

// Report is a run's result.
type Report struct {
	Clients, Services int
	// Connected is from starting the clients to all of them holding an
	// acknowledged configuration.
	Connected time.Duration
	Changes   []Change
	// P50 and P99 are over every client of every change.
	P50, P99, Max time.Duration
	// DiscoveryRSSMiB is discovery's resident memory after the changes;
	// ClientsRSSMiB that of the clients' process.
	DiscoveryRSSMiB, ClientsRSSMiB float64
	// CPU seconds each process used during the changes, to show where
	// the time goes on a machine they share.
	DiscoveryCPU, GalleyCPU, ClientsCPU float64
}

func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "clients %d, services %d: all connected and acknowledged in %s\n", r.Clients, r.Services, r.Connected.Round(time.Millisecond))
	for i, c := range r.Changes {
		fmt.Fprintf(&b, "  change %d: p50 %s  p99 %s  max %s  (sent: p50 %s max %s)\n", i+1, c.P50.Round(time.Millisecond), c.P99.Round(time.Millisecond),
			c.Max.Round(time.Millisecond), c.SentP50.Round(time.Millisecond), c.SentMax.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "  all changes: p50 %s  p99 %s  max %s\n", r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond), r.Max.Round(time.Millisecond))
	fmt.Fprintf(&b, "  discovery RSS %.0f MiB (clients' process %.0f MiB)\n", r.DiscoveryRSSMiB, r.ClientsRSSMiB)
	fmt.Fprintf(&b, "  CPU during the changes: discovery %.2fs, galley %.2fs, clients %.2fs\n", r.DiscoveryCPU, r.GalleyCPU, r.ClientsCPU)
	return b.String()
}

// Target is the listener every client dials.
const Target = "svc-0.load.svc.cluster.local:80"

// Run measures.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Clients <= 0 || o.Services <= 0 || o.Changes <= 0 {
		return nil, errors.New("clients, services and changes must be positive")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	dir, err := os.MkdirTemp("", "xdsload-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "services.yaml"), []byte(mesh(o.Services)), 0o600); err != nil {
		return nil, err
	}
	if err := writeAtomic(dir, "routing.yaml", versionSplit(0, 50)); err != nil {
		return nil, err
	}
	st, err := startServices(ctx, o.Log, o.BinDir, dir, o.DiscoveryEnv)
	if err != nil {
		return nil, err
	}
	defer st.stop()
	galley, disc, xdsAddr := st.galley, st.disc, st.xdsAddr
	fmt.Fprintf(o.Log, "xdsload: galley and discovery ready; starting %d clients\n", o.Clients)
	began := time.Now()
	clients, err := start(ctx, o.Log, nil, o.Self, "clients", "--xds", xdsAddr, "--target", Target, "--n", fmt.Sprint(o.Clients))
	if err != nil {
		return nil, err
	}
	defer stop(clients)
	r := &Report{Clients: o.Clients, Services: o.Services}
	if _, _, err := waitAcked(ctx, xdsAddr, o.Clients, time.Time{}); err != nil {
		return nil, fmt.Errorf("clients connecting: %w", err)
	}
	r.Connected = time.Since(began)
	fmt.Fprintf(o.Log, "xdsload: %d clients acknowledged in %s\n", o.Clients, r.Connected)
	cpu := func() (d, g, c float64) {
		d, _ = proc.CPUSeconds(disc.Process.Pid)
		g, _ = proc.CPUSeconds(galley.Process.Pid)
		c, _ = proc.CPUSeconds(clients.Process.Pid)
		return d, g, c
	}
	d0, g0, c0 := cpu()
	var all []time.Duration
	for i := range o.Changes {
		time.Sleep(500 * time.Millisecond) // let the previous change settle
		weight := 10
		if i%2 == 1 {
			weight = 90
		}
		t0 := time.Now()
		if err := writeAtomic(dir, "routing.yaml", versionSplit(0, weight)); err != nil {
			return nil, err
		}
		lat, sent, err := waitAcked(ctx, xdsAddr, o.Clients, t0)
		if err != nil {
			return nil, fmt.Errorf("change %d: %w", i+1, err)
		}
		c := Change{
			P50: percentile(lat, 50), P99: percentile(lat, 99), Max: percentile(lat, 100),
			SentP50: percentile(sent, 50), SentMax: percentile(sent, 100),
		}
		fmt.Fprintf(o.Log, "xdsload: change %d: p50 %s p99 %s max %s\n", i+1, c.P50, c.P99, c.Max)
		r.Changes = append(r.Changes, c)
		all = append(all, lat...)
	}
	r.P50, r.P99, r.Max = percentile(all, 50), percentile(all, 99), percentile(all, 100)
	d1, g1, c1 := cpu()
	r.DiscoveryCPU, r.GalleyCPU, r.ClientsCPU = d1-d0, g1-g0, c1-c0
	if r.DiscoveryRSSMiB, err = proc.RSSMiB(disc.Process.Pid); err != nil {
		return nil, err
	}
	if r.ClientsRSSMiB, err = proc.RSSMiB(clients.Process.Pid); err != nil {
		return nil, err
	}
	return r, nil
}

// services is galley (file mode, reading dir) and discovery, as
// processes.
type services struct {
	galley, disc                    *exec.Cmd
	xdsAddr, discAdmin, galleyAdmin string
}

func startServices(ctx context.Context, log io.Writer, binDir, dir string, discEnv []string) (*services, error) {
	addrs, err := freeAddrs(4)
	if err != nil {
		return nil, err
	}
	mcpAddr, galleyAdmin, xdsAddr, discAdmin := addrs[0], addrs[1], addrs[2], addrs[3]
	st := &services{xdsAddr: xdsAddr, discAdmin: discAdmin, galleyAdmin: galleyAdmin}
	if st.galley, err = startGalley(ctx, log, binDir, dir, mcpAddr, galleyAdmin); err != nil {
		return nil, err
	}
	st.disc, err = start(ctx, log, discEnv, filepath.Join(binDir, "flotilla-discovery"),
		"--galley-address", mcpAddr, "--xds-address", xdsAddr, "--admin-address", discAdmin, "--log-level", "warn",
		"--xds-max-connections-per-peer", "0") // thousands of proxies from one address: this machine
	if err != nil {
		st.stop()
		return nil, err
	}
	if err := waitReady(ctx, discAdmin); err != nil {
		st.stop()
		return nil, fmt.Errorf("discovery: %w", err)
	}
	return st, nil
}

func (st *services) stop() {
	if st.disc != nil {
		stop(st.disc)
	}
	stop(st.galley)
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(i, len(s))-1)]
}

// waitAcked polls discovery's sync status until n clients acknowledged
// their routes after since (or, with a zero since, until n clients are in
// sync on every type they watch); it returns each client's time from
// since to its acknowledgement. Bounded at 5 minutes.
func waitAcked(ctx context.Context, xdsAddr string, n int, since time.Time) (acked, sent []time.Duration, err error) {
	deadline := time.Now().Add(5 * time.Minute)
	cc, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		return nil, nil, fmt.Errorf("debug client: %w", err)
	}
	defer cc.Close()
	for {
		st, err := syncz(ctx, cc)
		if err != nil {
			return nil, nil, err
		}
		var lat, out []time.Duration
		for _, p := range st {
			done := len(p.Types) == 4
			var routes, routesSent time.Time
			for _, t := range p.Types {
				done = done && t.Status == debugapi.Synced
				if t.TypeURL == resourcev3.RouteType {
					routes, routesSent = t.AckedAt, t.SentAt
				}
			}
			if !since.IsZero() {
				done = done && routes.After(since)
			}
			if done {
				lat = append(lat, routes.Sub(since))
				out = append(out, routesSent.Sub(since))
			}
		}
		if len(lat) >= n {
			return lat, out, nil
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("only %d of %d clients acknowledged", len(lat), n)
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// syncz reads discovery's sync state as flotilla proxy-status does.
func syncz(ctx context.Context, cc *grpc.ClientConn) ([]debugapi.ProxySync, error) {
	resp, err := debugapi.Fetch(ctx, cc, debugapi.Syncz)
	if err != nil {
		return nil, err
	}
	return debugapi.Syncs(resp)
}

func start(ctx context.Context, log io.Writer, env []string, path string, args ...string) (*exec.Cmd, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", filepath.Base(path), err)
	}
	return cmd, nil
}

func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func waitReady(ctx context.Context, admin string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("not ready within 60s")
}

// freeAddrs are n distinct free loopback addresses.
func freeAddrs(n int) ([]string, error) {
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, l.Addr().String())
		defer l.Close()
	}
	return addrs, nil
}

func writeAtomic(dir, name, content string) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

// mesh is n services, each a ServiceEntry with two versions and a
// DestinationRule naming them.
func mesh(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc-%[1]d, namespace: load}
spec:
  hosts: [svc-%[1]d.load.svc.cluster.local]
  resolution: STATIC
  ports: [{number: 80, name: grpc, protocol: GRPC}]
  endpoints:
  - {address: 10.%[2]d.%[3]d.1, labels: {version: v1}}
  - {address: 10.%[2]d.%[3]d.2, labels: {version: v2}}
---
`, i, 1+i/256, i%256)
		b.WriteString(versionSubsets(i))
	}
	return b.String()
}

// versionSubsets is svc-i's DestinationRule: subsets v1 and v2 by the
// version label.
func versionSubsets(i int) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: svc-%[1]d, namespace: load}
spec:
  host: svc-%[1]d.load.svc.cluster.local
  subsets: [{name: v1, labels: {version: v1}}, {name: v2, labels: {version: v2}}]
---
`, i)
}

// versionSplit is svc-i's VirtualService: v2 percent to subset v2, the
// rest to v1.
func versionSplit(i, v2 int) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: svc-%[1]d, namespace: load}
spec:
  hosts: [svc-%[1]d.load.svc.cluster.local]
  http:
  - route:
    - {destination: {host: svc-%[1]d.load.svc.cluster.local, subset: v1}, weight: %[2]d}
    - {destination: {host: svc-%[1]d.load.svc.cluster.local, subset: v2}, weight: %[3]d}
---
`, i, 100-v2, v2)
}
