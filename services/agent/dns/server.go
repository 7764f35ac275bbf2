// Package dns is the agent's DNS proxy, as Istio's agent's
// (pkg/dns/client): the pod's DNS queries, captured to it, are answered
// from the name table discovery sends (NDS) when they name a host of the
// mesh — Services, ServiceEntries with the addresses allocated to them —
// and forwarded as they are to the pod's resolvers (resolv.conf)
// otherwise. It serves UDP and TCP on the same address.
//
// Its cost is bounded whatever the workload sends: queries forwarded at
// once are limited (beyond, SERVFAIL at once), as are open TCP
// connections (beyond, new ones wait to be accepted) and their queries;
// answers from the table are built per query from a table that is
// replaced whole, never grown by queries. No log line or metric label
// carries a name from a query.
package dns

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"go.opentelemetry.io/otel/metric"

	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
	"github.com/flotilla-mesh/flotilla/internal/proxycontract"
)

// DefaultAddress is Istio's DNS_PROXY_ADDR default: localhost on
// proxycontract.DNSProxyPort, where the capture sends the pod's DNS.
func DefaultAddress() string {
	return net.JoinHostPort("localhost", strconv.Itoa(proxycontract.DNSProxyPort))
}

// ResolvConf is where the pod's resolvers are read from.
const ResolvConf = "/etc/resolv.conf"

// Defaults of Options.
const (
	DefaultTimeout     = 5 * time.Second // Istio's DefaultUpstreamTimeout
	DefaultMaxInflight = 256
	DefaultMaxTCPConns = 64
)

// Options configure a Server.
type Options struct {
	// Address is host:port (DNS_PROXY_ADDR); "localhost" listens on
	// 127.0.0.1 and, when a resolver is IPv6, on ::1 too, as Istio's.
	Address string
	// Upstreams are the resolvers (host:port) unknown names are forwarded
	// to, tried in random order; Search are the search domains. Both come
	// from resolv.conf (ReadResolvConf).
	Upstreams []string
	Search    []string
	// Namespace and Domain are the pod's (TableOptions).
	Namespace, Domain string
	// Timeout bounds each upstream exchange.
	Timeout time.Duration
	// MaxInflight bounds the queries being forwarded at once.
	MaxInflight int
	// MaxTCPConns bounds the open TCP connections.
	MaxTCPConns int
	// Meter is where the dns_* metrics go (Istio's names); nil: none.
	Meter metric.Meter
	Log   *slog.Logger
}

// Server is the DNS proxy. Update gives it the name table; until the
// first, every query is answered SERVFAIL, as Istio's (its clients retry
// and the agent gets the table within a round trip to discovery).
type Server struct {
	o        Options
	table    atomic.Pointer[Table]
	inflight chan struct{}
	m        *metrics
	servers  []*dns.Server
}

// New returns a server; Run serves it.
func New(o Options) (*Server, error) {
	if o.Address == "" {
		o.Address = DefaultAddress()
	}
	if _, _, err := net.SplitHostPort(o.Address); err != nil {
		return nil, fmt.Errorf("DNS proxy address %q: %w", o.Address, err)
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = DefaultMaxInflight
	}
	if o.MaxTCPConns <= 0 {
		o.MaxTCPConns = DefaultMaxTCPConns
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.Log = o.Log.With("component", "dns-proxy")
	m, err := newMetrics(o.Meter)
	if err != nil {
		return nil, err
	}
	return &Server{o: o, inflight: make(chan struct{}, o.MaxInflight), m: m}, nil
}

// ReadResolvConf reads the resolvers (host:port) and search domains of a
// resolv.conf.
func ReadResolvConf(path string) (upstreams, search []string, err error) {
	c, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("resolvers: %w", err)
	}
	for _, s := range c.Servers {
		upstreams = append(upstreams, net.JoinHostPort(s, c.Port))
	}
	return upstreams, c.Search, nil
}

// Update replaces the name table.
func (s *Server) Update(nt *ndsv1.NameTable) {
	t := NewTable(nt, TableOptions{Namespace: s.o.Namespace, Domain: s.o.Domain, Search: s.o.Search})
	s.table.Store(t)
	s.o.Log.Debug("name table updated", "names", t.Len())
}

// NameTable is the last name table given; nil before the first.
func (s *Server) NameTable() *ndsv1.NameTable {
	if t := s.table.Load(); t != nil {
		return t.source
	}
	return nil
}

// Ready reports whether a name table has been given.
func (s *Server) Ready() bool { return s.table.Load() != nil }

// addresses are where the server listens (Istio's NewLocalDNSServer).
func (s *Server) addresses() []string {
	host, port, _ := net.SplitHostPort(s.o.Address)
	if host != "localhost" {
		return []string{s.o.Address}
	}
	out := []string{net.JoinHostPort("127.0.0.1", port)}
	for _, u := range s.o.Upstreams {
		if h, _, err := net.SplitHostPort(u); err == nil && strings.Contains(h, ":") {
			return append(out, net.JoinHostPort("::1", port))
		}
	}
	return out
}

