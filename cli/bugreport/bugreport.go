// Package bugreport is `flotilla bug-report`: one archive of what it
// takes to understand a mesh's problem, as istioctl bug-report gathers
// it: every service's and replica's version, the proxies' sync status and
// the configuration discovery gives each, galley's configuration, what it
// refuses and who subscribes, and the control plane's logs (a cluster's
// pods', or make run's files). Secrets stay out: credentials are not
// collected (galley gives them to discovery alone), discovery's dumps
// carry no keys, and every file is scrubbed of PEM private keys and
// bearer tokens before it is written. A step that fails is named in
// errors.txt; the rest is still collected.
package bugreport

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/flotilla-mesh/flotilla/cli/analyze"
	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/cli/proxystatus"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/platform/buildinfo"
)

// Bounds of what one report holds.
const (
	// MaxLogBytes is the most kept of one log (its end).
	MaxLogBytes = 16 << 20
	// MaxLogLines is the most read of one container's log in a cluster.
	MaxLogLines = 20000
)

// NewCommand returns the bug-report command; conn is the root's
// connection flags.
func NewCommand(conn *connect.Options) *cobra.Command {
	var out string
	var maxProxies int
	cmd := &cobra.Command{
		Use:   "bug-report",
		Short: "Gather versions, proxy status, configuration, config dumps and logs into one archive",
		Long: `bug-report writes one gzipped tar archive (default bug-report.tar.gz) of what it takes to understand
a problem, as istioctl bug-report does:
  version.txt              the client's, every discovery replica's and the proxies' versions
  proxy-status.json        every proxy each replica serves, with its sync status
  discovery/<replica>/     each replica's syncz
  proxies/<proxy>.json     the configuration discovery gives each proxy (its config_dump; at most --max-proxies)
  galley/                  galley's configuration as discovery reads it (config.yaml), what it refuses
                           (rejections.json) and who subscribes (subscribers.json)
  logs/                    the control plane's logs: in a cluster its pods' (the last 20000 lines of each
                           container), under make run the files it keeps in .flotilla/logs
  errors.txt               each step that failed, and why
Secrets stay out: credentials are never collected, discovery's dumps carry no private keys, and every
file is scrubbed of PEM private keys and bearer tokens. A step that fails does not stop the others.`,
		Example: `  flotilla bug-report
  flotilla bug-report -o /tmp/mesh-report.tar.gz --kubeconfig ~/.kube/config`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			r := newReport(f, time.Now())
			Collect(cmd.Context(), conn, r, maxProxies)
			files, failed := len(r.names), len(r.errs)
			if err := r.Close(); err != nil {
				_ = f.Close()
				return fmt.Errorf("%s: %w", out, err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("%s: %w", out, err)
			}
			msg := fmt.Sprintf("Wrote %s: %d files", out, files)
			if failed > 0 {
				msg += fmt.Sprintf("; %d steps failed (errors.txt says why)", failed)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), msg)
			return err
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "bug-report.tar.gz", "the archive to write")
	cmd.Flags().IntVar(&maxProxies, "max-proxies", 100, "the most proxies whose configuration is collected")
	return cmd
}

// Report is an archive being written.
type Report struct {
	gz    *gzip.Writer
	tw    *tar.Writer
	now   time.Time
	names []string
	errs  []string
	err   error
}

func newReport(w io.Writer, now time.Time) *Report {
	gz := gzip.NewWriter(w)
	return &Report{gz: gz, tw: tar.NewWriter(gz), now: now}
}

// Add writes one file, scrubbed (Redact), under bug-report/.
func (r *Report) Add(name string, body []byte) {
	if r.err != nil {
		return
	}
	body = Redact(body)
	name = "bug-report/" + name
	if r.err = r.tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(body)), ModTime: r.now, Typeflag: tar.TypeReg}); r.err != nil {
		return
	}
	_, r.err = r.tw.Write(body)
	r.names = append(r.names, name)
}

