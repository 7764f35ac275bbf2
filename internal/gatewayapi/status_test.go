package gatewayapi_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/flotilla-mesh/flotilla/internal/gatewayapi"
)

// Status writes never loop: converting again, later, with the status the
// first conversion wrote in the objects gives the same status — the
// transition times of conditions that did not change are kept — so the
// leader writes nothing more.
func TestConvertingAgainWithItsOwnStatusWritesNothingNew(t *testing.T) {
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".golden.yaml") {
			continue
		}
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			in := decodeInput(t, data)
			first := gatewayapi.Convert(in)
			for _, g := range in.Gateways {
				if st := first.Gateways[gatewayapi.Ref{Kind: gatewayapi.KindGateway, Namespace: g.Namespace, Name: g.Name}]; st != nil {
					g.Status = *st
				}
			}
			for _, r := range in.HTTPRoutes {
				if st := first.Routes[gatewayapi.Ref{Kind: gatewayapi.KindHTTPRoute, Namespace: r.Namespace, Name: r.Name}]; st != nil {
					r.Status.RouteStatus = *st
				}
			}
			for _, r := range in.GRPCRoutes {
				if st := first.Routes[gatewayapi.Ref{Kind: gatewayapi.KindGRPCRoute, Namespace: r.Namespace, Name: r.Name}]; st != nil {
					r.Status.RouteStatus = *st
				}
			}
			for _, r := range in.TCPRoutes {
				if st := first.Routes[gatewayapi.Ref{Kind: gatewayapi.KindTCPRoute, Namespace: r.Namespace, Name: r.Name}]; st != nil {
					r.Status.RouteStatus = *st
				}
			}
			for _, r := range in.TLSRoutes {
				if st := first.Routes[gatewayapi.Ref{Kind: gatewayapi.KindTLSRoute, Namespace: r.Namespace, Name: r.Name}]; st != nil {
					r.Status.RouteStatus = *st
				}
			}
			for _, c := range in.GatewayClasses {
				if st := first.GatewayClasses[c.Name]; st != nil {
					c.Status = *st
				}
			}
			in.Now = metav1.NewTime(in.Now.Add(time.Hour))
			second := gatewayapi.Convert(in)
			if !apiequality.Semantic.DeepEqual(first.Gateways, second.Gateways) || !apiequality.Semantic.DeepEqual(first.Routes, second.Routes) ||
				!apiequality.Semantic.DeepEqual(first.GatewayClasses, second.GatewayClasses) {
				t.Error("the second conversion changed the status the first wrote")
			}
			if len(first.Routes) == 0 || len(first.Gateways) == 0 {
				t.Error("the case has no status to check")
			}
		})
	}
}
