package translate

import (
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/flotilla-mesh/flotilla/internal/model"
)

// validVirtualHost checks domains without go-control-plane's regular
// expression; its verdict and message must stay the generated ones.
func TestVirtualHostValidationIsTheGeneratedOne(t *testing.T) {
	pc, _ := model.NewStore().Build(model.BuildOptions{}, nil, 1)
	g := newGen(pc, &model.Proxy{})
	for _, tc := range []struct {
		name    string
		domains []string
	}{
		{"plain domains", []string{"example.com", "*.example.com", "example.com:80"}},
		{"empty domain", []string{""}},
		{"no domain", nil},
		{"newline", []string{"example.com", "evil\n.example.com"}},
		{"carriage return", []string{"evil\r"}},
		{"NUL", []string{"ev\x00il"}},
		{"invalid UTF-8", []string{"\xff\xfe"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vh := &routev3.VirtualHost{Name: "vh", Domains: tc.domains}
			want := vh.Validate()
			got := g.validVirtualHost(vh, g.packErrs)
			if (got == nil) != (want == nil) || (got != nil && got.Error() != want.Error()) {
				t.Errorf("validVirtualHost: %v; generated validation: %v", got, want)
			}
			if len(vh.Domains) != len(tc.domains) {
				t.Errorf("domains changed to %q", vh.Domains)
			}
		})
	}
}
