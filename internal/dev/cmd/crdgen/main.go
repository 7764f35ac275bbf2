// Command crdgen writes the CustomResourceDefinitions of the Istio kinds
// Flotilla serves (see internal/dev/crdgen) as one multi-document YAML file.
// `make generate` runs it; the result is committed.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/flotilla-mesh/flotilla/internal/dev/crdgen"
)

func main() {
	out := flag.String("out", "", "file to write (required)")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "crdgen: --out is required")
		os.Exit(2)
	}
	data, err := crdgen.YAML(crdgen.All())
	if err != nil {
		fmt.Fprintln(os.Stderr, "crdgen:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil { //nolint:gosec // a manifest in the repository, world-readable by design
		fmt.Fprintln(os.Stderr, "crdgen:", err)
		os.Exit(1)
	}
}
