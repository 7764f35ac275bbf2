package proc

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/certclient"
)

// Certificate runs cl until the test ends and waits up to 30 seconds for
// its first certificate from ca.
func Certificate(tb testing.TB, cl *certclient.Client) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	go func() { _ = cl.Run(ctx) }()
	wait, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	if !cl.Wait(wait) {
		tb.Fatal("no certificate from ca within 30s")
	}
}

// ServeTLS accepts TLS connections on 127.0.0.1 with cfg until the test
// ends, completes each handshake, writes one byte and closes it, so a
// client can see the certificate served at each moment; it returns the
// address.
func ServeTLS(tb testing.TB, cfg *tls.Config) string {
	tb.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = lis.Close() })
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				if c.(*tls.Conn).Handshake() == nil {
					_, _ = c.Write([]byte("x"))
				}
			}(conn)
		}
	}()
	return lis.Addr().String()
}
