// Package xdsproxy forwards the pod's Envoy's ADS streams to discovery, as
// Istio's agent does: Envoy connects to a Unix socket in the pod (Istio's
// /etc/istio/proxy/XDS) without credentials, and the agent holds one gRPC
// connection to discovery's mTLS port with the workload certificate, so
// discovery knows the proxy's identity from it. Each Envoy stream, state
// of the world or delta, is relayed message by message on its own
// upstream stream; when either side ends, the other is ended with the
// same status; messages pass as the bytes received, never decoded
// (frame.go), but for ECDS responses when a wasm cache is given: those
// are decoded, their remote Wasm modules fetched and the resources
// rewritten to load them from local files, as Istio's agent does
// (ecds.go); and name table (NDS) responses when a DNS proxy takes them,
// which the agent asks for and acknowledges itself (nds.go). The
// workload's health (ReportHealth) is sent up each stream after Envoy's
// first request, and again on each change (health.go). Envoy's reconnection (with its backoff) starts both
// anew. The connection to discovery reconnects with gRPC's backoff. One
// Envoy stream is served at a time: a new one replaces the old, as in
// Istio.
package xdsproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	ndsv1 "github.com/flotilla-mesh/flotilla/api/gen/istio/networking/nds/v1"
	"github.com/flotilla-mesh/flotilla/internal/platform/grpcclient"
	"github.com/flotilla-mesh/flotilla/services/agent/identity"
	"github.com/flotilla-mesh/flotilla/services/agent/wasm"
)

// SocketPath is where Envoy's bootstrap points its xds-grpc cluster.
const SocketPath = "/etc/istio/proxy/XDS"

// windowBytes is the HTTP/2 flow-control window of the relay's
// connections.
const windowBytes = 4 << 20

// MaxMessageBytes bounds one xDS message either way.
const MaxMessageBytes = 64 << 20

// Options configures a Proxy.
type Options struct {
	// Address is discovery's mTLS xDS address (host:port); ServerName is
	// checked against its certificate (default: the host of Address).
	Address, ServerName string
	// State gives the workload certificate and the roots.
	State *identity.State
	// Wasm, when set, fetches the Wasm modules ECDS resources load
	// remotely, and ECDS responses reach Envoy rewritten to load them from
	// its files (ecds.go); nil relays them as they are.
	Wasm *wasm.Cache
	// NameTable, when set, is given every name table discovery sends:
	// the proxy asks for it on each Envoy stream and acknowledges it
	// itself (nds.go); Envoy never sees it.
	NameTable func(*ndsv1.NameTable)
	Log       *slog.Logger
}

// Proxy is the relay. Register it on the pod's gRPC server.
type Proxy struct {
	o    Options
	conn *grpc.ClientConn

	mu      sync.Mutex
	current context.CancelCauseFunc // the Envoy stream being served
	// connected is set while an upstream stream is open and has answered.
	connected atomic.Bool
	health    healthReports
}

// New returns a proxy; the connection to discovery is made lazily, with
// the certificate held at each handshake.
func New(o Options) (*Proxy, error) {
	if o.ServerName == "" {
		host, _, err := splitHost(o.Address)
		if err != nil {
			return nil, err
		}
		o.ServerName = host
	}
	o.Log = o.Log.With("component", "xds-proxy")
	conn, err := grpc.NewClient(o.Address,
		grpc.WithTransportCredentials(credentials.NewTLS(o.State.ClientTLS(o.ServerName))), grpcclient.ReconnectQuickly(),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// Windows that hold a large response whole, so a relayed 1 MiB CDS
		// does not wait on flow-control round trips (one connection per
		// pod: the memory is bounded by it).
		grpc.WithInitialWindowSize(windowBytes), grpc.WithInitialConnWindowSize(windowBytes),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
	)
	if err != nil {
		return nil, err
	}
	return &Proxy{o: o, conn: conn, health: healthReports{changed: make(chan struct{})}}, nil
}

// Close closes the connection to discovery.
func (p *Proxy) Close() error { return p.conn.Close() }

// Register adds the ADS service to the pod's server, which must have
// been built with ServerOptions.
func (p *Proxy) Register(gs *grpc.Server) {
	gs.RegisterService(p.serviceDesc(), p)
}

// Connected reports whether an Envoy stream is relayed and discovery has
// answered on it.
func (p *Proxy) Connected() bool { return p.connected.Load() }

var errReplaced = errors.New("a newer stream from the proxy replaced this one")

// serve makes ctx the one stream served, ending the previous one.
func (p *Proxy) serve(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	p.mu.Lock()
	if p.current != nil {
		p.current(errReplaced)
	}
	p.current = cancel
	p.mu.Unlock()
	return ctx, func() {
		p.mu.Lock()
		if p.current != nil && ctx.Err() == nil {
			p.current = nil
		}
		p.mu.Unlock()
		cancel(nil)
	}
}

