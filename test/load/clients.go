// Package load measures discovery under many clients: it runs galley
// (file mode) and discovery as processes and N clients in another
// process, changes the configuration and measures when each client
// acknowledged the change. The clients are grpc-go xDS clients (Run; the
// times read from discovery's sync status) or raw ADS clients that ask
// and acknowledge as Envoy sidecars do (RunSidecars, sidecar.go; the times
// as the clients saw them).
package load

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpcxds "google.golang.org/grpc/xds"
)

// NodeID is the node ID of client i.
func NodeID(i int) string {
	return fmt.Sprintf("sidecar~10.%d.%d.%d~load-%d.default~default.svc.cluster.local", 100+i/65536, (i/256)%256, i%256, i)
}

// RunClients starts n grpc-go channels to xds:///target, each with its own
// xDS client and node ID, and keeps them until ctx ends.
func RunClients(ctx context.Context, xdsAddr, target string, n int) error {
	var conns []*grpc.ClientConn
	defer func() {
		for _, cc := range conns {
			_ = cc.Close()
		}
	}()
	for i := range n {
		bootstrap := fmt.Sprintf(`{"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
			"node": {"id": %q, "metadata": {"GENERATOR": "grpc"}}}`, xdsAddr, NodeID(i))
		r, err := grpcxds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
		if err != nil {
			return fmt.Errorf("client %d: %w", i, err)
		}
		cc, err := grpc.NewClient("xds:///"+target, grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("client %d: %w", i, err)
		}
		cc.Connect()
		conns = append(conns, cc)
	}
	<-ctx.Done()
	return nil
}
