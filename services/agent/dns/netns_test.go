package dns

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/flotilla-mesh/flotilla/services/agent/capture"
)

// The pod of the capture test: its resolvers are 192.0.2.53 and
// fd00::53 (a real DNS server, miekg/dns's, run by root as kube-dns is
// elsewhere); the agent's DNS proxy runs as the proxy's user (1337) and
// forwards to them; the application (root here) asks them and is
// captured.
const (
	resolverV4 = "192.0.2.53"
	resolverV6 = "fd00::53"
	helperEnv  = "FLOTILLA_DNS_TEST_HELPER"
)

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "resolver":
		helperResolver()
	case "proxy":
		helperProxy()
	case "client":
		helperClient()
	case "same-port":
		helperSamePort()
	default:
		os.Exit(m.Run())
	}
}

// helperResolver serves upstream.test and big.test on port 53 of both
// resolvers, UDP and TCP, until killed.
func helperResolver() {
	h := resolverHandler(func(string) {})
	for _, addr := range []string{resolverV4 + ":53", "[" + resolverV6 + "]:53"} {
		for _, proto := range []string{"udp", "tcp"} {
			srv := &dns.Server{Addr: addr, Net: proto, Handler: h}
			go func() {
				if err := srv.ListenAndServe(); err != nil {
					fmt.Fprintln(os.Stderr, "resolver:", err)
					os.Exit(1)
				}
			}()
		}
	}
	fmt.Println("ready")
	waitForSignal()
}

// helperProxy runs the DNS proxy on localhost:15053 with the mesh's
// table, forwarding to the resolvers, until killed.
func helperProxy() {
	s, err := New(Options{
		Address: "localhost:15053", Upstreams: []string{resolverV4 + ":53", "[" + resolverV6 + "]:53"},
		Namespace: "ns1", Domain: "ns1.svc.cluster.local", Search: []string{"ns1.svc.cluster.local"},
	})
	if err == nil {
		err = s.Listen()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		os.Exit(1)
	}
	s.Update(meshTable)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		if err := s.Run(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "proxy:", err)
			os.Exit(1)
		}
	}()
	fmt.Println("ready")
	waitForSignal()
	cancel()
}

func waitForSignal() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}

// clientResult is one query the application made, as it saw the answer.
type clientResult struct {
	Query         string   `json:"query"`
	Err           string   `json:"err,omitempty"`
	Authoritative bool     `json:"aa"`
	Answers       []string `json:"answers"`
}

// helperClient is the application: it asks the resolvers with Go's
// resolver and with miekg/dns's client, and prints what it got.
func helperClient() {
	var out []clientResult
	for _, q := range []struct {
		proto, server, name string
		qtype               uint16
	}{
		{"udp", resolverV4, "pg.example.com.", dns.TypeA},
		{"tcp", resolverV4, "pg.example.com.", dns.TypeA},
		{"udp", resolverV6, "pg.example.com.", dns.TypeAAAA},
		{"tcp", resolverV6, "productpage.ns1.svc.cluster.local.", dns.TypeA},
		{"udp", resolverV4, "upstream.test.", dns.TypeA},
		{"udp", resolverV6, "upstream.test.", dns.TypeA},
		{"udp", resolverV4, "big.test.", dns.TypeTXT},
	} {
		r := clientResult{Query: fmt.Sprintf("%s %s %s %s", q.proto, q.server, q.name, dns.TypeToString[q.qtype])}
		c := &dns.Client{Net: q.proto, Timeout: 5 * time.Second}
		req := new(dns.Msg)
		req.SetQuestion(q.name, q.qtype)
		if resp, _, err := c.Exchange(req, net.JoinHostPort(q.server, "53")); err != nil {
			r.Err = err.Error()
		} else {
			r.Authoritative = resp.Authoritative
			if resp.Truncated {
				r.Answers = append(r.Answers, "truncated")
			}
			r.Answers = append(r.Answers, answerStrings(resp.Answer)...)
		}
		out = append(out, r)
	}
	// Go's resolver, as an application uses it: it falls back to TCP
	// when the UDP answer is truncated.
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, resolverV4+":53")
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hosts, err := resolver.LookupHost(ctx, "pg.example.com")
	slices.Sort(hosts)
	out = append(out, clientResult{Query: "go LookupHost pg.example.com", Answers: hosts, Err: errString(err)})
	txt, err := resolver.LookupTXT(ctx, "big.test")
	out = append(out, clientResult{Query: "go LookupTXT big.test", Answers: []string{fmt.Sprint(len(txt))}, Err: errString(err)})
	_ = json.NewEncoder(os.Stdout).Encode(out)
}

// samePort is the source port both senders of
// TestAQueryFromAPortTheProxyJustUsedStillReachesTheProxy use.
const samePort = 40053

