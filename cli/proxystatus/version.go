package proxystatus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/flotilla-mesh/flotilla/cli/connect"
	"github.com/flotilla-mesh/flotilla/internal/debugapi"
)

// PrintVersions prints each discovery replica's version and the versions
// of the proxies it serves, counted (flotilla version). A replica that
// does not answer is printed with its error, which is also returned.
func PrintVersions(ctx context.Context, w io.Writer, conn *connect.Options) error {
	ctx, cl, done, err := conn.Connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	var b strings.Builder
	var errs []error
	for _, a := range cl.FetchAll(ctx, debugapi.Syncz) {
		if a.Err != nil {
			fmt.Fprintf(&b, "discovery %s: unavailable: %v\n", a.Address, a.Err)
			errs = append(errs, fmt.Errorf("discovery %s: %w", a.Address, a.Err))
			continue
		}
		fmt.Fprintf(&b, "discovery version: %s (replica %s of revision %s at %s)\n", cmp.Or(a.Replica.Info.Version, "unknown"), cmp.Or(a.Replica.ID, "unnamed"), connect.Revision(a.Replica), a.Address)
		syncs, err := debugapi.Syncs(a.Resp)
		if err != nil {
			errs = append(errs, fmt.Errorf("discovery %s: %w", a.Address, err))
			continue
		}
		counts := map[string]int{}
		for _, p := range syncs {
			counts[cmp.Or(p.IstioVersion, "unknown")]++
		}
		for _, v := range slices.Sorted(maps.Keys(counts)) {
			fmt.Fprintf(&b, "  proxies at %s: %d\n", v, counts[v])
		}
		if len(syncs) == 0 {
			b.WriteString("  no proxies\n")
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	return errors.Join(errs...)
}
