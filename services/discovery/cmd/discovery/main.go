// Command flotilla-discovery runs Flotilla's discovery service.
package main

import (
	"os"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/services/discovery/app"
)

func main() { os.Exit(command.Main(app.NewCommand())) }
