package grpcserver

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/peer"
)

// peerLimit is a listener that holds at most max connections from one
// peer address (IP) at a time: a connection over that is closed as soon
// as it is accepted, before any handshake, and costs the server nothing
// more. A pod has its own address; the peers that share one (the pods of
// a node on its host network, a NAT) share its limit too.
type peerLimit struct {
	net.Listener
	max int
	log *slog.Logger

	mu     sync.Mutex
	open   map[string]int
	logged time.Time // when a refusal was last logged (at most one a minute)
}

func limitPerPeer(lis net.Listener, max int, log *slog.Logger) net.Listener {
	if max <= 0 {
		return lis
	}
	return &peerLimit{Listener: lis, max: max, log: log, open: map[string]int{}}
}

func (l *peerLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err // the listener's own error, as grpc-go expects it
		}
		host := peerHost(c.RemoteAddr())
		l.mu.Lock()
		if l.open[host] >= l.max {
			logIt := time.Since(l.logged) > time.Minute
			if logIt {
				l.logged = time.Now()
			}
			l.mu.Unlock()
			_ = c.Close()
			if logIt {
				l.log.Warn("refusing connections from a peer over its limit (logged at most once a minute)", "peer", host, "max", l.max)
			}
			continue
		}
		l.open[host]++
		l.mu.Unlock()
		return &peerConn{Conn: c, release: func() { l.release(host) }}, nil
	}
}

func (l *peerLimit) release(host string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[host]--; l.open[host] <= 0 {
		delete(l.open, host)
	}
}

// peerHost is the IP of addr, or addr itself without one.
func peerHost(addr net.Addr) string {
	if ta, ok := addr.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}

// peerConn gives its peer's slot back once, when closed.
type peerConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *peerConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// PeerIP is the IP address of a call's peer ("" when the call has none:
// a unix socket, a test calling a handler directly), as the per-peer
// limits key it.
func PeerIP(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	return peerHost(p.Addr)
}
