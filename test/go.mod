module github.com/flotilla-mesh/flotilla/test

go 1.26.0