// Fail records a step that failed.
func (r *Report) Fail(step string, err error) {
	r.errs = append(r.errs, step+": "+err.Error())
}

// Close writes errors.txt and ends the archive.
func (r *Report) Close() error {
	if len(r.errs) > 0 {
		r.Add("errors.txt", []byte(strings.Join(r.errs, "\n")+"\n"))
	}
	return cmp.Or(r.err, r.tw.Close(), r.gz.Close())
}

// privateKey matches a PEM private key block; token a JWT (three
// base64url parts, the first a JSON header).
var (
	privateKey = regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----`)
	token      = regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`)
)

// Redact scrubs PEM private keys and bearer tokens out of b.
func Redact(b []byte) []byte {
	b = privateKey.ReplaceAll(b, []byte("[redacted private key]"))
	return token.ReplaceAll(b, []byte("[redacted token]"))
}

// Collect runs every step into r; each is bounded by conn's timeout.
func Collect(ctx context.Context, conn *connect.Options, r *Report, maxProxies int) {
	var v bytes.Buffer
	fmt.Fprintf(&v, "client version: %s\n", buildinfo.Get())
	if err := proxystatus.PrintVersions(ctx, &v, conn); err != nil {
		r.Fail("versions", err)
	}
	r.Add("version.txt", v.Bytes())
	collectProxies(ctx, conn, r, maxProxies)
	if conn.GalleyKnown() {
		collectGalley(ctx, conn, r)
	}
	collectLogs(ctx, conn, r)
}

func jsonOf(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return []byte(err.Error())
	}
	return append(b, '\n')
}

// fileName makes a proxy's or pod's name a file name.
func fileName(s string) string {
	return strings.Map(func(c rune) rune {
		if c == '/' || c == '\\' || c == 0 {
			return '_'
		}
		return c
	}, s)
}

func collectProxies(ctx context.Context, conn *connect.Options, r *Report, maxProxies int) {
	ctx, cl, done, err := conn.Connect(ctx)
	if err != nil {
		r.Fail("discovery", err)
		return
	}
	defer done()
	for _, a := range cl.FetchAll(ctx, debugapi.Syncz) {
		if a.Err != nil {
			r.Fail("syncz of "+a.Address, a.Err)
			continue
		}
		b, err := protojson.MarshalOptions{Multiline: true}.Marshal(a.Resp)
		if err != nil {
			r.Fail("syncz of "+a.Address, err)
			continue
		}
		r.Add("discovery/"+fileName(cmp.Or(a.Replica.ID, a.Address))+"/syncz.json", b)
	}
	rows, err := cl.Proxies(ctx)
	if err != nil {
		r.Fail("proxy status", err)
	}
	r.Add("proxy-status.json", jsonOf(rows))
	for i, row := range rows {
		if i == maxProxies {
			r.Fail("config dumps", fmt.Errorf("%d more proxies not collected (--max-proxies %d)", len(rows)-maxProxies, maxProxies))
			break
		}
		a := cl.Fetch(ctx, row.Address, debugapi.ConfigDump, row.Proxy.ID)
		if a.Err != nil {
			r.Fail("config dump of "+row.Proxy.ID, a.Err)
			continue
		}
		b, err := protojson.MarshalOptions{Multiline: true}.Marshal(a.Resp)
		if err != nil {
			r.Fail("config dump of "+row.Proxy.ID, err)
			continue
		}
		r.Add("proxies/"+fileName(row.Proxy.ID)+"@"+fileName(row.Replica)+".json", b)
	}
}

