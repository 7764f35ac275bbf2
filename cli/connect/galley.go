package connect

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/flotilla-mesh/flotilla/internal/debugapi"
	"github.com/flotilla-mesh/flotilla/internal/mcp"
)

// GalleyKnown reports whether the flags or the context file say where
// galley is (a cluster always does).
func (o *Options) GalleyKnown() bool {
	if o.Kube.Enabled() {
		return true
	}
	c, err := o.resolve()
	return err == nil && c.GalleyAddress != ""
}

// ReadGalley subscribes to galley's collections typeURLs over MCP, as
// discovery does, passes each response to each (one at a time) until
// every collection has answered once, and stops; all within the
// --timeout. agent names the command in galley's logs. The replica that
// answered is as its responses name it.
func (o *Options) ReadGalley(ctx context.Context, agent string, typeURLs []string, each func(typeURL string, updated []*mcp.Resource, removed []string)) (debugapi.Replica, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	cc, stop, err := o.DialGalley(ctx)
	if err != nil {
		return debugapi.Replica{}, err
	}
	defer stop()
	var mu sync.Mutex
	seen := map[string]bool{}
	done := make(chan struct{})
	handler := mcp.HandlerFunc(func(typeURL string, updated []*mcp.Resource, removed []string) error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == len(typeURLs) {
			return nil // done: what follows is not read
		}
		each(typeURL, updated, removed)
		if !seen[typeURL] {
			seen[typeURL] = true
			if len(seen) == len(typeURLs) {
				close(done)
			}
		}
		return nil
	})
	host, _ := os.Hostname()
	client, err := mcp.NewClient(mcp.ClientOptions{
		Conn: cc, NodeID: agent + "~" + host, TypeURLs: typeURLs, Handler: handler, Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return debugapi.Replica{}, fmt.Errorf("galley subscription: %w", err)
	}
	runCtx, stopClient := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = client.Run(runCtx); close(ran) }()
	defer func() { stopClient(); <-ran }()
	select {
	case <-done:
		return debugapi.ReplicaOf(client.ControlPlane()), nil
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return debugapi.Replica{}, fmt.Errorf("galley answered %d of %d collections within %s (is it running, and are --galley-address and the credentials right?)", len(seen), len(typeURLs), o.Timeout)
	}
}

// GalleySubscribers asks galley (within the --timeout) for its
// subscribers: discovery replicas and injectors, with their versions and
// what each has not answered or rejected. The answer names galley.
func (o *Options) GalleySubscribers(ctx context.Context) (debugapi.Replica, []debugapi.Subscriber, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	cc, stop, err := o.DialGalley(ctx)
	if err != nil {
		return debugapi.Replica{}, nil, err
	}
	defer stop()
	resp, err := debugapi.Fetch(ctx, cc, debugapi.Subscribers)
	if err != nil {
		return debugapi.Replica{}, nil, err // the status of galley's answer
	}
	subs, err := debugapi.SubscribersOf(resp)
	if err != nil {
		return debugapi.Replica{}, nil, err
	}
	return debugapi.ReplicaOf(resp.GetControlPlane()), subs, nil
}

// GalleyRejections asks galley for what it refuses to serve
// (debugapi.Rejections): the configuration documents and objects that
// did not validate.
func (o *Options) GalleyRejections(ctx context.Context) ([]debugapi.Rejection, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	cc, stop, err := o.DialGalley(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	resp, err := debugapi.Fetch(ctx, cc, debugapi.Rejections)
	if err != nil {
		return nil, err // the status of galley's answer
	}
	return debugapi.RejectionsOf(resp)
}