// Listen binds the UDP and TCP sockets; Serve serves them.
func (s *Server) Listen() error {
	if len(s.servers) > 0 {
		return nil
	}
	for _, addr := range s.addresses() {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			s.close()
			return fmt.Errorf("DNS proxy: %w", err)
		}
		s.servers = append(s.servers, &dns.Server{PacketConn: pc, Handler: s.handler("udp")})
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			s.close()
			return fmt.Errorf("DNS proxy: %w", err)
		}
		s.servers = append(s.servers, &dns.Server{
			Listener: newLimitListener(ln, s.o.MaxTCPConns),
			Handler:  s.handler("tcp"),
			// A connection's queries and idle time are bounded, as its
			// reads and writes.
			MaxTCPQueries: 128, IdleTimeout: func() time.Duration { return 8 * time.Second },
			ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		})
		s.o.Log.Info("DNS proxy listening", "address", addr)
	}
	return nil
}

// Addrs are the bound addresses, UDP and TCP alternately, after Listen.
func (s *Server) Addrs() []net.Addr {
	var out []net.Addr
	for _, srv := range s.servers {
		if srv.PacketConn != nil {
			out = append(out, srv.PacketConn.LocalAddr())
		} else {
			out = append(out, srv.Listener.Addr())
		}
	}
	return out
}

func (s *Server) close() {
	for _, srv := range s.servers {
		if srv.PacketConn != nil {
			_ = srv.PacketConn.Close()
		}
		if srv.Listener != nil {
			_ = srv.Listener.Close()
		}
	}
	s.servers = nil
}

// Run listens (unless Listen did) and serves until ctx ends. It fails
// when it cannot listen.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	defer s.close()
	errc := make(chan error, len(s.servers))
	for _, srv := range s.servers {
		go func() { errc <- srv.ActivateAndServe() }()
	}
	defer func() {
		for _, srv := range s.servers {
			_ = srv.Shutdown()
		}
	}()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return fmt.Errorf("DNS proxy: %w", err)
	}
}

// handler serves one protocol; its upstream client uses the same one.
func (s *Server) handler(proto string) dns.Handler {
	client := &dns.Client{Net: proto, DialTimeout: s.o.Timeout, ReadTimeout: s.o.Timeout, WriteTimeout: s.o.Timeout}
	return dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		resp := s.answer(req, func(req *dns.Msg) *dns.Msg { return s.forward(client, req) })
		resp.Truncate(size(proto, req))
		_ = w.WriteMsg(resp)
	})
}

// answer is the response to req: from the table, else forward's.
func (s *Server) answer(req *dns.Msg, forward func(*dns.Msg) *dns.Msg) *dns.Msg {
	s.m.request()
	if len(req.Question) == 0 {
		return reply(req, dns.RcodeServerFailure)
	}
	t := s.table.Load()
	if t == nil {
		return reply(req, dns.RcodeServerFailure)
	}
	q := req.Question[0]
	answers, known := t.Lookup(q.Qtype, q.Name)
	if !known {
		return forward(req)
	}
	resp := reply(req, dns.RcodeSuccess)
	resp.Authoritative = true
	resp.Answer = shuffle(answers)
	return resp
}

// forward sends req to the resolvers, one after another in random order,
// and returns the first answer; SERVFAIL when none answers or too many
// queries are being forwarded already.
func (s *Server) forward(client *dns.Client, req *dns.Msg) *dns.Msg {
	select {
	case s.inflight <- struct{}{}:
		defer func() { <-s.inflight }()
	default:
		s.m.failure()
		return reply(req, dns.RcodeServerFailure)
	}
	s.m.upstream()
	start := time.Now()
	defer func() { s.m.upstreamDuration(time.Since(start)) }()
	ups := append([]string(nil), s.o.Upstreams...)
	rand.Shuffle(len(ups), func(i, j int) { ups[i], ups[j] = ups[j], ups[i] }) //nolint:gosec // spreading load, not a secret
	for _, u := range ups {
		resp, _, err := client.Exchange(req, u)
		if err == nil {
			return resp
		}
		s.o.Log.Debug("upstream resolver failed", "upstream", u, "error", err)
	}
	s.m.failure()
	return reply(req, dns.RcodeServerFailure)
}

func reply(req *dns.Msg, rcode int) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetRcode(req, rcode)
	return resp
}

// shuffle puts the addresses after any CNAME in random order, so clients
// taking the first spread over them (Istio's roundRobinResponse, as
// kube-dns does).
func shuffle(rrs []dns.RR) []dns.RR {
	first := 0
	for first < len(rrs) && rrs[first].Header().Rrtype == dns.TypeCNAME {
		first++
	}
	addrs := rrs[first:]
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] }) //nolint:gosec // spreading load, not a secret
	return rrs
}

// size is the largest response the client takes: 64 KiB over TCP, else
// the EDNS0 buffer it advertised, at least 512 bytes (Istio's size).
func size(proto string, req *dns.Msg) int {
	if proto == "tcp" {
		return dns.MaxMsgSize
	}
	n := uint16(dns.MinMsgSize)
	if o := req.IsEdns0(); o != nil && o.UDPSize() > n {
		n = o.UDPSize()
	}
	return int(n)
}

// limitListener holds at most cap(slots) connections open: Accept waits
// for one to close beyond that.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitConn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
