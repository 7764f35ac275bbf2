package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	networking "istio.io/api/networking/v1alpha3"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/inject"
	"github.com/flotilla-mesh/flotilla/internal/istio"
	"github.com/flotilla-mesh/flotilla/internal/validation"
)

// Where the control plane keeps what the files are made of.
const (
	meshConfigMap  = "istio"
	meshKey        = "mesh"
	rootsConfigMap = "istio-ca-root-cert"
	rootsKey       = "root-cert.pem"
	// tokenAudience is the audience ca accepts (Istio's istio-ca).
	tokenAudience = "istio-ca"
	// maxGroupBytes bounds a WorkloadGroup file.
	maxGroupBytes = 1 << 20
)

// Options are the command's flags.
type Options struct {
	File, Name, Namespace, Output string
	ClusterID, Revision           string
	TokenDuration                 int64
	IngressService, IngressIP     string
	InternalIP, ExternalIP        string
	AutoRegister, CaptureDNS      bool
}

// NewCommand returns `workload`, with `entry configure`.
func NewCommand(conn *connect.Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "workload",
		Short:   "Workloads outside the cluster (VMs) that join the mesh with a WorkloadGroup, as istioctl x workload",
		Example: "  flotilla x workload entry configure -f workloadgroup.yaml -o vm-files --autoregister",
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	entry := &cobra.Command{
		Use:     "entry",
		Short:   "A workload's WorkloadEntry and the files that make it",
		Example: "  flotilla x workload entry configure --name legacy --namespace vm -o vm-files --ingressIP 203.0.113.7",
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	entry.AddCommand(configureCommand(conn))
	cmd.AddCommand(entry)
	return cmd
}

func configureCommand(conn *connect.Options) *cobra.Command {
	var o Options
	cmd := &cobra.Command{
		Use:   "configure",
		Short: "Write the files a VM needs to join the mesh as one of a WorkloadGroup's workloads",
		Long: `configure writes, for a WorkloadGroup read from a file (-f) or from the cluster (--name, --namespace), the files
istioctl x workload entry configure writes, into --output:
  cluster.env    the agent's environment (systemd's EnvironmentFile): the proxy metadata, the capture's ports,
                 and where discovery and ca are (DISCOVERY_ADDRESS, CA_ADDRESS: Flotilla's agent reaches each);
  mesh.yaml      the mesh configuration's defaultConfig, with the group's proxy.istio.io/config, its probe as
                 readinessProbe (the agent reports the workload's health from it) and the workload's identity;
  root-cert.pem  the mesh's roots (the istio-ca-root-cert ConfigMap of the group's namespace);
  istio-token    a token of the group's service account for ca (audience istio-ca, --tokenDuration);
  hosts          discovery's and ca's names at --ingressIP (else the --ingressService's address), for /etc/hosts.
The cluster is the kubeconfig's (--kubeconfig, --context); the control plane's namespace is --istio-namespace.
deploy/vm says where the files go on the VM and runs flotilla-agent (or Istio's agent) with them.`,
		Example: `  flotilla x workload entry configure -f workloadgroup.yaml -o vm-files --autoregister
  flotilla x workload entry configure --name legacy --namespace vm -o vm-files --ingressIP 203.0.113.7`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.File == "" && (o.Name == "" || o.Namespace == "") {
				return errors.New("give a WorkloadGroup file (-f), or the name and namespace of one in the cluster (--name, --namespace)")
			}
			if o.Output == "" {
				return errors.New("give the output directory (-o)")
			}
			if o.InternalIP != "" && o.ExternalIP != "" {
				return errors.New("--internalIP and --externalIP are mutually exclusive")
			}
			if o.TokenDuration <= 0 {
				return errors.New("--tokenDuration must be positive")
			}
			client, err := conn.Kube.Client()
			if err != nil {
				return err
			}
			return Configure(cmd.Context(), client, conn.SystemNamespace(), o, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.File, "file", "f", "", "the WorkloadGroup's YAML; leave empty to read it from the cluster")
	f.StringVar(&o.Name, "name", "", "the WorkloadGroup's name, read from the cluster")
	f.StringVarP(&o.Namespace, "namespace", "n", "", "the namespace of the WorkloadGroup and its workloads")
	f.StringVarP(&o.Output, "output", "o", "", "directory the files are written to")
	f.StringVar(&o.ClusterID, "clusterID", "", "the cluster's name (default: the revision's injection values' clusterID)")
	f.StringVar(&o.Revision, "revision", "", "the control plane revision whose injection values say where discovery and ca are")
	f.Int64Var(&o.TokenDuration, "tokenDuration", 3600, "the token's lifetime in seconds")
	f.StringVar(&o.IngressService, "ingressService", "istio-eastwestgateway", "the gateway Service the VM reaches the control plane through, <service>[.<namespace>] (default namespace: the control plane's)")
	f.StringVar(&o.IngressIP, "ingressIP", "", "the gateway's IP address (default: the --ingressService's load balancer or external IP)")
	f.BoolVar(&o.AutoRegister, "autoregister", false, "the workload registers its WorkloadEntry when it connects (ISTIO_META_AUTO_REGISTER_GROUP)")
	f.BoolVar(&o.CaptureDNS, "capture-dns", true, "the agent answers the VM's DNS for the mesh's hosts (ISTIO_META_DNS_CAPTURE)")
	f.StringVar(&o.InternalIP, "internalIP", "", "the VM's internal IP address (ISTIO_SVC_IP)")
	f.StringVar(&o.ExternalIP, "externalIP", "", "the VM's external IP address (ISTIO_SVC_IP), when it reaches the mesh from outside its network")
	return cmd
}

// Configure reads the group and the control plane's configuration from
// the cluster and writes the files into o.Output.
func Configure(ctx context.Context, client kubernetes.Interface, systemNamespace string, o Options, warn io.Writer) error {
	group, err := readGroup(ctx, client, o)
	if err != nil {
		return err
	}
	ns := group.Meta.Namespace
	cm, err := client.CoreV1().ConfigMaps(systemNamespace).Get(ctx, meshConfigMap, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the mesh configuration (ConfigMap %s/%s): %w", systemNamespace, meshConfigMap, err)
	}
	mesh, err := istio.ParseMeshConfig([]byte(cm.Data[meshKey]))
	if err != nil {
		return fmt.Errorf("ConfigMap %s/%s: %w", systemNamespace, meshConfigMap, err)
	}
	injName := inject.RevisionName(o.Revision)
	icm, err := client.CoreV1().ConfigMaps(systemNamespace).Get(ctx, injName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the injection values, which say where discovery and ca are (ConfigMap %s/%s): %w", systemNamespace, injName, err)
	}
	injection, err := inject.ParseConfig(cmpOr(o.Revision, "default"), icm.Data[inject.ConfigMapTemplateKey], icm.Data[inject.ConfigMapValuesKey])
	if err != nil {
		return fmt.Errorf("ConfigMap %s/%s: %w", systemNamespace, injName, err)
	}
	roots, err := client.CoreV1().ConfigMaps(ns).Get(ctx, rootsConfigMap, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the mesh's roots (ConfigMap %s/%s): %w", ns, rootsConfigMap, err)
	}
	if roots.Data[rootsKey] == "" {
		return fmt.Errorf("ConfigMap %s/%s has no %s", ns, rootsConfigMap, rootsKey)
	}
	sa := group.Spec.(*networking.WorkloadGroup).GetTemplate().GetServiceAccount() // readGroup's kind
	if sa == "" {
		sa = "default"
	}
	duration := o.TokenDuration
	tok, err := client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{tokenAudience}, ExpirationSeconds: &duration},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("a token of service account %s/%s: %w", ns, sa, err)
	}
	ingressIP := o.IngressIP
	if ingressIP == "" {
		ingressIP = ingressAddress(ctx, client, systemNamespace, o.IngressService)
	}
	files, err := Files(Inputs{
		Group: group, Mesh: mesh, Injection: injection.Values, ClusterID: o.ClusterID,
		Roots: []byte(roots.Data[rootsKey]), Token: []byte(tok.Status.Token), IngressIP: ingressIP,
		InternalIP: o.InternalIP, ExternalIP: o.ExternalIP, AutoRegister: o.AutoRegister, CaptureDNS: o.CaptureDNS,
	})
	if err != nil {
		return err
	}
	if len(files[Hosts]) == 0 {
		fmt.Fprintf(warn, "Warning: no address for %s: hosts is empty; give --ingressIP, the gateway address the VM reaches discovery and ca at\n", o.IngressService)
	}
	if err := os.MkdirAll(o.Output, 0o755); err != nil { //nolint:gosec // a directory the user names for files they copy to the VM
		return err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(o.Output, name), data, 0o600); err != nil {
			return err
		}
	}
	fmt.Fprintf(warn, "Warning: a token of service account %s/%s is in %s: keep it as you would the service account\n", ns, sa, filepath.Join(o.Output, Token))
	return nil
}

