package bootstrap

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
	"github.com/flotilla-mesh/flotilla/services/agent/identity"
)

// Proxyless gRPC (Istio's grpc-agent template): the application reads a
// gRPC xDS bootstrap the agent writes, talks xDS to the agent's socket
// (relayed to discovery over mTLS), and takes its mesh certificate from
// files the agent keeps current.
const (
	// GRPCBootstrapPath is where Istio's grpc-agent template has the
	// bootstrap written (GRPC_XDS_BOOTSTRAP).
	GRPCBootstrapPath = "/etc/istio/proxy/grpc-bootstrap.json"
	// GRPCCertsDir is where it has the certificate files written
	// (OUTPUT_CERTS).
	GRPCCertsDir = "/var/lib/istio/data"
)

// GRPCOptions say what to write for a proxyless application.
type GRPCOptions struct {
	Node Node
	// XDSSocket is the agent's xDS socket (default XDSSocket).
	XDSSocket string
	// CertsDir holds the certificate files (default GRPCCertsDir).
	CertsDir string
	// CertRefresh is how often grpc-go reads the files again (default
	// 5 minutes): the bound on how long after a rotation new connections
	// still present the old certificate.
	CertRefresh time.Duration
}

// grpcBootstrap is grpc-go's bootstrap format (gRFC A27, A29, A36).
type grpcBootstrap struct {
	XDSServers                         []grpcServer            `json:"xds_servers"`
	Node                               json.RawMessage         `json:"node"`
	CertificateProviders               map[string]grpcProvider `json:"certificate_providers"`
	ServerListenerResourceNameTemplate string                  `json:"server_listener_resource_name_template"`
}

type grpcServer struct {
	ServerURI      string            `json:"server_uri"`
	ChannelCreds   []grpcChannelCred `json:"channel_creds"`
	ServerFeatures []string          `json:"server_features"`
}

type grpcChannelCred struct {
	Type string `json:"type"`
}

type grpcProvider struct {
	PluginName string           `json:"plugin_name"`
	Config     grpcFileProvider `json:"config"`
}

type grpcFileProvider struct {
	CertificateFile   string `json:"certificate_file"`
	PrivateKeyFile    string `json:"private_key_file"`
	CACertificateFile string `json:"ca_certificate_file"`
	RefreshInterval   string `json:"refresh_interval"`
}

// BuildGRPC returns the gRPC xDS bootstrap (JSON): the agent's xDS socket
// as the one server (plaintext: it is a Unix socket in the pod; the agent
// holds the mTLS connection to discovery), the node with GENERATOR=grpc,
// the file_watcher certificate provider over CertsDir, and the server
// listener name template.
func BuildGRPC(o GRPCOptions) ([]byte, error) {
	o.Node.Generator = proxycontract.GeneratorGRPC
	if err := o.Node.check(); err != nil {
		return nil, err
	}
	o.XDSSocket = orDefault(o.XDSSocket, XDSSocket)
	o.CertsDir = orDefault(o.CertsDir, GRPCCertsDir)
	if !filepath.IsAbs(o.XDSSocket) || !filepath.IsAbs(o.CertsDir) {
		return nil, errors.New("the xDS socket and the certificate directory must be absolute paths")
	}
	if o.CertRefresh == 0 {
		o.CertRefresh = 5 * time.Minute
	}
	if o.CertRefresh < time.Second {
		return nil, fmt.Errorf("certificate refresh %s: want at least 1s", o.CertRefresh)
	}
	md, err := metadata(o.Node, nil) // proxyless: nothing of a proxy config is read
	if err != nil {
		return nil, err
	}
	mdJSON, err := protojson.Marshal(md)
	if err != nil {
		return nil, fmt.Errorf("node metadata: %w", err)
	}
	node, err := json.Marshal(map[string]any{"id": o.Node.ID(), "cluster": serviceCluster(o.Node), "metadata": json.RawMessage(mdJSON)})
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	b := grpcBootstrap{
		XDSServers: []grpcServer{{
			ServerURI:      "unix://" + o.XDSSocket,
			ChannelCreds:   []grpcChannelCred{{Type: "insecure"}},
			ServerFeatures: []string{"xds_v3"},
		}},
		Node: node,
		CertificateProviders: map[string]grpcProvider{proxycontract.GRPCCertProvider: {
			PluginName: "file_watcher",
			Config: grpcFileProvider{
				CertificateFile:   filepath.Join(o.CertsDir, identity.ChainFile),
				PrivateKeyFile:    filepath.Join(o.CertsDir, identity.KeyFile),
				CACertificateFile: filepath.Join(o.CertsDir, identity.RootsFile),
				RefreshInterval:   strconv.FormatFloat(o.CertRefresh.Seconds(), 'f', -1, 64) + "s",
			},
		}},
		ServerListenerResourceNameTemplate: proxycontract.GRPCInboundListenerPrefix + "%s",
	}
	out, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("grpc bootstrap: %w", err)
	}
	return append(out, '\n'), nil
}
