// Command flotilla-galley runs Flotilla's galley service.
package main

import (
	"os"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/services/galley/app"
)

func main() { os.Exit(command.Main(app.NewCommand())) }