// readGroup reads the WorkloadGroup from its file or from the cluster,
// and checks it as the webhook would.
func readGroup(ctx context.Context, client kubernetes.Interface, o Options) (*istio.Object, error) {
	var data []byte
	source := o.File
	if o.File != "" {
		f, err := os.Open(o.File)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if data, err = io.ReadAll(io.LimitReader(f, maxGroupBytes+1)); err != nil {
			return nil, err
		}
		if len(data) > maxGroupBytes {
			return nil, fmt.Errorf("%s: more than %d bytes", o.File, maxGroupBytes)
		}
	} else {
		source = "WorkloadGroup " + o.Namespace + "/" + o.Name
		var err error
		data, err = client.Discovery().RESTClient().Get().
			AbsPath("/apis/networking.istio.io/v1/namespaces", o.Namespace, "workloadgroups", o.Name).DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
	}
	var groups []*istio.Object
	for _, d := range istio.Decode(source, data, cmpOr(o.Namespace, "default")) {
		if d.Err != nil {
			return nil, d.Err
		}
		if d.Object != nil && d.Object.Kind.Kind == istio.WorkloadGroup {
			groups = append(groups, d.Object)
		}
	}
	if len(groups) != 1 {
		return nil, fmt.Errorf("%s: want one WorkloadGroup, found %d", source, len(groups))
	}
	g := groups[0]
	if o.Namespace != "" {
		g.Meta.Namespace = o.Namespace
	}
	if r := validation.Validate(g, nil); len(r.Errors) > 0 {
		return nil, fmt.Errorf("WorkloadGroup %s: %w", g.Key(), &validation.Error{Issues: r.Errors})
	}
	return g, nil
}

// ingressAddress is the address of the gateway Service
// <service>[.<namespace>]: its load balancer's IP, else its first
// external IP (Istio's createHosts); empty when it has none.
func ingressAddress(ctx context.Context, client kubernetes.Interface, systemNamespace, service string) string {
	name, ns, ok := strings.Cut(service, ".")
	if !ok {
		ns = systemNamespace
	}
	svc, err := client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			return in.IP
		}
	}
	if len(svc.Spec.ExternalIPs) > 0 {
		return svc.Spec.ExternalIPs[0]
	}
	return ""
}
