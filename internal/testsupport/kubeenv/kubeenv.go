// Package kubeenv runs a real kube-apiserver and etcd on loopback for tests,
// the way controller-runtime's envtest does: as child processes built once
// from tools/kube (`make kube-assets`), so no service module links the
// apiserver. Tests get an admin *rest.Config and helpers for what a bare
// apiserver lacks (no controller-manager runs): namespaces with their
// default ServiceAccount, CRDs waited to Established, ServiceAccount tokens.
//
// With Options.Cluster it runs a whole cluster instead: kube-controller-manager,
// kube-scheduler and kwok's simulated nodes as child processes too, so
// Deployments become Ready pods with IPs and the real controllers publish
// their EndpointSlices. RunInNetworkNamespace gives a test binary a network
// namespace where the pods' addresses are local, so a process can serve at
// a pod's IP and the apiserver reach it there.
//
// The apiserver is quiet unless Options.Verbose, FLOTILLA_KUBEENV_VERBOSE=1 or
// the test flag -kubeenv.verbose (see RunTests) is set; its log is kept in the environment's directory and its tail is
// included in start-up errors.
package kubeenv

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/flotilla-mesh/flotilla/internal/testsupport/testpki"
)

// Environment variables read by Start.
const (
	// AssetsEnv names a directory holding kube-apiserver and etcd.
	AssetsEnv = "FLOTILLA_KUBE_ASSETS"
	// VerboseEnv, set to 1, streams the servers' logs to stderr.
	VerboseEnv = "FLOTILLA_KUBEENV_VERBOSE"
)

// Options configures Start.
type Options struct {
	// BinDir holds the kube-apiserver and etcd binaries. Default: $FLOTILLA_KUBE_ASSETS,
	// else bin/tools in the repository containing the working directory.
	BinDir string
	// Verbose streams the servers' logs to stderr.
	Verbose bool
	// StartTimeout bounds the wait for the apiserver (and the cluster's
	// nodes) to become ready. Default 90s.
	StartTimeout time.Duration
	// Cluster, when set, runs the rest of a cluster too: the controller
	// manager, the scheduler and kwok's simulated nodes.
	Cluster *ClusterOptions
}

// Env is a running apiserver with its etcd.
type Env struct {
	// Config authenticates as a cluster admin (system:masters).
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// CA is the authority that signed the apiserver's serving certificate.
	CA *testpki.CA

	dir               string
	etcd              *process
	apiserver         *process
	controllerManager *process
	scheduler         *process
	kwok              *process
	proxy             *process
	dns               *hostsWriter
	verbose           bool
	restarts          int
}

// Start launches etcd and kube-apiserver on free loopback ports and waits
// until the apiserver reports ready.
func Start(ctx context.Context, o Options) (env *Env, err error) {
	if o.StartTimeout == 0 {
		o.StartTimeout = 90 * time.Second
	}
	if os.Getenv(VerboseEnv) == "1" {
		o.Verbose = true
	}
	bin, err := binDir(o.BinDir, o.Cluster != nil)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kubeenv-")
	if err != nil {
		return nil, fmt.Errorf("kubeenv scratch dir: %w", err)
	}
	e := &Env{dir: dir, verbose: o.Verbose}
	defer func() {
		if err != nil {
			_ = e.Stop()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, o.StartTimeout)
	defer cancel()

	etcdPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	e.etcd, err = startProcess(filepath.Join(bin, "etcd"), filepath.Join(dir, "etcd.log"), o.Verbose,
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-url", etcdURL,
		"--listen-peer-url", "http://127.0.0.1:"+strconv.Itoa(peerPort))
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, http.DefaultClient, etcdURL+"/health", "", e.etcd); err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}

	args, token, err := e.prepareAPIServer(etcdURL)
	if err != nil {
		return nil, err
	}
	if o.Cluster != nil {
		// Webhooks and aggregated APIs reached at their Services'
		// endpoints (the pods' IPs), not their cluster IPs: there is no
		// kube-proxy to route those.
		args = append(args, "--enable-aggregator-routing=true")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args = append(args, "--secure-port", strconv.Itoa(port))
	e.apiserver, err = startProcess(filepath.Join(bin, "kube-apiserver"), filepath.Join(dir, "kube-apiserver.log"), o.Verbose, args...)
	if err != nil {
		return nil, err
	}
	host := "https://127.0.0.1:" + strconv.Itoa(port)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.CA.Pool(), MinVersion: tls.VersionTLS12}}}
	// /readyz, not /healthz: the RBAC bootstrap hooks finish after the port opens.
	if err := waitHTTP(ctx, hc, host+"/readyz", token, e.apiserver); err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	e.Config = &rest.Config{
		Host:            host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: e.CA.CertPEM},
		QPS:             200,
		Burst:           400,
	}
	if e.Client, err = kubernetes.NewForConfig(e.Config); err != nil {
		return nil, fmt.Errorf("clientset: %w", err)
	}
	if o.Cluster != nil {
		if err := e.startCluster(ctx, bin, o.Cluster, o.Verbose); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// RestartAPIServer stops kube-apiserver (SIGTERM, as a rolling restart of
// the control plane does) and starts it again with the same arguments and
// port, then waits until it is ready. Clients see their connections and
// watches end and must reconnect, relist or resume.
func (e *Env) RestartAPIServer(ctx context.Context) error {
	old := e.apiserver
	if err := old.stop(); err != nil {
		return fmt.Errorf("stop kube-apiserver: %w", err)
	}
	e.restarts++
	p, err := startProcess(old.cmd.Path, filepath.Join(e.dir, fmt.Sprintf("kube-apiserver-%d.log", e.restarts)), e.verbose, old.cmd.Args[1:]...)
	if err != nil {
		return err
	}
	e.apiserver = p
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.CA.Pool(), MinVersion: tls.VersionTLS12}}}
	if err := waitHTTP(ctx, hc, e.Config.Host+"/readyz", e.Config.BearerToken, p); err != nil {
		return fmt.Errorf("kube-apiserver restarted: %w", err)
	}
	return nil
}