// helperSamePort asks resolverV4 for $NAME from UDP port samePort (shared
// with other sockets: SO_REUSEADDR) and prints the answer.
func helperSamePort() {
	d := &net.Dialer{LocalAddr: &net.UDPAddr{Port: samePort}, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
		if err != nil {
			return err
		}
		return serr
	}}
	c := &dns.Client{Net: "udp", Timeout: 5 * time.Second, Dialer: d}
	req := new(dns.Msg)
	req.SetQuestion(os.Getenv("NAME"), dns.TypeA)
	r := clientResult{Query: os.Getenv("NAME")}
	if resp, _, err := c.Exchange(req, resolverV4+":53"); err != nil {
		r.Err = err.Error()
	} else {
		r.Authoritative, r.Answers = resp.Authoritative, answerStrings(resp.Answer)
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// newNetns is a network namespace of the test's own, loopback up.
func newNetns(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	ns := "flotilla-dns-" + hex.EncodeToString(b)
	ipCmd(t, "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	return ns
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// Where the pod's resolvers are.
const (
	// resolverRemote: in a network namespace of their own (the node's
	// kube-dns), reached over a veth pair, the pod at 192.0.2.1 and
	// fd00::1.
	resolverRemote = "remote"
	// resolverLocal: on the pod's own loopback, as systemd-resolved's
	// 127.0.0.53, the case Istio's rules take care of (the
	// application's DNS over loopback is captured, the proxy's is not).
	resolverLocal = "loopback"
)

// podNetns is the pod's network namespace, and the one the resolvers
// run in (the same one for resolverLocal).
func podNetns(t *testing.T, where string) (pod, resolvers string) {
	t.Helper()
	for _, tool := range []string{"ip", "setpriv", "nft", "iptables-restore", "ip6tables-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (Debian packages iproute2, util-linux, nftables and iptables; make test installs them): %v", tool, err)
		}
	}
	if os.Geteuid() != 0 {
		t.Fatal("network namespaces need root (the tests run as root here and in CI)")
	}
	pod = newNetns(t)
	if where == resolverLocal {
		ipCmd(t, "-n", pod, "addr", "add", resolverV4+"/32", "dev", "lo")
		ipCmd(t, "-n", pod, "addr", "add", resolverV6+"/128", "dev", "lo")
		return pod, pod
	}
	resolvers = newNetns(t)
	ipCmd(t, "-n", pod, "link", "add", "name", "eth0", "type", "veth", "peer", "name", "dns0", "netns", resolvers)
	for _, side := range []struct{ ns, dev, v4, v6 string }{{pod, "eth0", "192.0.2.1/24", "fd00::1/64"}, {resolvers, "dns0", resolverV4 + "/24", resolverV6 + "/64"}} {
		ipCmd(t, "-n", side.ns, "addr", "add", side.v4, "dev", side.dev)
		ipCmd(t, "-n", side.ns, "addr", "add", side.v6, "dev", side.dev, "nodad")
		ipCmd(t, "-n", side.ns, "link", "set", side.dev, "up")
	}
	return pod, resolvers
}

// executable is a copy of this test binary that other users may run
// (go test's own is in a directory only root may enter).
func executable(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe := dir + "/dns.test"
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return exe
}

// helper starts exe in ns as a helper (as user uid when not 0) and waits
// for its "ready".
func helper(t *testing.T, exe, ns, role string, uid int) {
	t.Helper()
	args := []string{"netns", "exec", ns}
	if uid != 0 {
		args = append(args, "setpriv", fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", uid), "--clear-groups")
	}
	cmd := exec.Command("ip", append(args, exe, "-test.run=^$")...)
	cmd.Env = append(os.Environ(), helperEnv+"="+role)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("%s helper: %q, %v", role, line, err)
	}
}

// TestTheCapturedPodsDNSIsAnsweredByTheProxy installs the capture with
// DNS (both backends) in a pod's network namespace, runs the DNS proxy
// there and the resolvers beside it or on its loopback, and asks as the
// application: the mesh's names
// come from the proxy (authoritative), other names through it from the
// resolver, over UDP and TCP, IPv4 and IPv6, with Go's resolver falling
// back to TCP for a truncated answer — and the proxy's own queries to the
// same resolvers are not captured back to it.
func TestTheCapturedPodsDNSIsAnsweredByTheProxy(t *testing.T) {
	for _, c := range []struct{ mode, resolvers string }{
		{"nftables", resolverRemote}, {"iptables", resolverRemote}, {"nftables", resolverLocal}, {"iptables", resolverLocal},
	} {
		mode := c.mode
		t.Run(mode+"/resolvers-"+c.resolvers, func(t *testing.T) {
			ns, resolverNS := podNetns(t, c.resolvers)
			plan, err := capture.Build(capture.Settings{
				IncludeOutboundIPRanges: []string{"*"}, RedirectDNS: true,
				DNSServers: []netip.Addr{netip.MustParseAddr(resolverV4), netip.MustParseAddr(resolverV6)},
			})
			if err != nil {
				t.Fatal(err)
			}
			if mode == "nftables" {
				err = capture.ApplyNFTables(plan, ns)
			} else if err = capture.ApplyIPTables(context.Background(), plan.IPTables(), ns); err == nil {
				err = capture.ApplyIP6Tables(context.Background(), plan.IP6Tables(), ns)
			}
			if err != nil {
				t.Fatal(err)
			}
			exe := executable(t)
			helper(t, exe, resolverNS, "resolver", 0)
			helper(t, exe, ns, "proxy", 1337)
			cmd := exec.Command("ip", "netns", "exec", ns, exe, "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=client")
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			var got []clientResult
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("client output %q: %v", out, err)
			}
			want := []clientResult{
				{Query: "udp 192.0.2.53 pg.example.com. A", Authoritative: true, Answers: []string{"A pg.example.com. 240.240.0.1"}},
				{Query: "tcp 192.0.2.53 pg.example.com. A", Authoritative: true, Answers: []string{"A pg.example.com. 240.240.0.1"}},
				{Query: "udp fd00::53 pg.example.com. AAAA", Authoritative: true, Answers: []string{"AAAA pg.example.com. 2001:2::1"}},
				{Query: "tcp fd00::53 productpage.ns1.svc.cluster.local. A", Authoritative: true, Answers: []string{"A productpage.ns1.svc.cluster.local. 10.10.10.10"}},
				{Query: "udp 192.0.2.53 upstream.test. A", Answers: []string{"A upstream.test. 9.9.9.9"}},
				{Query: "udp fd00::53 upstream.test. A", Answers: []string{"A upstream.test. 9.9.9.9"}},
				{Query: "udp 192.0.2.53 big.test. TXT", Answers: nil},
				{Query: "go LookupHost pg.example.com", Answers: []string{"2001:2::1", "240.240.0.1"}},
				{Query: "go LookupTXT big.test", Answers: []string{"40"}},
			}
			if len(got) != len(want) {
				t.Fatalf("client: %+v", got)
			}
			for i, w := range want {
				g := got[i]
				if w.Query == "udp 192.0.2.53 big.test. TXT" {
					// Truncated by the resolver, passed on as it is.
					if g.Err != "" || g.Authoritative || len(g.Answers) == 0 || g.Answers[0] != "truncated" || len(g.Answers) > 40 {
						t.Errorf("%s: %+v, want the resolver's truncated answer", w.Query, g)
					}
					continue
				}
				if g.Query != w.Query || g.Err != w.Err || g.Authoritative != w.Authoritative || !slices.Equal(g.Answers, w.Answers) {
					t.Errorf("got %+v\nwant %+v", g, w)
				}
			}
		})
	}
}