// upstream is the client side of an ADS stream.
type upstream interface {
	Send(*frame) error
	Recv() (*frame, error)
	CloseSend() error
}

// relay forwards one Envoy stream both ways until either side ends. With
// a wasm cache, ECDS responses go through an ecdsConverter on their way
// to Envoy; every other message passes as it came.
func (p *Proxy) relay(ctx context.Context, delta bool, recv func() (*frame, error), send func(*frame) error,
	open func(context.Context) (upstream, error),
) error {
	ctx, done := p.serve(ctx)
	defer done()
	if _, ok := p.o.State.Wait(ctx); !ok {
		return status.Error(codes.Unavailable, "the agent has no workload certificate yet")
	}
	up, err := open(ctx)
	if err != nil {
		return status.Errorf(codes.Unavailable, "discovery %s: %v", p.o.Address, err)
	}
	defer p.connected.Store(false)
	errc := make(chan error, 3)
	// Sends either way are made from more than one goroutine with a
	// converter: each side's are serialized.
	var upMu, downMu sync.Mutex
	sendUp := func(f *frame) error {
		upMu.Lock()
		defer upMu.Unlock()
		return up.Send(f)
	}
	sendDown := func(f *frame) error {
		downMu.Lock()
		defer downMu.Unlock()
		return send(f)
	}
	var conv *ecdsConverter
	if p.o.Wasm != nil {
		conv = newECDSConverter(p.o.Wasm, delta, p.o.Log)
		// It ends with ctx, when relay returns (not waited for, as the
		// goroutines below: a send blocked on Envoy's flow control ends
		// when the handler does).
		go func() {
			errc <- conv.run(ctx,
				func(f *frame) error {
					if err := sendDown(f); err != nil {
						return downstreamEnd(err)
					}
					return nil
				},
				func(f *frame) error {
					if err := sendUp(f); err != nil {
						return upstreamEnd(p.o.Address, err)
					}
					return nil
				})
		}()
	}
	var nds *nameTables
	if p.o.NameTable != nil {
		nds = &nameTables{update: p.o.NameTable, delta: delta}
	}
	started := make(chan struct{}) // closed once Envoy's first request is sent
	go func() {                    // the workload's health, after Envoy's first request
		select {
		case <-ctx.Done():
			return
		case <-started:
		}
		if err := p.health.relay(ctx, delta, sendUp); err != nil {
			errc <- upstreamEnd(p.o.Address, err)
		}
	}()
	go func() { // Envoy → discovery
		first := true
		for {
			req, err := recv()
			if err != nil {
				// Envoy's end first, then discovery's side closed: the
				// relay ends with Envoy's (cleanly, when Envoy closed
				// its side), never with discovery's answer to the close.
				errc <- downstreamEnd(err)
				upMu.Lock()
				_ = up.CloseSend()
				upMu.Unlock()
				return
			}
			if conv != nil {
				conv.sawRequest(req)
			}
			if err := sendUp(req); err != nil {
				errc <- upstreamEnd(p.o.Address, err)
				return
			}
			if first {
				first = false
				close(started)
			}
			if nds == nil {
				continue
			}
			if ask := nds.request(req); ask != nil {
				if err := sendUp(ask); err != nil {
					errc <- upstreamEnd(p.o.Address, err)
					return
				}
			}
		}
	}()
	go func() { // discovery → Envoy
		for {
			resp, err := up.Recv()
			if err != nil {
				errc <- upstreamEnd(p.o.Address, err)
				return
			}
			p.connected.Store(true)
			if conv != nil && conv.take(ctx, resp) {
				continue
			}
			if nds != nil {
				if ack, ok := nds.take(resp); ok {
					if ack != nil {
						if err := sendUp(ack); err != nil {
							errc <- upstreamEnd(p.o.Address, err)
							return
						}
					}
					continue
				}
			}
			if err := sendDown(resp); err != nil {
				errc <- downstreamEnd(err)
				return
			}
		}
	}()
	select {
	case err := <-errc:
		if err != nil {
			p.o.Log.Info("xds stream ended", "error", err)
		}
		return err
	case <-ctx.Done():
		if cause := context.Cause(ctx); errors.Is(cause, errReplaced) {
			return status.Error(codes.Aborted, cause.Error())
		}
		return nil
	}
}

func downstreamEnd(err error) error {
	if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
		return nil
	}
	return err // the stream's status, passed on
}

// upstreamEnd is discovery's end of the stream, passed on to Envoy with
// its code.
func upstreamEnd(addr string, err error) error {
	if errors.Is(err, io.EOF) {
		return status.Errorf(codes.Unavailable, "discovery %s ended the stream", addr)
	}
	if st, ok := status.FromError(err); ok {
		return status.Errorf(st.Code(), "discovery %s: %s", addr, st.Message())
	}
	return status.Errorf(codes.Unavailable, "discovery %s: %v", addr, err)
}

func splitHost(addr string) (string, string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "", fmt.Errorf("discovery address %q: %w", addr, err)
	}
	return host, port, nil
}
