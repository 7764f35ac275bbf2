package dns

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
)

// upstreamServer is a real DNS server (miekg/dns's) on loopback, UDP and
// TCP on the same port, answering upstream.test and a response too large
// for UDP; it counts the queries it got.
type upstreamServer struct {
	addr    string
	mu      sync.Mutex
	queries []string
}

// resolverHandler answers as the pod's resolver: upstream.test, a
// response too large for UDP (big.test), NXDOMAIN for the rest; it
// reports each name asked.
func resolverHandler(asked func(name string)) dns.Handler {
	return dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		asked(req.Question[0].Name)
		resp := new(dns.Msg)
		resp.SetReply(req)
		switch req.Question[0].Name {
		case "upstream.test.":
			resp.Answer = append(resp.Answer, &dns.A{Hdr: header("upstream.test.", dns.TypeA), A: net.IPv4(9, 9, 9, 9)})
		case "big.test.":
			for i := range 40 {
				resp.Answer = append(resp.Answer, &dns.TXT{Hdr: header("big.test.", dns.TypeTXT), Txt: []string{strings.Repeat("x", 60) + string(rune('a'+i%26))}})
			}
		default:
			resp.Rcode = dns.RcodeNameError
		}
		// As a real server: what does not fit the client's buffer is
		// truncated.
		proto := "udp"
		if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
			proto = "tcp"
		}
		resp.Truncate(size(proto, req))
		_ = w.WriteMsg(resp)
	})
}

func startUpstream(t *testing.T) *upstreamServer {
	t.Helper()
	u := &upstreamServer{}
	h := resolverHandler(func(name string) {
		u.mu.Lock()
		u.queries = append(u.queries, name)
		u.mu.Unlock()
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		go func() { _ = srv.ActivateAndServe() }()
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return u
}

func (u *upstreamServer) got() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.queries)
}

// startProxy runs a Server on loopback and returns it with its UDP and
// TCP addresses and the reader of its metrics.
func startProxy(t *testing.T, o Options) (*Server, string, string, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	o.Meter = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("istio")
	if o.Address == "" {
		o.Address = "127.0.0.1:0"
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	addrs := s.Addrs()
	return s, addrs[0].String(), addrs[1].String(), reader
}

func counters(t *testing.T, r *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					out[m.Name] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[m.Name] += float64(p.Count)
				}
			}
		}
	}
	return out
}

func exchange(t *testing.T, proto, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: proto, Timeout: 10 * time.Second}
	req := new(dns.Msg)
	req.SetQuestion(name, qtype)
	resp, _, err := c.Exchange(req, addr)
	if err != nil {
		t.Fatalf("%s %s: %v", proto, name, err)
	}
	return resp
}

var meshTable = &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
	"pg.example.com":                    {Ips: []string{"240.240.0.1", "2001:2::1"}, Registry: "External"},
	"productpage.ns1.svc.cluster.local": {Ips: []string{"10.10.10.10"}, Registry: "Kubernetes", Shortname: "productpage", Namespace: "ns1"},
	"headless.ns1.svc.cluster.local":    {Ips: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}, Registry: "Kubernetes", Shortname: "headless", Namespace: "ns1"},
}}

