package grpcserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"

	"go.opentelemetry.io/otel/metric"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/credentials"

	"github.com/flotilla-mesh/flotilla/internal/platform/clip"
)

// Log lines for refused handshakes: a few a second at most, whatever
// peers send (a peer chooses how many handshakes it fails).
const (
	handshakeLogsPerSecond = 1
	handshakeLogBurst      = 10
)

// handshakes are TLS credentials that count the handshakes they refuse
// and log them, rate-limited: a client that cannot connect (no client
// certificate where one is required, a certificate of another CA, a name
// it does not expect) otherwise leaves no trace on the server — grpc-go
// logs it only in its own verbose logging. A connection closed before it
// says anything (a TCP probe) is not a refusal.
type handshakes struct {
	credentials.TransportCredentials
	refused metric.Int64Counter
	log     *slog.Logger
	lines   *rate.Limiter
}

func countHandshakes(c credentials.TransportCredentials, meter metric.Meter, log *slog.Logger) (credentials.TransportCredentials, error) {
	refused, err := meter.Int64Counter("flotilla.grpc.server.handshakes_refused",
		metric.WithDescription("TLS handshakes the server refused or that failed (no client certificate where one is required, an untrusted certificate, a client that refused the server's)."))
	if err != nil {
		return nil, fmt.Errorf("metric: %w", err)
	}
	return &handshakes{TransportCredentials: c, refused: refused, log: log, lines: rate.NewLimiter(handshakeLogsPerSecond, handshakeLogBurst)}, nil
}

func (h *handshakes) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := h.TransportCredentials.ServerHandshake(conn)
	if err != nil && !closedEarly(err) {
		h.refused.Add(context.Background(), 1)
		if h.lines.Allow() {
			h.log.Info("TLS handshake refused (such lines are rate-limited)", "peer", peerHost(conn.RemoteAddr()), "error", clip.String(err.Error(), 512))
		}
	}
	return out, info, err
}

func (h *handshakes) Clone() credentials.TransportCredentials {
	return &handshakes{TransportCredentials: h.TransportCredentials.Clone(), refused: h.refused, log: h.log, lines: h.lines}
}

// closedEarly reports a connection that ended before its handshake did
// (a TCP health probe, a client going away), not a refusal.
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}
