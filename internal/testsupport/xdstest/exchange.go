package xdstest

import (
	"context"
	"time"
)

// Stream is the client side of an xDS stream, state of the world or
// delta.
type Stream[Req, Resp any] interface {
	Send(Req) error
	CloseSend() error
	Recv() (Resp, error)
}

// SendAndDrain opens a stream, sends req n times, closes its sending side
// and reads until the server ends the stream (or 2 s pass): what a
// hostile or fuzzed peer does, without caring what it gets back.
func SendAndDrain[Req, Resp any, S Stream[Req, Resp]](open func(context.Context) (S, error), req Req, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := open(ctx)
	if err != nil {
		return
	}
	for range n {
		_ = st.Send(req)
	}
	_ = st.CloseSend()
	for {
		if _, err := st.Recv(); err != nil {
			return
		}
	}
}
