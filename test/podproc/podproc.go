// Package podproc is the tests' kubelet for Flotilla's own pods: kwok's
// simulated nodes run no containers, so a pod of the chart's is run here
// as a process of the binary built from this tree that its image names,
// with what the pod gives its container — its command and arguments, its
// environment (values, field and resource references, ConfigMap and
// Secret keys), its volumes at their mount paths (projected service
// account tokens bound to the pod, ConfigMaps, Secrets, emptyDirs) and
// the in-cluster service account credentials a kubelet mounts, so the
// service reaches the apiserver as the pod's service account, exactly as
// it would in a cluster.
//
// Each process runs in a mount and a UTS namespace of its own (`unshare
// --mount --uts`): its hostname is the pod's name, and a tmpfs over /run
// (/var/run) holds its volumes, bind-mounted, so paths are the pod's.
// What differs from a kubelet, and why: pods share the network namespace
// of the tests (RunInNetworkNamespace), so a listen address of the form ":port" is given the pod's IP (":15012"
// becomes "10.244.1.7:15012") and two replicas do not collide; the
// apiserver is reached at its loopback address (KUBERNETES_SERVICE_HOST),
// not through the kubernetes Service; ConfigMap and Secret volumes are
// written once when the process starts (a kubelet refreshes them), and
// probes are not run (kwok reports the pods Ready).
package podproc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Runner starts pods' containers as processes.
type Runner struct {
	// Client reads what the pods refer to and mints their tokens.
	Client kubernetes.Interface
	// APIServer is the apiserver's URL, given to the pods as their
	// in-cluster configuration (KUBERNETES_SERVICE_HOST and _PORT).
	APIServer string
	// Bin holds the binaries, named as the images' repositories
	// ("flotilla-galley" for "registry/flotilla-galley:v1").
	Bin string
	// Dir is where each pod's volumes and log are kept (Dir/<pod>).
	Dir string
	// Images describe what an image holds besides its binary, by image
	// repository ("proxyv2"): its working directory and files. An image
	// not named here is a binary on its own (Flotilla's, FROM scratch).
	Images map[string]Image
}

// Image is what a container's image holds besides its entrypoint.
type Image struct {
	// WorkDir is the image's working directory (Docker's WORKDIR): the
	// process starts there, and paths it takes as relative are the pod's.
	WorkDir string
	// Files are files the image holds: path in the image to the file on
	// this machine that stands for it.
	Files map[string]string
}

// Process is a pod's container running as a process.
type Process struct {
	// Pod is the pod as it was when its process started.
	Pod *corev1.Pod
	// Dir holds its volumes and its log (Dir/log).
	Dir string

	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
	mu     sync.Mutex
	err    error
}

// Start runs pod's first container. The pod must have an IP; a
// ConfigMap or Secret it needs that does not exist yet is waited for
// until ctx ends, as a kubelet leaves such a pod ContainerCreating.
func (r *Runner) Start(ctx context.Context, pod *corev1.Pod) (*Process, error) {
	if len(pod.Spec.Containers) == 0 {
		return nil, fmt.Errorf("pod %s/%s has no container", pod.Namespace, pod.Name)
	}
	return r.StartContainer(ctx, pod, pod.Spec.Containers[0].Name)
}

