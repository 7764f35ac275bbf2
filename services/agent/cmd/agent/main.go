// Command flotilla-agent runs Flotilla's agent service.
package main

import (
	"os"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/services/agent/app"
)

func main() { os.Exit(command.Main(app.NewCommand())) }
