// Command flotilla-injector runs Flotilla's injector service.
package main

import (
	"os"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/services/injector/app"
)

func main() { os.Exit(command.Main(app.NewCommand())) }
