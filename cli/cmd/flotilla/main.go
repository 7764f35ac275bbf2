// Command flotilla is the operator's command line for a Flotilla mesh.
package main

import (
	"os"

	"github.com/flotilla-mesh/flotilla/cli/root"
)

func main() { os.Exit(root.Main(os.Args[1:], os.Stdout, os.Stderr)) }