// StartContainer runs the pod's container of that name, as Start does
// its first (an injected sidecar, istio-proxy, beside an application
// that is not run here).
func (r *Runner) StartContainer(ctx context.Context, pod *corev1.Pod, name string) (*Process, error) {
	if pod.Status.PodIP == "" {
		return nil, fmt.Errorf("pod %s/%s has no IP yet", pod.Namespace, pod.Name)
	}
	i := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("pod %s/%s has no container %s", pod.Namespace, pod.Name, name)
	}
	c := pod.Spec.Containers[i]
	image := r.Images[imageRepository(c.Image)]
	bin := filepath.Join(r.Bin, imageRepository(c.Image))
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("pod %s/%s: no binary for image %s: %w", pod.Namespace, pod.Name, c.Image, err)
	}
	dir := filepath.Join(r.Dir, pod.Namespace+"_"+pod.Name+"_"+c.Name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("pod dir: %w", err)
	}
	mounts, err := r.volumes(ctx, pod, c, dir)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	for target, source := range image.Files {
		mounts = append(mounts, mount{source, target})
	}
	script, err := mountScript(mounts, hostMounts())
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if workDir := cmp.Or(c.WorkingDir, image.WorkDir); workDir != "" {
		script += "cd " + shellQuote(workDir) + "\n"
	}
	env, err := r.environment(ctx, pod, c)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	argv := make([]string, 0, len(c.Command)+len(c.Args))
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		argv = append(argv, PodAddress(expand(a, env), pod.Status.PodIP))
	}
	if len(c.Command) > 0 {
		// The image's entrypoint is the binary; a command replaces it.
		bin, argv = filepath.Join(r.Bin, path.Base(c.Command[0])), argv[1:]
	}
	log, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		return nil, fmt.Errorf("pod log: %w", err)
	}
	// sh sets up the mount and UTS namespaces unshare made (the pod's
	// hostname is its name, which the services take as their identity in
	// leader elections and to galley), then becomes the binary: $0 is the
	// binary, "$@" its arguments.
	script = "hostname " + shellQuote(pod.Name) + "\n" + script + `exec "$0" "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--uts", "--propagation", "private", "--", "sh", "-ec", script, bin}, argv...)...)
	cmd.Env = environ(env)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("pod %s/%s: start %s: %w", pod.Namespace, pod.Name, bin, err)
	}
	p := &Process{Pod: pod.DeepCopy(), Dir: dir, cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.exited)
	}()
	return p, nil
}

// imageRepository is an image reference's last path element without its
// tag or digest: "reg.example/flotilla-ca:v1" is "flotilla-ca".
func imageRepository(image string) string {
	if i := strings.IndexByte(image, '@'); i >= 0 {
		image = image[:i]
	}
	base := path.Base(image)
	if i := strings.IndexByte(base, ':'); i >= 0 {
		base = base[:i]
	}
	return base
}

var listenAddress = regexp.MustCompile(`^(-{1,2}[A-Za-z0-9-]+=)?:([0-9]{1,5})$`)

// PodAddress gives a listen address of the form ":port" (alone or as a
// flag's value) the pod's IP, so that pods sharing one network namespace
// do not collide; anything else is returned as it is.
func PodAddress(arg, podIP string) string {
	m := listenAddress.FindStringSubmatch(arg)
	if m == nil {
		return arg
	}
	return m[1] + net.JoinHostPort(podIP, m[2])
}

// mount is a directory or file of the pod's own bind-mounted at a path.
type mount struct{ source, target string }

// mountScript makes the pod's paths in the process's mount namespace: a
// tmpfs over /run (where a kubelet's mounts go), then each mount. A mount
// point outside /run that this machine does not have (an image's own
// directory: /etc/istio, /var/lib/istio) is made in an overlay of its
// nearest directory that exists, whose upper layer is in the tmpfs, so
// nothing is written to this machine; the mounts already under that
// directory (hostMounts: /etc/hosts, the tests' cluster DNS) are put back
// over the overlay.
func mountScript(mounts []mount, host []string) (string, error) {
	var b strings.Builder
	b.WriteString("mount -t tmpfs -o mode=0755 tmpfs /run\n")
	overlaid := map[string]bool{}
	for _, m := range mounts {
		if strings.HasPrefix(m.target, "/run/") || strings.HasPrefix(m.target, "/var/run/") {
			continue
		}
		if _, err := os.Stat(m.target); err == nil {
			continue
		}
		base := path.Dir(m.target)
		for ; base != "/"; base = path.Dir(base) {
			if _, err := os.Stat(base); err == nil {
				break
			}
		}
		if base == "/" || overlaid[base] {
			if base == "/" {
				return "", fmt.Errorf("mount point %s: no directory above it but / to lay an overlay on", m.target)
			}
			continue
		}
		overlaid[base] = true
		layer := "/run/.image/" + strconv.Itoa(len(overlaid))
		fmt.Fprintf(&b, "mkdir -p %s/upper %s/work %s/keep\n", layer, layer, layer)
		var kept []string
		for _, h := range host {
			if strings.HasPrefix(h, base+"/") {
				keep := fmt.Sprintf("%s/keep/%d", layer, len(kept))
				fmt.Fprintf(&b, "if [ -d %[1]s ]; then mkdir %[2]s; else : > %[2]s; fi; mount --bind %[1]s %[2]s\n", shellQuote(h), keep)
				kept = append(kept, keep)
			}
		}
		fmt.Fprintf(&b, "mount -t overlay overlay -o lowerdir=%[1]s,upperdir=%[2]s/upper,workdir=%[2]s/work %[1]s\n", base, layer)
		n := 0
		for _, h := range host {
			if strings.HasPrefix(h, base+"/") {
				fmt.Fprintf(&b, "mount --bind %s/keep/%d %s\n", layer, n, shellQuote(h))
				n++
			}
		}
	}
	for _, m := range mounts {
		if fi, err := os.Stat(m.source); err == nil && !fi.IsDir() {
			fmt.Fprintf(&b, "mkdir -p %s && { [ -e %s ] || : > %s; }\n", shellQuote(path.Dir(m.target)), shellQuote(m.target), shellQuote(m.target))
		} else {
			fmt.Fprintf(&b, "mkdir -p %s\n", shellQuote(m.target))
		}
		fmt.Fprintf(&b, "mount --bind %s %s\n", shellQuote(m.source), shellQuote(m.target))
	}
	return b.String(), nil
}

// hostMounts are the mount points of this process's mount namespace
// (/proc/self/mountinfo), which a pod's process starts with.
func hostMounts() []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			out = append(out, unescapeMountinfo(f[4]))
		}
	}
	return out
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// volumes writes the container's volumes under dir and says where each
// is mounted. The in-cluster credentials are among them: the apiserver's
// ServiceAccount admission gives a pod a projected volume (token,
// kube-root-ca.crt, namespace) mounted at
// /var/run/secrets/kubernetes.io/serviceaccount.
func (r *Runner) volumes(ctx context.Context, pod *corev1.Pod, c corev1.Container, dir string) ([]mount, error) {
	var mounts []mount
	byName := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		byName[v.Name] = v
	}
	written := map[string]string{}
	for _, vm := range c.VolumeMounts {
		v, ok := byName[vm.Name]
		if !ok {
			return nil, fmt.Errorf("volume mount %s: no such volume", vm.Name)
		}
		src, ok := written[v.Name]
		if !ok {
			src = filepath.Join(dir, "volumes", v.Name)
			files, err := r.volumeFiles(ctx, pod, v)
			if err != nil {
				return nil, fmt.Errorf("volume %s: %w", v.Name, err)
			}
			if err := writeFiles(src, files); err != nil {
				return nil, err
			}
			written[v.Name] = src
		}
		if vm.SubPath != "" {
			src = filepath.Join(src, filepath.Clean("/"+vm.SubPath))
		}
		mounts = append(mounts, mount{src, vm.MountPath})
	}
	return mounts, nil
}

// volumeFiles is a volume's content: file paths within it and their
// bytes.
func (r *Runner) volumeFiles(ctx context.Context, pod *corev1.Pod, v corev1.Volume) (map[string][]byte, error) {
	switch {
	case v.EmptyDir != nil:
		return map[string][]byte{}, nil
	case v.ConfigMap != nil:
		return r.configMapFiles(ctx, pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional)
	case v.Secret != nil:
		return r.secretFiles(ctx, pod.Namespace, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional)
	case v.DownwardAPI != nil:
		return downwardFiles(pod, v.DownwardAPI.Items)
	case v.Projected != nil:
		files := map[string][]byte{}
		for _, s := range v.Projected.Sources {
			var part map[string][]byte
			var err error
			switch {
			case s.ServiceAccountToken != nil:
				t := s.ServiceAccountToken
				secs := int64(3600)
				if t.ExpirationSeconds != nil {
					secs = *t.ExpirationSeconds
				}
				var aud []string
				if t.Audience != "" {
					aud = []string{t.Audience}
				}
				var token string
				token, err = r.token(ctx, pod, aud, secs)
				part = map[string][]byte{t.Path: []byte(token)}
			case s.ConfigMap != nil:
				part, err = r.configMapFiles(ctx, pod.Namespace, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional)
			case s.Secret != nil:
				part, err = r.secretFiles(ctx, pod.Namespace, s.Secret.Name, s.Secret.Items, s.Secret.Optional)
			case s.DownwardAPI != nil:
				part, err = downwardFiles(pod, s.DownwardAPI.Items)
			default:
				err = errors.New("a projected source other than serviceAccountToken, configMap, secret or downwardAPI")
			}
			if err != nil {
				return nil, err
			}
			for k, b := range part {
				files[k] = b
			}
		}
		return files, nil
	default:
		return nil, errors.New("only emptyDir, configMap, secret, downwardAPI and projected volumes are run here")
	}
}

// downwardFiles are a downward API volume's files (pod fields only).
func downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, it := range items {
		if it.FieldRef == nil {
			return nil, fmt.Errorf("downward API file %s: only fieldRef is run here", it.Path)
		}
		v, err := fieldValue(pod, it.FieldRef.FieldPath)
		if err != nil {
			return nil, fmt.Errorf("downward API file %s: %w", it.Path, err)
		}
		files[it.Path] = []byte(v)
	}
	return files, nil
}

// token mints a token of the pod's service account bound to the pod, as
// a kubelet does for a projected volume (no audience: the apiserver's).
func (r *Runner) token(ctx context.Context, pod *corev1.Pod, audiences []string, seconds int64) (string, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := r.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{
			Audiences: audiences, ExpirationSeconds: &seconds,
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of %s/%s for %v: %w", pod.Namespace, sa, audiences, err)
	}
	return tr.Status.Token, nil
}

// waitFor gets an object a pod needs, waiting while it does not exist
// unless it is optional (then nil, nil).
func waitFor[T any](ctx context.Context, what string, optional *bool, get func(context.Context) (*T, error)) (*T, error) {
	var got *T
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		o, err := get(ctx)
		switch {
		case err == nil:
			got = o
			return true, nil
		case apierrors.IsNotFound(err) && optional != nil && *optional:
			return true, nil
		case apierrors.IsNotFound(err):
			return false, nil
		default:
			return false, err
		}
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return got, nil
}

func (r *Runner) configMapFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool) (map[string][]byte, error) {
	cm, err := waitFor(ctx, "ConfigMap "+ns+"/"+name, optional, func(ctx context.Context) (*corev1.ConfigMap, error) {
		return r.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	})
	if err != nil || cm == nil {
		return map[string][]byte{}, err
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return pick(data, items, "ConfigMap "+ns+"/"+name)
}

func (r *Runner) secretFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool) (map[string][]byte, error) {
	s, err := waitFor(ctx, "Secret "+ns+"/"+name, optional, func(ctx context.Context) (*corev1.Secret, error) {
		return r.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	})
	if err != nil || s == nil {
		return map[string][]byte{}, err
	}
	return pick(s.Data, items, "Secret "+ns+"/"+name)
}

// pick is every key as a file, or only items at their paths.
func pick(data map[string][]byte, items []corev1.KeyToPath, what string) (map[string][]byte, error) {
	if len(items) == 0 {
		return data, nil
	}
	out := map[string][]byte{}
	for _, it := range items {
		b, ok := data[it.Key]
		if !ok {
			return nil, fmt.Errorf("%s has no key %q", what, it.Key)
		}
		out[it.Path] = b
	}
	return out, nil
}

// writeFiles writes files (paths relative to dir, kept inside it).
func writeFiles(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("volume dir: %w", err)
	}
	for name, b := range files {
		p := filepath.Join(dir, filepath.Clean("/"+name))
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			return fmt.Errorf("volume dir: %w", err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return fmt.Errorf("volume file: %w", err)
		}
	}
	return nil
}

// environment is the container's environment as a kubelet gives it: the
// in-cluster apiserver address, then the container's variables in order
// (each may refer to earlier ones as $(NAME)).
func (r *Runner) environment(ctx context.Context, pod *corev1.Pod, c corev1.Container) ([][2]string, error) {
	u, err := url.Parse(r.APIServer)
	if err != nil {
		return nil, fmt.Errorf("apiserver URL: %w", err)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("apiserver URL: %w", err)
	}
	env := [][2]string{
		{"PATH", os.Getenv("PATH")},
		{"HOSTNAME", pod.Name},
		{"KUBERNETES_SERVICE_HOST", host},
		{"KUBERNETES_SERVICE_PORT", port},
	}
	if len(c.EnvFrom) > 0 {
		return nil, errors.New("envFrom is not run here")
	}
	for _, e := range c.Env {
		v := expand(e.Value, env)
		if f := e.ValueFrom; f != nil {
			switch {
			case f.FieldRef != nil:
				v, err = fieldValue(pod, f.FieldRef.FieldPath)
			case f.ResourceFieldRef != nil:
				v, err = resourceValue(c, f.ResourceFieldRef)
			case f.ConfigMapKeyRef != nil:
				v, err = r.configMapKey(ctx, pod.Namespace, f.ConfigMapKeyRef)
			case f.SecretKeyRef != nil:
				v, err = r.secretKey(ctx, pod.Namespace, f.SecretKeyRef)
			}
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
		}
		env = append(env, [2]string{e.Name, v})
	}
	return env, nil
}

func (r *Runner) configMapKey(ctx context.Context, ns string, ref *corev1.ConfigMapKeySelector) (string, error) {
	files, err := r.configMapFiles(ctx, ns, ref.Name, nil, ref.Optional)
	if err != nil {
		return "", err
	}
	return string(files[ref.Key]), nil
}

func (r *Runner) secretKey(ctx context.Context, ns string, ref *corev1.SecretKeySelector) (string, error) {
	files, err := r.secretFiles(ctx, ns, ref.Name, nil, ref.Optional)
	if err != nil {
		return "", err
	}
	return string(files[ref.Key]), nil
}

var labelRef = regexp.MustCompile(`^metadata\.(labels|annotations)\['([^']+)'\]$`)