// prepareAPIServer writes certificates, keys and the admin token file and
// returns the apiserver's arguments (without the port) and the admin token.
func (e *Env) prepareAPIServer(etcdURL string) (args []string, token string, err error) {
	if e.CA, err = testpki.NewCA("kubeenv apiserver CA"); err != nil {
		return nil, "", err
	}
	serving, err := e.CA.Issue(testpki.Request{
		CommonName: "kube-apiserver",
		DNSNames:   []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPs:        []net.IP{net.IPv4(127, 0, 0, 1)},
		TTL:        24 * time.Hour,
	})
	if err != nil {
		return nil, "", err
	}
	certDir := filepath.Join(e.dir, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, "", fmt.Errorf("cert dir: %w", err)
	}
	certFile, keyFile, err := serving.WriteFiles(certDir)
	if err != nil {
		return nil, "", err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", fmt.Errorf("service account key: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, "", fmt.Errorf("service account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, "", fmt.Errorf("service account key: %w", err)
	}
	saKeyFile, saPubFile := filepath.Join(certDir, "sa.key"), filepath.Join(certDir, "sa.pub")
	if err := os.WriteFile(saKeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, "", fmt.Errorf("write sa key: %w", err)
	}
	if err := os.WriteFile(saPubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		return nil, "", fmt.Errorf("write sa public key: %w", err)
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return nil, "", fmt.Errorf("admin token: %w", err)
	}
	token = hex.EncodeToString(raw)
	tokenFile := filepath.Join(certDir, "tokens.csv")
	line := token + `,kubeenv-admin,kubeenv-admin,"system:masters"` + "\n"
	if err := os.WriteFile(tokenFile, []byte(line), 0o600); err != nil {
		return nil, "", fmt.Errorf("write token file: %w", err)
	}
	args = []string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		// No kubernetes Service endpoints for a loopback address (the
		// reconciler refuses them); nothing in-cluster needs them here.
		"--endpoint-reconciler-type", "none",
		"--cert-dir", certDir,
		"--tls-cert-file", certFile,
		"--tls-private-key-file", keyFile,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saPubFile,
		"--service-account-signing-key-file", saKeyFile,
		"--authorization-mode", "RBAC",
		"--token-auth-file", tokenFile,
		"--service-cluster-ip-range", ServiceNetwork,
		"--allow-privileged=true",
		"--v", "0",
	}
	return args, token, nil
}

// Stop ends every server it started and removes the scratch directory.
func (e *Env) Stop() error {
	var errs []error
	if e.dns != nil {
		e.dns.stop()
	}
	for _, p := range []*process{e.proxy, e.kwok, e.scheduler, e.controllerManager} {
		if p != nil {
			errs = append(errs, p.stop())
		}
	}
	if e.apiserver != nil {
		errs = append(errs, e.apiserver.stop())
	}
	if e.etcd != nil {
		errs = append(errs, e.etcd.stop())
	}
	if e.dir != "" {
		errs = append(errs, os.RemoveAll(e.dir))
	}
	return errors.Join(errs...)
}

// Dir is a scratch directory removed by Stop.
func (e *Env) Dir() string { return e.dir }

func binDir(dir string, cluster bool) (string, error) {
	if dir == "" {
		dir = os.Getenv(AssetsEnv)
	}
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "bin", "tools")
	}
	need := []string{"kube-apiserver", "etcd"}
	if cluster {
		need = append(need, clusterBinaries...)
	}
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s not found in %s (run `make kube-assets`, or set %s): %w", b, dir, AssetsEnv, err)
		}
	}
	return dir, nil
}

// repoRoot finds the directory holding go.work above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.work above the working directory; set %s", AssetsEnv)
		}
		dir = parent
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// process is a server child process.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	exited  chan struct{}
	err     error
}

func startProcess(path, logPath string, verbose bool, args ...string) (*process, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("log file: %w", err)
	}
	cmd := exec.Command(path, args...)
	var out io.Writer = f
	if verbose {
		out = io.MultiWriter(f, os.Stderr)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	p := &process{name: filepath.Base(path), cmd: cmd, logPath: logPath, logFile: f, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.exited)
	}()
	return p, nil
}

func (p *process) stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	return nil
}

// logTail returns the last lines of the process's log.
func (p *process) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// waitHTTP polls url until it answers 200, the process exits, or ctx ends.
func waitHTTP(ctx context.Context, hc *http.Client, url, token string, p *process) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("probe %s: %w", url, err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("%s answered %s", url, resp.Status)
		} else {
			last = err
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited (%w) before it was ready; log tail:\n%s", p.name, p.err, p.logTail())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last: %w); log tail:\n%s", p.name, ctx.Err(), last, p.logTail())
		case <-tick.C:
		}
	}
}
