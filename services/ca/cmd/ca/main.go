// Command flotilla-ca runs Flotilla's ca service.
package main

import (
	"os"

	"github.com/flotilla-mesh/flotilla/internal/platform/command"
	"github.com/flotilla-mesh/flotilla/services/ca/app"
)

func main() { os.Exit(command.Main(app.NewCommand())) }