// fieldValue is a downward API field of the pod.
func fieldValue(pod *corev1.Pod, field string) (string, error) {
	switch field {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "metadata.labels":
		return mapFile(pod.Labels), nil
	case "metadata.annotations":
		return mapFile(pod.Annotations), nil
	}
	if m := labelRef.FindStringSubmatch(field); m != nil {
		if m[1] == "labels" {
			return pod.Labels[m[2]], nil
		}
		return pod.Annotations[m[2]], nil
	}
	return "", fmt.Errorf("field %q is not run here", field)
}

// mapFile is labels or annotations as a kubelet writes them into a
// downward API file: key="value" lines in key order, the value quoted as
// Go quotes it (pkg/fieldpath's FormatMap).
func mapFile(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k + "=" + strconv.Quote(m[k]))
	}
	return b.String()
}

// resourceValue is a container's request or limit in the reference's
// divisor (1 by default), rounded up as the kubelet does; an unset limit
// is the node's capacity to a kubelet, and is an error here.
func resourceValue(c corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", fmt.Errorf("resource %q", ref.Resource)
	}
	list := c.Resources.Limits
	if kind == "requests" {
		list = c.Resources.Requests
	}
	q, ok := list[corev1.ResourceName(name)]
	if !ok {
		return "", fmt.Errorf("resource %s is not set on the container", ref.Resource)
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		if name == "cpu" {
			return strconv.FormatInt(q.MilliValue()/1000+min(1, q.MilliValue()%1000), 10), nil
		}
		return strconv.FormatInt(q.Value(), 10), nil
	}
	n := q.MilliValue() / divisor.MilliValue()
	if q.MilliValue()%divisor.MilliValue() != 0 {
		n++
	}
	return strconv.FormatInt(n, 10), nil
}

