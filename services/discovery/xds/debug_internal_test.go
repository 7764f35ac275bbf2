package xds

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestAConfigDumpNeverShowsAPrivateKey(t *testing.T) {
	inline := func(s string) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte(s)}}
	}
	for name, s := range map[string]*tlsv3.Secret{
		"certificate": {Name: "kubernetes://gw", Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline("CHAIN"), PrivateKey: inline("THE-KEY"), Password: inline("THE-PASSWORD"),
		}}},
		"generic": {Name: "token", Type: &tlsv3.Secret_GenericSecret{GenericSecret: &tlsv3.GenericSecret{Secret: inline("THE-KEY")}}},
	} {
		a, err := anypb.New(s)
		if err != nil {
			t.Fatal(err)
		}
		out, err := protojson.Marshal(redacted(a))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "VEhFLUtFWQ") || strings.Contains(string(out), "THE-") || !strings.Contains(string(out), "[redacted]") {
			t.Errorf("%s: %s", name, out)
		}
		if name == "certificate" && !strings.Contains(string(out), "Q0hBSU4") { // the chain, base64
			t.Errorf("the certificate chain went too: %s", out)
		}
	}
}
