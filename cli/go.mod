module github.com/flotilla-mesh/flotilla/cli

go 1.26.0

require (
	github.com/flotilla-mesh/flotilla/internal v0.0.0-00010101000000-000000000000
	github.com/spf13/cobra v1.10.2
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
)

replace (
	github.com/flotilla-mesh/flotilla/api => ../api
	github.com/flotilla-mesh/flotilla/internal => ../internal
)