func TestTheProxyAnswersMeshNamesAndForwardsTheRestOverUDPAndTCP(t *testing.T) {
	up := startUpstream(t)
	s, udp, tcp, reader := startProxy(t, Options{Upstreams: []string{up.addr}, Namespace: "ns1", Domain: "ns1.svc.cluster.local", Search: []string{"ns1.svc.cluster.local"}})

	// Before the name table: SERVFAIL, nothing forwarded.
	if resp := exchange(t, "udp", udp, "pg.example.com.", dns.TypeA); resp.Rcode != dns.RcodeServerFailure {
		t.Fatalf("before the table: rcode %s, want SERVFAIL", dns.RcodeToString[resp.Rcode])
	}
	s.Update(meshTable)
	for _, proto := range []string{"udp", "tcp"} {
		addr := map[string]string{"udp": udp, "tcp": tcp}[proto]
		resp := exchange(t, proto, addr, "pg.example.com.", dns.TypeA)
		if got := answerStrings(resp.Answer); !resp.Authoritative || resp.Rcode != dns.RcodeSuccess || !slices.Equal(got, []string{"A pg.example.com. 240.240.0.1"}) {
			t.Errorf("%s pg.example.com A: aa %v rcode %s answers %q", proto, resp.Authoritative, dns.RcodeToString[resp.Rcode], got)
		}
		resp = exchange(t, proto, addr, "productpage.ns1.svc.cluster.local.", dns.TypeAAAA)
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
			t.Errorf("%s productpage AAAA: rcode %s answers %v; want NOERROR and none", proto, dns.RcodeToString[resp.Rcode], resp.Answer)
		}
		resp = exchange(t, proto, addr, "upstream.test.", dns.TypeA)
		if got := answerStrings(resp.Answer); resp.Authoritative || !slices.Equal(got, []string{"A upstream.test. 9.9.9.9"}) {
			t.Errorf("%s upstream.test A: aa %v answers %q; want the upstream's", proto, resp.Authoritative, got)
		}
		resp = exchange(t, proto, addr, "nowhere.test.", dns.TypeA)
		if resp.Rcode != dns.RcodeNameError {
			t.Errorf("%s nowhere.test: rcode %s, want the upstream's NXDOMAIN", proto, dns.RcodeToString[resp.Rcode])
		}
	}
	if got, want := up.got(), []string{"upstream.test.", "nowhere.test.", "upstream.test.", "nowhere.test."}; !slices.Equal(got, want) {
		t.Errorf("the upstream got %q, want %q (mesh names are never forwarded)", got, want)
	}
	m := counters(t, reader)
	if m["istio_agent_dns_requests_total"] != 9 || m["istio_agent_dns_upstream_requests_total"] != 4 ||
		m["istio_agent_dns_upstream_failures_total"] != 0 || m["istio_agent_dns_upstream_request_duration_seconds"] != 4 {
		t.Errorf("metrics %v; want 9 requests, 4 forwarded and timed, no failure", m)
	}
}

func TestGosResolverFindsMeshNamesThroughTheProxy(t *testing.T) {
	up := startUpstream(t)
	s, udp, tcp, _ := startProxy(t, Options{Upstreams: []string{up.addr}, Namespace: "ns1", Domain: "ns1.svc.cluster.local", Search: []string{"ns1.svc.cluster.local"}})
	s.Update(meshTable)
	for _, proto := range []string{"udp", "tcp"} {
		addr := map[string]string{"udp": udp, "tcp": tcp}[proto]
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, proto, addr)
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := r.LookupHost(ctx, "pg.example.com")
		cancel()
		slices.Sort(got)
		if err != nil || !slices.Equal(got, []string{"2001:2::1", "240.240.0.1"}) {
			t.Errorf("%s: LookupHost(pg.example.com) = %v, %v", proto, got, err)
		}
	}
}

func TestAResponseTooLargeForUDPIsTruncatedAndWholeOverTCP(t *testing.T) {
	up := startUpstream(t)
	s, udp, tcp, _ := startProxy(t, Options{Upstreams: []string{up.addr}})
	s.Update(meshTable)
	resp := exchange(t, "udp", udp, "big.test.", dns.TypeTXT)
	if !resp.Truncated || len(resp.Answer) >= 40 {
		t.Errorf("over UDP: truncated %v, %d answers; want truncated", resp.Truncated, len(resp.Answer))
	}
	resp = exchange(t, "tcp", tcp, "big.test.", dns.TypeTXT)
	if resp.Truncated || len(resp.Answer) != 40 {
		t.Errorf("over TCP: truncated %v, %d answers; want all 40", resp.Truncated, len(resp.Answer))
	}
	// Many addresses of a headless Service: all answered, in some order.
	resp = exchange(t, "udp", udp, "headless.ns1.svc.cluster.local.", dns.TypeA)
	got := answerStrings(resp.Answer)
	slices.Sort(got)
	if want := []string{"A headless.ns1.svc.cluster.local. 10.0.0.1", "A headless.ns1.svc.cluster.local. 10.0.0.2", "A headless.ns1.svc.cluster.local. 10.0.0.3"}; !slices.Equal(got, want) {
		t.Errorf("headless: %q, want %q", got, want)
	}
}

