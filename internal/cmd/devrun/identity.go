package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/devjwt"
	"github.com/flotilla-mesh/flotilla/internal/platform/atomicfile"
)

// The control plane's service accounts, in the namespace ca gives their
// certificates Service names in, and the audience ca accepts.
const (
	systemNamespace = "istio-system"
	caAudience      = "istio-ca"
	// Tokens live an hour and are replaced every twenty minutes, as the
	// kubelet replaces projected tokens well before they expire; the
	// services read their token file for every request to ca.
	tokenLifetime = time.Hour
	tokenRefresh  = 20 * time.Minute
)

var accounts = []string{"flotilla-galley", "flotilla-discovery", "flotilla-injector"}

// identities stands in for what a cluster gives the control plane without
// one: a token issuer whose JWKS ca trusts, and a token file per service
// account.
type identities struct {
	dir    string
	issuer *devjwt.Issuer
}

// newIdentities makes a new issuer (a key per run) and writes its JWKS and
// a token for every control-plane service account under dir.
func newIdentities(dir string) (*identities, error) {
	iss, err := devjwt.New("https://flotilla.local/devrun")
	if err != nil {
		return nil, err //nolint:wrapcheck // devjwt's errors say what failed
	}
	ids := &identities{dir: dir, issuer: iss}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("identities: %w", err)
	}
	jwks, err := iss.JWKS()
	if err != nil {
		return nil, err //nolint:wrapcheck // as above
	}
	if err := atomicfile.Write(ids.jwksFile(), jwks, 0o600); err != nil {
		return nil, fmt.Errorf("identities: %w", err)
	}
	if err := ids.writeTokens(time.Now()); err != nil {
		return nil, err
	}
	return ids, nil
}

func (ids *identities) jwksFile() string { return filepath.Join(ids.dir, "jwks.json") }

func (ids *identities) tokenFile(account string) string {
	return filepath.Join(ids.dir, account+".token")
}

func (ids *identities) writeTokens(now time.Time) error {
	for _, account := range accounts {
		tok, err := ids.issuer.Token(systemNamespace, account, caAudience, now, tokenLifetime)
		if err != nil {
			return err //nolint:wrapcheck // devjwt's errors name the account
		}
		if err := atomicfile.Write(ids.tokenFile(account), []byte(tok), 0o600); err != nil {
			return fmt.Errorf("identities: %w", err)
		}
	}
	return nil
}

// refresh replaces the tokens every tokenRefresh until ctx ends.
func (ids *identities) refresh(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(tokenRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if err := ids.writeTokens(now); err != nil {
				log.Error("replacing the control plane's tokens", "error", err)
			}
		}
	}
}
