package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/model"
	"github.com/flotilla-mesh/flotilla/test/proc"
)

// The fan-out run measures galley at replica scale: one galley (file
// mode) serving many discovery replicas, each a process subscribed to it,
// through a rolling change of every endpoint of the mesh, a group of
// services at a time, as a rollout replaces pods.

// FanoutOptions configures a fan-out run.
type FanoutOptions struct {
	Log    io.Writer
	BinDir string
	// Replicas is how many discovery processes subscribe to galley.
	Replicas int
	// Services ServiceEntries (STATIC, one HTTP port) of EndpointsEach
	// endpoints each, in Steps files: each step of the rolling change
	// rewrites one file, moving every endpoint of its services.
	Services, EndpointsEach, Steps int
	// Interval is the time between the steps' writes.
	Interval time.Duration
	// ProfileDir, when set, receives galley's heap profile after the
	// change (galley-heap.pb.gz).
	ProfileDir string
}

// FanoutReport is what a fan-out run measured.
type FanoutReport struct {
	Replicas, Services, Endpoints, Steps int
	Interval                             time.Duration
	// Initial is from the replicas' start until every one held the mesh.
	Initial time.Duration
	// Step is, for each step, from its file write until every replica
	// held it; Total from the first write until every replica held the
	// last step.
	Step  []time.Duration
	Total time.Duration
	// GalleyCPU and DiscoveryCPU (all replicas together) are CPU-seconds
	// from the first write until every replica held the last step.
	GalleyCPU, DiscoveryCPU float64
	// GalleyBaseRSSMiB is galley's resident memory before any replica
	// subscribed, GalleyRSSMiB after the change; PerSubscriberKiB the
	// difference per replica.
	GalleyBaseRSSMiB, GalleyRSSMiB, PerSubscriberKiB float64
	// DiscoveryRSSMiB is a replica's resident memory, on average.
	DiscoveryRSSMiB float64
}

func (r *FanoutReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "galley → %d discovery replicas: %d services, %d endpoints, %d steps %s apart\n",
		r.Replicas, r.Services, r.Endpoints, r.Steps, r.Interval)
	fmt.Fprintf(&b, "  initial: every replica held the mesh %s after they started\n", r.Initial.Round(time.Millisecond))
	var worst time.Duration
	steps := make([]string, len(r.Step))
	for i, d := range r.Step {
		worst = max(worst, d)
		steps[i] = d.Round(time.Millisecond).String()
	}
	fmt.Fprintf(&b, "  rolling change: each step held by every replica after %s (slowest %s); the whole change %s after the first write\n",
		strings.Join(steps, " "), worst.Round(time.Millisecond), r.Total.Round(time.Millisecond))
	fmt.Fprintf(&b, "  CPU during the change: galley %.2fs, discovery %.2fs (all replicas)\n", r.GalleyCPU, r.DiscoveryCPU)
	fmt.Fprintf(&b, "  galley RSS %.0f MiB (%.0f MiB before the replicas: %.0f KiB per subscriber); discovery RSS %.0f MiB per replica\n",
		r.GalleyRSSMiB, r.GalleyBaseRSSMiB, r.PerSubscriberKiB, r.DiscoveryRSSMiB)
	return b.String()
}