func TestAnUpstreamThatFailsIsServfailAndCounted(t *testing.T) {
	// A port nothing listens on: UDP gets refused, TCP cannot connect.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := pc.LocalAddr().String()
	pc.Close()
	s, udp, tcp, reader := startProxy(t, Options{Upstreams: []string{dead}, Timeout: 2 * time.Second})
	s.Update(meshTable)
	for _, c := range [][2]string{{"udp", udp}, {"tcp", tcp}} {
		if resp := exchange(t, c[0], c[1], "upstream.test.", dns.TypeA); resp.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s: rcode %s, want SERVFAIL", c[0], dns.RcodeToString[resp.Rcode])
		}
	}
	if m := counters(t, reader); m["istio_agent_dns_upstream_failures_total"] != 2 {
		t.Errorf("metrics %v; want 2 failures", m)
	}
}

func TestAFloodOfUnknownNamesForwardsAtMostTheBoundAtOnce(t *testing.T) {
	// An upstream that never answers: each forwarded query holds its slot
	// for the whole timeout, so only the bound may reach it; the rest are
	// answered SERVFAIL at once.
	hole, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	var mu sync.Mutex
	reached := 0
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := hole.ReadFrom(buf); err != nil {
				return
			}
			mu.Lock()
			reached++
			mu.Unlock()
		}
	}()
	const bound, flood = 4, 200
	s, udp, _, reader := startProxy(t, Options{Upstreams: []string{hole.LocalAddr().String()}, MaxInflight: bound, Timeout: 10 * time.Second})
	s.Update(meshTable)
	var wg sync.WaitGroup
	servfail := make(chan struct{}, flood)
	for i := range flood {
		wg.Go(func() {
			c := &dns.Client{Net: "udp", Timeout: 30 * time.Second}
			req := new(dns.Msg)
			req.SetQuestion(dns.Fqdn(strings.Repeat("x", i%50+1)+".flood.test"), dns.TypeA)
			if resp, _, err := c.Exchange(req, udp); err == nil && resp.Rcode == dns.RcodeServerFailure {
				servfail <- struct{}{}
			}
		})
	}
	// The mesh keeps being answered while the flood holds every slot.
	waitFor(t, func() bool { return len(servfail) == flood-bound })
	if resp := exchange(t, "udp", udp, "pg.example.com.", dns.TypeA); len(resp.Answer) != 1 {
		t.Errorf("a mesh name during the flood: %v", resp)
	}
	mu.Lock()
	got := reached
	mu.Unlock()
	if got > bound {
		t.Errorf("the upstream got %d queries at once, want at most %d", got, bound)
	}
	if m := counters(t, reader); m["istio_agent_dns_upstream_requests_total"] != bound || m["istio_agent_dns_upstream_failures_total"] != flood-bound {
		t.Errorf("metrics %v; want %d forwarded and %d failures", m, bound, flood-bound)
	}
	wg.Wait() // the held queries fail after the proxy's timeout
}

func TestHostileInputCostsItsSenderOnly(t *testing.T) {
	up := startUpstream(t)
	s, udp, tcp, _ := startProxy(t, Options{Upstreams: []string{up.addr}, MaxTCPConns: 2})
	s.Update(meshTable)
	// Garbage, a header alone, and a query without a question (refused
	// by miekg/dns's default MsgAcceptFunc before the handler: FORMERR).
	conn, err := net.Dial("udp", udp)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, p := range [][]byte{{0xff}, make([]byte, 12), []byte(strings.Repeat("\xc0\x0c", 300))} {
		if _, err := conn.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	empty := new(dns.Msg)
	empty.Id = 7
	c := &dns.Client{Net: "udp", Timeout: 10 * time.Second}
	if resp, _, err := c.Exchange(empty, udp); err != nil || resp.Rcode != dns.RcodeFormatError {
		t.Errorf("no question: %v, %v; want FORMERR", resp, err)
	}
	// TCP connections held open beyond the bound wait to be accepted; UDP
	// is answered meanwhile, and TCP again once one closes.
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", tcp)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if resp := exchange(t, "udp", udp, "pg.example.com.", dns.TypeA); len(resp.Answer) != 1 {
		t.Errorf("UDP with TCP full: %v", resp)
	}
	for _, c := range held {
		c.Close()
	}
	if resp := exchange(t, "tcp", tcp, "pg.example.com.", dns.TypeA); len(resp.Answer) != 1 {
		t.Errorf("TCP after the held connections closed: %v", resp)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