var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

// expand replaces $(NAME) with the variable's value when it is defined,
// and $$ with $, as the kubelet does for env values, commands and args.
func expand(s string, env [][2]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		name := m[2 : len(m)-1]
		for i := len(env) - 1; i >= 0; i-- {
			if env[i][0] == name {
				return env[i][1]
			}
		}
		return m
	})
}

// environ is env as os/exec wants it, a later definition winning.
func environ(env [][2]string) []string {
	last := map[string]string{}
	for _, kv := range env {
		last[kv[0]] = kv[1]
	}
	out := make([]string, 0, len(last))
	for k, v := range last {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// Pid is the process's ID (the binary's: unshare and sh exec it).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is how the process exited (nil while it runs or after a clean
// exit).
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Log is what the process has printed so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.log.Name())
	return string(b)
}

// Stop ends the process as a kubelet ends a container: SIGTERM, then
// SIGKILL after the pod's grace period (at most grace).
func (p *Process) Stop(grace time.Duration) error {
	if s := p.Pod.Spec.TerminationGracePeriodSeconds; s != nil && time.Duration(*s)*time.Second < grace {
		grace = time.Duration(*s) * time.Second
	}
	defer p.log.Close()
	select {
	case <-p.exited:
		return p.exitErr()
	default:
	}
	// unshare execs sh, which execs the binary: the signal reaches it.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.exitErr()
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("pod %s/%s did not stop within %s of SIGTERM", p.Pod.Namespace, p.Pod.Name, grace)
	}
}

// Kill ends the process at once (SIGKILL), as a crash or an OOM kill.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.log.Close()
}

func (p *Process) exitErr() error {
	err := p.Err()
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) {
		return fmt.Errorf("pod %s/%s exited with %d", p.Pod.Namespace, p.Pod.Name, exit.ExitCode())
	}
	return err
}
