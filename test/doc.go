// Package test holds Flotilla's cross-service tests: they build the real
// binaries and run them as separate processes, the way users and the other
// services see them.
package test
