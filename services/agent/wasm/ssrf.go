package wasm

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// cloudMetadata are metadata services outside the link-local range
// (Istio's knownCloudMetadataRanges): Alibaba Cloud's, AWS's IPv6 one.
func cloudMetadata() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("100.100.100.200/32"), netip.MustParsePrefix("fd00:ec2::/32")}
}

// blocked is Istio's wasmBlockedIP: link-local addresses (cloud metadata
// at 169.254.169.254 among them), the other known metadata addresses, and
// the configured ranges. Loopback and private addresses stay allowed: an
// in-cluster registry is usual.
func blocked(ip netip.Addr, extra []netip.Prefix) error {
	ip = ip.Unmap()
	if ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() {
		return fmt.Errorf("connection to %s refused: link-local address", ip)
	}
	for _, p := range cloudMetadata() {
		if p.Contains(ip) {
			return fmt.Errorf("connection to %s refused: a cloud metadata address", ip)
		}
	}
	for _, p := range extra {
		if p.Contains(ip) {
			return fmt.Errorf("connection to %s refused: in blocked range %s", ip, p)
		}
	}
	return nil
}

// dialer checks the resolved address of every connection before it is
// made (Istio's wasmDialContext / BlockedIPDialContext), so neither a
// redirect nor a name resolving to a blocked address gets through.
func dialer(extra []netip.Prefix) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{
		Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("dial %s: %w", address, err)
			}
			return blocked(ap.Addr(), extra)
		},
	}
	return d.DialContext
}

// newTransport is http.DefaultTransport's settings with the checked
// dialer; insecure skips certificate verification.
func newTransport(dial func(context.Context, string, string) (net.Conn, error), insecure bool) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone() //nolint:forcetypeassert // the standard library's
	t.DialContext = dial
	if insecure {
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // only for the hosts the operator lists
	}
	return t
}

// registryGuard is the registry client's transport: plain HTTP only to
// insecure registries (go-containerregistry falls back to it on its own
// for loopback and private names), and no token realm on a private
// address (Istio's ssrfProtectionTransport).
type registryGuard struct {
	c     *Cache
	inner http.RoundTripper
}

func (g registryGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.c.insecure(req.URL.Host) {
		return nil, fmt.Errorf("plain HTTP to %s refused: it is not one of the insecure registries", req.URL.Host)
	}
	resp, err := g.inner.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	for _, h := range resp.Header.Values("WWW-Authenticate") {
		if err := checkBearerRealm(h); err != nil {
			_ = resp.Body.Close()
			return nil, fmt.Errorf("registry %s: %w", req.URL.Host, err)
		}
	}
	return resp, nil
}

// checkBearerRealm refuses a bearer challenge whose realm, the URL the
// client would fetch a token from, is not http(s) or names a loopback,
// private or link-local host (Istio's validateAllRealms). Basic
// challenges carry no URL.
func checkBearerRealm(challenge string) error {
	scheme, params, _ := strings.Cut(strings.TrimSpace(challenge), " ")
	if !strings.EqualFold(scheme, "bearer") {
		return nil
	}
	for rest := params; ; {
		i := strings.Index(rest, `realm="`)
		if i < 0 {
			return nil
		}
		rest = rest[i+len(`realm="`):]
		end := strings.IndexByte(rest, '"')
		if end < 0 {
			return nil
		}
		if err := checkRealm(rest[:end]); err != nil {
			return err
		}
		rest = rest[end+1:]
	}
}

func checkRealm(realm string) error {
	u, err := url.Parse(realm)
	if err != nil {
		return fmt.Errorf("token realm %q: %w", realm, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("token realm %q refused: scheme %q", realm, u.Scheme)
	}
	host := u.Hostname()
	switch host {
	case "":
		return fmt.Errorf("token realm %q refused: no host", realm)
	case "localhost", "metadata.google.internal":
		return fmt.Errorf("token realm %q refused: a local or metadata host", realm)
	}
	if ip, err := netip.ParseAddr(host); err == nil && (ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast()) {
		return fmt.Errorf("token realm %q refused: a private, loopback or link-local address", realm)
	}
	return nil
}
