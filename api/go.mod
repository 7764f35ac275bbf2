module github.com/flotilla-mesh/flotilla/api

go 1.26.0

require google.golang.org/protobuf v1.36.12