func collectGalley(ctx context.Context, conn *connect.Options, r *Report) {
	if _, subs, err := conn.GalleySubscribers(ctx); err != nil {
		r.Fail("galley's subscribers", err)
	} else {
		r.Add("galley/subscribers.json", jsonOf(subs))
	}
	if rej, err := conn.GalleyRejections(ctx); err != nil {
		r.Fail("galley's rejections", err)
	} else {
		r.Add("galley/rejections.json", jsonOf(rej))
	}
	live, err := analyze.FetchLive(ctx, conn)
	if err != nil {
		r.Fail("galley's configuration", err)
		return
	}
	objects, services, endpoints, mesh := live.Store.Contents()
	var docs [][]byte
	for _, o := range objects {
		b, err := objectYAML(o)
		if err != nil {
			r.Fail("galley's configuration: "+o.String(), err)
			continue
		}
		docs = append(docs, b)
	}
	r.Add("galley/config.yaml", bytes.Join(docs, []byte("---\n")))
	r.Add("galley/registry.json", jsonOf(map[string]any{"services": protoList(r, services), "endpoints": protoList(r, endpoints)}))
	if mesh != nil {
		b, err := protojson.MarshalOptions{Multiline: true}.Marshal(mesh)
		if err != nil {
			r.Fail("galley's mesh configuration", err)
		} else {
			r.Add("galley/mesh.json", b)
		}
	}
}

// protoList is ms as JSON; one that does not marshal is named in r's
// errors and left out.
func protoList[T proto.Message](r *Report, ms []T) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(ms))
	for _, m := range ms {
		b, err := protojson.Marshal(m)
		if err != nil {
			r.Fail(fmt.Sprintf("galley's registry: %T", m), err)
			continue
		}
		out = append(out, b)
	}
	return out
}

// objectYAML is an Istio object as a user would write it.
func objectYAML(o *istio.Object) ([]byte, error) {
	spec, err := protojson.Marshal(o.Spec)
	if err != nil {
		return nil, err
	}
	version := ""
	if len(o.Kind.Versions) > 0 {
		version = o.Kind.Versions[0]
	}
	doc := map[string]any{
		"apiVersion": o.Kind.Group + "/" + version,
		"kind":       o.Kind.Kind,
		"metadata":   map[string]any{"name": o.Meta.Name, "namespace": o.Meta.Namespace, "labels": o.Meta.Labels, "annotations": o.Meta.Annotations},
		"spec":       json.RawMessage(spec),
	}
	js, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(js)
}

func collectLogs(ctx context.Context, conn *connect.Options, r *Report) {
	if !conn.Kube.Enabled() {
		dir, ok := conn.LogDir()
		if !ok {
			r.Fail("logs", fmt.Errorf("no log directory in the context file, and no cluster (--kubeconfig): no logs collected"))
			return
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			r.Fail("logs", err)
			return
		}
		for _, e := range entries {
			if e.IsDir() || !strings.Contains(e.Name(), ".log") {
				continue
			}
			b, err := tail(filepath.Join(dir, e.Name()))
			if err != nil {
				r.Fail("log "+e.Name(), err)
				continue
			}
			r.Add("logs/"+e.Name(), b)
		}
		return
	}
	client, err := conn.Kube.Client()
	if err != nil {
		r.Fail("logs", err)
		return
	}
	ns := conn.SystemNamespace()
	pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=flotilla"})
	if err != nil {
		r.Fail("the control plane's pods in "+ns, err)
		return
	}
	lines := int64(MaxLogLines)
	limit := int64(MaxLogBytes)
	for _, p := range pods.Items {
		containers := slices.Concat(p.Spec.InitContainers, p.Spec.Containers)
		for _, c := range containers {
			b, err := client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: &lines, LimitBytes: &limit}).DoRaw(ctx)
			if err != nil {
				r.Fail("log of "+p.Name+"/"+c.Name, err)
				continue
			}
			r.Add("logs/"+fileName(p.Name)+"/"+fileName(c.Name)+".log", b)
		}
	}
}

// tail is the last MaxLogBytes of a file.
func tail(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > MaxLogBytes {
		if _, err := f.Seek(st.Size()-MaxLogBytes, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, MaxLogBytes))
}
