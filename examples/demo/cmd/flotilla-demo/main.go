// Command flotilla-demo is the demo `make run` and docker compose start: a
// greeter backend (one process per version) and a proxyless gRPC client
// that routes through Flotilla and prints how its calls split.
package main

import (
	"os"

	"github.com/flotilla-mesh/flotilla/examples/demo/app"
)

func main() { os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr)) }
