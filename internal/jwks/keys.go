// Package jwks fetches the JSON Web Key Sets that RequestAuthentications
// name, so that discovery can give proxies their issuers' keys inline
// (Envoy's local_jwks) and proxies need no route to the issuers, as
// istiod does with PILOT_JWT_ENABLE_REMOTE_JWKS=istiod. Keys are fetched
// when first named, refreshed at an interval, and kept from their last
// good fetch when a refresh fails; a location never fetched successfully
// has no keys, and the issuer's tokens are refused (FailClosed).
package jwks

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
)

// FailClosed is the key set given for an issuer whose keys are unknown:
// one RSA public key whose private key was thrown away when it was made,
// so no token verifies against it (Istio does the same with its
// FakeJwks).
const FailClosed = `{"keys":[{"kty":"RSA","e":"AQAB","alg":"RS256","use":"sig","kid":"flotilla-fail-closed",` +
	`"n":"0zVXZKpNXe8gMR8O-SO_CJ_XoBBfJKsAwHpwq9bnoG5a58uyU-kS44aSxJ1V1RA2SMOYMIBs87MCaZMlqPYhzfAwen3ii5Fht6aDQ4EF1QTKf6NSAF4yM4Vf0HN6N74p04W0_RRKGT7Ly1Dr3wca3koOQ3791ekmXMBjIFifwr_I31asLndxY8BHNZ0VDu-rs1iTUjhRcG0TEXSdmawNZdcW4_5a_Jun_k1vYe9zgUHdahOo6V_Sau7GbLtbOTj5T3n5jlpwTBDgQ46YaSYv9MaRANyZJ7Y6YyaYYgE8AaOlHtl1jUVxyo81CyqozLpYSWkKAKCgsdwFVmVsWZmdTw"}]}`

// key is the part of a JSON Web Key (RFC 7517, 7518, 8037) that decides
// whether Envoy can use it.
type key struct {
	Kty string `json:"kty"`
	// RSA
	N, E string
	// EC and OKP
	Crv, X, Y string
	// oct
	K string
}

// Parse reads a JSON Web Key Set and returns it compacted, keeping only
// the keys Envoy can verify signatures with (RSA, EC on P-256/384/521,
// Ed25519, symmetric): Envoy refuses a whole listener whose inline key
// set does not parse, so a key set from an issuer is never passed on
// unchecked. A set with no usable key is an error.
func Parse(data []byte) (string, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return "", fmt.Errorf("not a JSON Web Key Set: %w", err)
	}
	var kept []json.RawMessage
	var errs []error
	for i, raw := range set.Keys {
		var k key
		if err := json.Unmarshal(raw, &k); err != nil {
			errs = append(errs, fmt.Errorf("key %d: %w", i, err))
			continue
		}
		if err := k.usable(); err != nil {
			errs = append(errs, fmt.Errorf("key %d: %w", i, err))
			continue
		}
		var compact map[string]any
		if err := json.Unmarshal(raw, &compact); err != nil {
			errs = append(errs, fmt.Errorf("key %d: %w", i, err))
			continue
		}
		b, err := json.Marshal(compact)
		if err != nil {
			errs = append(errs, fmt.Errorf("key %d: %w", i, err))
			continue
		}
		kept = append(kept, b)
	}
	if len(set.Keys) == 0 {
		return "", errors.New("the key set is empty")
	}
	if len(kept) == 0 {
		return "", fmt.Errorf("no usable key: %w", errors.Join(errs...))
	}
	out, err := json.Marshal(struct {
		Keys []json.RawMessage `json:"keys"`
	}{kept})
	if err != nil {
		return "", fmt.Errorf("encode key set: %w", err)
	}
	return string(out), nil
}

func (k key) usable() error {
	b64 := func(name, v string, minLen int) error {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil {
			return fmt.Errorf("%s is not base64url: %w", name, err)
		}
		if len(b) < minLen {
			return fmt.Errorf("%s is too short", name)
		}
		return nil
	}
	switch k.Kty {
	case "RSA":
		if err := b64("n", k.N, 128); err != nil { // at least 1024 bits
			return err
		}
		e, err := base64.RawURLEncoding.DecodeString(k.E)
		if err != nil || len(e) == 0 || len(e) > 4 || new(big.Int).SetBytes(e).Int64() < 3 {
			return errors.New("e is not a usable RSA exponent")
		}
		return nil
	case "EC":
		sizes := map[string]int{"P-256": 32, "P-384": 48, "P-521": 66}
		n, ok := sizes[k.Crv]
		if !ok {
			return fmt.Errorf("curve %q is not P-256, P-384 or P-521", k.Crv)
		}
		if err := b64("x", k.X, n); err != nil {
			return err
		}
		return b64("y", k.Y, n)
	case "OKP":
		if k.Crv != "Ed25519" {
			return fmt.Errorf("curve %q is not Ed25519", k.Crv)
		}
		return b64("x", k.X, 32)
	case "oct":
		return b64("k", k.K, 1)
	}
	return fmt.Errorf("key type %q is not RSA, EC, OKP or oct", k.Kty)
}