// TestAQueryFromAPortTheProxyJustUsedStillReachesTheProxy is the race
// Istio's conntrack zones are for: the proxy (its user) asks the resolver
// from a source port, then the application asks the same resolver from
// the same port. Without the zones the second query is the first's
// connection to the kernel and goes to the resolver unredirected (the
// mesh's name unknown there); with them it is a connection of its own,
// redirected to the proxy.
func TestAQueryFromAPortTheProxyJustUsedStillReachesTheProxy(t *testing.T) {
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			ns, resolverNS := podNetns(t, resolverRemote)
			plan, err := capture.Build(capture.Settings{
				IncludeOutboundIPRanges: []string{"*"}, RedirectDNS: true,
				DNSServers: []netip.Addr{netip.MustParseAddr(resolverV4)},
			})
			if err != nil {
				t.Fatal(err)
			}
			if mode == "nftables" {
				err = capture.ApplyNFTables(plan, ns)
			} else {
				err = capture.ApplyIPTables(context.Background(), plan.IPTables(), ns)
			}
			if err != nil {
				t.Fatal(err)
			}
			exe := executable(t)
			helper(t, exe, resolverNS, "resolver", 0)
			helper(t, exe, ns, "proxy", 1337)
			ask := func(uid int, name string) clientResult {
				t.Helper()
				args := []string{"netns", "exec", ns}
				if uid != 0 {
					args = append(args, "setpriv", fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", uid), "--clear-groups")
				}
				cmd := exec.Command("ip", append(args, exe, "-test.run=^$")...)
				cmd.Env = append(os.Environ(), helperEnv+"=same-port", "NAME="+name)
				cmd.Stderr = os.Stderr
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("asking %s as %d: %v", name, uid, err)
				}
				var r clientResult
				if err := json.Unmarshal(out, &r); err != nil {
					t.Fatalf("%q: %v", out, err)
				}
				return r
			}
			// The proxy's user, not captured: the resolver answers.
			if r := ask(1337, "upstream.test."); r.Authoritative || !slices.Equal(r.Answers, []string{"A upstream.test. 9.9.9.9"}) {
				t.Fatalf("as the proxy's user: %+v, want the resolver's answer", r)
			}
			// The application, from the same port: the proxy answers.
			if r := ask(0, "pg.example.com."); !r.Authoritative || !slices.Equal(r.Answers, []string{"A pg.example.com. 240.240.0.1"}) {
				t.Fatalf("as the application, from the port the proxy's user used: %+v, want the proxy's answer", r)
			}
		})
	}
}
