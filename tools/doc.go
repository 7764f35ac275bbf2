// Package tools pins the build and test tools (buf, protoc plugins,
// golangci-lint) through the tool directives in go.mod, so that every machine
// installs the same versions with `make tools`.
package tools
