package devjwt

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/flotilla-mesh/flotilla/internal/platform/atomicfile"
)

// Dir keeps an issuer's JWKS and a token per service account as files in
// one directory, as a kubelet keeps projected tokens: ca reads jwks.json,
// each service reads <account>.token for every request to ca.
type Dir struct {
	Path   string
	Issuer *Issuer
	// Namespace of the accounts, and the audience of their tokens.
	Namespace, Audience string
	Accounts            []string
	// Lifetime of each token; Refresh replaces them well before it ends.
	Lifetime time.Duration
}

// JWKSFile is where Write puts the issuer's JWKS.
func (d *Dir) JWKSFile() string { return filepath.Join(d.Path, "jwks.json") }

// TokenFile is where Write puts account's token.
func (d *Dir) TokenFile(account string) string {
	return filepath.Join(d.Path, account+".token")
}

// Write writes the JWKS (public) and a token, valid from now, for every
// account (private to the user: the services run as the same one), each
// file replaced in one step.
func (d *Dir) Write(now time.Time) error {
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return fmt.Errorf("devjwt: %w", err)
	}
	jwks, err := d.Issuer.JWKS()
	if err != nil {
		return err
	}
	if err := atomicfile.Write(d.JWKSFile(), jwks, 0o644); err != nil {
		return fmt.Errorf("devjwt: %w", err)
	}
	for _, account := range d.Accounts {
		tok, err := d.Issuer.Token(d.Namespace, account, d.Audience, now, d.Lifetime)
		if err != nil {
			return err
		}
		if err := atomicfile.Write(d.TokenFile(account), []byte(tok), 0o600); err != nil {
			return fmt.Errorf("devjwt: %w", err)
		}
	}
	return nil
}

// Refresh rewrites the tokens every third of their lifetime until ctx
// ends; a failed write is logged and tried again at the next tick, while
// the tokens written before are still valid.
func (d *Dir) Refresh(ctx context.Context, log *slog.Logger) {
	if d.Lifetime/3 <= 0 { // no lifetime: nothing expires, nothing to replace
		<-ctx.Done()
		return
	}
	t := time.NewTicker(d.Lifetime / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if err := d.Write(now); err != nil {
				log.Error("replacing service account tokens", "dir", d.Path, "error", err)
			}
		}
	}
}
