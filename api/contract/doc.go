// Package contract holds the tests that pin the wire encoding of Flotilla's
// internal contracts (the generated code lives in ../gen and is rewritten
// wholesale by `make generate`, so tests cannot live beside it).
package contract
