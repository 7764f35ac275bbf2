package admission

import (
	"strings"
	"testing"

	"github.com/flotilla-mesh/flotilla/internal/platform/tlsreload"
)

func TestConfigValidate(t *testing.T) {
	files := tlsreload.Files{CertFile: "c.pem", KeyFile: "k.pem"}
	for _, tc := range []struct {
		name   string
		cfg    Config
		fromCA bool
		want   string // substring of the error; empty: valid
	}{
		{name: "files", cfg: Config{Address: ":15017", TLS: files}},
		{name: "from ca", cfg: Config{Address: ":15017"}, fromCA: true},
		{name: "no port", cfg: Config{Address: "localhost"}, want: `webhookAddress "localhost"`},
		{name: "a key without a certificate", cfg: Config{Address: ":1", TLS: tlsreload.Files{KeyFile: "k.pem"}}, want: "certFile and keyFile"},
		{name: "client certificates asked of the apiserver", cfg: Config{Address: ":1", TLS: tlsreload.Files{CertFile: "c", KeyFile: "k", CAFile: "ca"}}, want: "caFile must be empty"},
		{name: "files and ca", cfg: Config{Address: ":1", TLS: files}, fromCA: true, want: "exclusive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate(tc.fromCA)
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}
