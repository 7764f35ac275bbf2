// Package platform is the shared service shell of every Flotilla binary. Its
// subpackages give each service the same logger, telemetry, gRPC and admin
// servers, configuration loading, command line and shutdown behaviour, so
// that all services look and behave alike.
package platform
