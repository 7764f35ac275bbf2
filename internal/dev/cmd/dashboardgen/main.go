// Command dashboardgen writes Flotilla's Grafana dashboards (see
// internal/dev/dashboards), one <uid>.json file each, into a directory.
// `make generate` runs it; the result is committed.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/flotilla-mesh/flotilla/internal/dev/dashboards"
)

func main() {
	out := flag.String("out", "", "directory to write into (required)")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "dashboardgen: --out is required")
		os.Exit(2)
	}
	for _, d := range dashboards.All() {
		data, err := d.JSON()
		if err != nil {
			fmt.Fprintln(os.Stderr, "dashboardgen:", err)
			os.Exit(1)
		}
		if err := os.WriteFile(filepath.Join(*out, d.UID+".json"), data, 0o644); err != nil { //nolint:gosec // a dashboard in the repository, world-readable by design
			fmt.Fprintln(os.Stderr, "dashboardgen:", err)
			os.Exit(1)
		}
	}
}