// fanoutServices is step k's file: services k*per … (k+1)*per-1, each
// with its endpoints at addresses of generation gen (0 or 1: the other
// moves every one of them). Every address is its endpoint's own.
func fanoutServices(k, per, endpoints, gen int) string {
	var b strings.Builder
	for i := k * per; i < (k+1)*per; i++ {
		fmt.Fprintf(&b, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc-%[1]d, namespace: load}
spec:
  hosts: [svc-%[1]d.load.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints:
`, i)
		for e := range endpoints {
			fmt.Fprintf(&b, "  - {address: 10.%d.%d.%d, labels: {app: svc-%d}}\n", 1+gen*64+i/256, i%256, 1+e, i)
		}
		b.WriteString("---\n")
	}
	return b.String()
}

// RunFanout measures.
func RunFanout(ctx context.Context, o FanoutOptions) (*FanoutReport, error) {
	if o.Replicas <= 0 || o.Services <= 0 || o.EndpointsEach <= 0 || o.Steps <= 0 || o.Services%o.Steps != 0 {
		return nil, errors.New("replicas, services, endpoints and steps must be positive, and steps divide services")
	}
	if o.EndpointsEach > 250 || o.Services > 64*256 {
		return nil, errors.New("at most 16,384 services of 250 endpoints each")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	per := o.Services / o.Steps
	dir, err := os.MkdirTemp("", "xdsload-fanout-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	for k := range o.Steps {
		if err := writeAtomic(dir, fmt.Sprintf("services-%d.yaml", k), fanoutServices(k, per, o.EndpointsEach, 0)); err != nil {
			return nil, err
		}
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
	r := &FanoutReport{Replicas: o.Replicas, Services: o.Services, Endpoints: o.Services * o.EndpointsEach, Steps: o.Steps, Interval: o.Interval}
	if r.GalleyBaseRSSMiB, err = proc.RSSMiB(galley.Process.Pid); err != nil {
		return nil, err
	}

	began := time.Now()
	replicas, err := startReplicas(ctx, o.Log, o.BinDir, mcpAddr, nil, 0, o.Replicas)
	defer func() {
		for _, rp := range replicas {
			rp.close()
		}
	}()
	if err != nil {
		return nil, err
	}
	// The last service of each step is the one watched: galley reads a
	// file whole, so a replica that holds its new version holds the step.
	watched := make([]string, o.Steps)
	for k := range o.Steps {
		watched[k] = model.ObjectKey("ServiceEntry", "load", fmt.Sprintf("svc-%d", (k+1)*per-1))
	}
	before := make([][]string, o.Steps) // per step, per replica: the version held before the change
	for k := range o.Steps {
		if before[k], err = waitHeld(ctx, replicas, watched[k], nil); err != nil {
			return nil, fmt.Errorf("initial: %w", err)
		}
	}
	r.Initial = time.Since(began)
	fmt.Fprintf(o.Log, "xdsload: %d replicas hold the mesh after %s\n", o.Replicas, r.Initial)

	cpu := func() (g, d float64) {
		g, _ = proc.CPUSeconds(galley.Process.Pid)
		for _, rp := range replicas {
			c, _ := proc.CPUSeconds(rp.cmd.Process.Pid)
			d += c
		}
		return g, d
	}
	g0, d0 := cpu()
	t0 := time.Now()
	writes := make([]time.Time, o.Steps)
	held := make([]chan error, o.Steps)
	r.Step = make([]time.Duration, o.Steps)
	for k := range o.Steps {
		if k > 0 {
			if err := sleep(ctx, o.Interval); err != nil {
				return nil, err
			}
		}
		writes[k] = time.Now()
		if err := writeAtomic(dir, fmt.Sprintf("services-%d.yaml", k), fanoutServices(k, per, o.EndpointsEach, 1)); err != nil {
			return nil, err
		}
		held[k] = make(chan error, 1)
		go func() {
			_, err := waitHeld(ctx, replicas, watched[k], before[k])
			r.Step[k] = time.Since(writes[k])
			held[k] <- err
		}()
	}
	for k := range o.Steps {
		if err := <-held[k]; err != nil {
			return nil, fmt.Errorf("step %d: %w", k+1, err)
		}
	}
	r.Total = time.Since(t0)
	g1, d1 := cpu()
	r.GalleyCPU, r.DiscoveryCPU = g1-g0, d1-d0
	if err := (profiler{dir: o.ProfileDir, admin: galleyAdmin}).save(ctx, "galley-heap.pb.gz", "heap?gc=1"); err != nil {
		return nil, err
	}
	if r.GalleyRSSMiB, err = proc.RSSMiB(galley.Process.Pid); err != nil {
		return nil, err
	}
	r.PerSubscriberKiB = (r.GalleyRSSMiB - r.GalleyBaseRSSMiB) * 1024 / float64(o.Replicas)
	for _, rp := range replicas {
		m, err := proc.RSSMiB(rp.cmd.Process.Pid)
		if err != nil {
			return nil, err
		}
		r.DiscoveryRSSMiB += m / float64(len(replicas))
	}
	return r, nil
}

// replica is one discovery process, its addresses, and a connection to
// its xDS port (debug types).
type replica struct {
	cmd            *exec.Cmd
	xdsAddr, admin string
	cc             *grpc.ClientConn
}

func (rp replica) close() {
	if rp.cc != nil {
		_ = rp.cc.Close()
	}
	stop(rp.cmd)
}

// startGalley starts galley in file mode, reading dir, and waits until
// it is ready.
func startGalley(ctx context.Context, log io.Writer, binDir, dir, mcpAddr, admin string) (*exec.Cmd, error) {
	cmd, err := start(ctx, log, nil, filepath.Join(binDir, "flotilla-galley"),
		"--config-dir", dir, "--mcp-address", mcpAddr, "--admin-address", admin, "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, admin); err != nil {
		stop(cmd)
		return nil, fmt.Errorf("galley: %w", err)
	}
	return cmd, nil
}

// startReplicas starts n discovery processes (replicas first …
// first+n-1, by name), subscribed to galley at mcpAddr with env added
// to their environment and the extra flags, and waits until each is ready. It returns those started, also
// on error, for the caller to stop.
func startReplicas(ctx context.Context, log io.Writer, binDir, mcpAddr string, env []string, first, n int, extra ...string) ([]replica, error) {
	var out []replica
	for i := first; i < first+n; i++ {
		addrs, err := freeAddrs(2)
		if err != nil {
			return out, err
		}
		xdsAddr, admin := addrs[0], addrs[1]
		args := append([]string{
			"--replica-name", fmt.Sprintf("replica-%d", i),
			"--galley-address", mcpAddr, "--xds-address", xdsAddr, "--admin-address", admin, "--log-level", "warn",
			"--xds-max-connections-per-peer", "0", // thousands of proxies from one address: this machine
		}, extra...)
		cmd, err := start(ctx, log, env, filepath.Join(binDir, "flotilla-discovery"), args...)
		if err != nil {
			return out, err
		}
		cc, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(512<<20)))
		out = append(out, replica{cmd: cmd, xdsAddr: xdsAddr, admin: admin, cc: cc})
		if err != nil {
			return out, err
		}
	}
	for _, rp := range out[max(0, len(out)-n):] {
		if err := waitReady(ctx, rp.admin); err != nil {
			return out, fmt.Errorf("discovery replica at %s: %w", rp.xdsAddr, err)
		}
	}
	return out, nil
}

// waitHeld waits until every replica holds a version of object other
// than the one it held before (nil: any version), and returns the
// versions they hold. It polls each replica's distribution (what
// flotilla wait reads) every 20 ms, for at most 2 minutes.
func waitHeld(ctx context.Context, replicas []replica, object string, before []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out := make([]string, len(replicas))
	for i, rp := range replicas {
		for {
			resp, err := debugapi.Fetch(ctx, rp.cc, debugapi.Distribution, object)
			if err == nil {
				d, derr := debugapi.DistributionOf(resp)
				if derr != nil {
					return nil, fmt.Errorf("replica %d: %w", i, derr)
				}
				if v, ok := d.Latest(); ok && (before == nil || v != before[i]) {
					out[i] = v
					break
				}
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("replica %d does not hold a new version of %s: %w", i, object, errors.Join(ctx.Err(), err))
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return out, nil
}
