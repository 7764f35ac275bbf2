// Package token is `flotilla token`: service account tokens where there is
// no cluster to issue them (docker compose, VMs, a laptop), signed with a
// key kept in a file, and the JWKS that ca then trusts (its --jwks-file
// and --jwt-issuer), so that a workload or the CLI gets its certificate
// from ca as a pod would with its projected token.
package token

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/flotilla-mesh/flotilla/internal/dev/devjwt"
)

// DefaultIssuer is the tokens' issuer unless --issuer says otherwise.
const DefaultIssuer = "https://flotilla.local/token"

// maxDuration bounds a token's lifetime: a token cannot be revoked, only
// outlived.
const maxDuration = 7 * 24 * time.Hour

// NewCommand returns the token command and its subcommands.
func NewCommand() *cobra.Command {
	var keyFile, issuer string
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Issue service account tokens ca trusts, where no cluster issues them",
		Long: `token signs service account tokens with a key kept in a file (created on first use), for a control
plane that runs without Kubernetes: ca trusts the key's JWKS (flotilla token jwks > jwks.json; then
flotilla-ca --jwks-file jwks.json --jwt-issuer ISSUER), and a token it issues gets the certificate of
spiffe://<trust domain>/ns/<namespace>/sa/<service account> from ca, as a pod's projected token does.
Keep the key file as private as ca's own key: whoever holds it can be any service account.`,
		Example: `  flotilla token jwks --key-file token.key > jwks.json
  flotilla token create --key-file token.key --namespace istio-system --service-account flotilla-cli > cli.token
  flotilla proxy-status --discovery-address 127.0.0.1:15012 --ca-address 127.0.0.1:15013 --token-file cli.token --cacert roots.pem`,
	}
	cmd.PersistentFlags().StringVar(&keyFile, "key-file", "", "the signing key (PKCS#8 PEM), created when absent (required)")
	cmd.PersistentFlags().StringVar(&issuer, "issuer", DefaultIssuer, "the tokens' issuer (iss), which ca is given as --jwt-issuer")
	_ = cmd.MarkPersistentFlagRequired("key-file")

	var namespace, account, audience string
	var duration time.Duration
	create := &cobra.Command{
		Use:   "create",
		Short: "Print a token for a service account",
		Args:  cobra.NoArgs,
		Example: `  flotilla token create --key-file token.key --namespace demo --service-account greeter --duration 1h
  flotilla token create --key-file token.key --namespace istio-system --service-account flotilla-cli`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case namespace == "" || account == "":
				return errors.New("--namespace and --service-account name whose token it is")
			case duration <= 0 || duration > maxDuration:
				return fmt.Errorf("--duration %s: want more than 0 and at most %s", duration, maxDuration)
			}
			iss, err := devjwt.LoadOrCreate(issuer, keyFile)
			if err != nil {
				return err
			}
			tok, err := iss.Token(namespace, account, audience, time.Now(), duration)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), tok)
			return err
		},
	}
	create.Flags().StringVarP(&namespace, "namespace", "n", "", "the service account's namespace (required)")
	create.Flags().StringVar(&account, "service-account", "", "the service account (required)")
	create.Flags().StringVar(&audience, "audience", "istio-ca", "the token's audience (ca accepts istio-ca)")
	create.Flags().DurationVar(&duration, "duration", time.Hour, "how long the token is valid (at most a week)")

	jwks := &cobra.Command{
		Use:     "jwks",
		Short:   "Print the JWKS ca trusts the tokens with (its --jwks-file)",
		Args:    cobra.NoArgs,
		Example: `  flotilla token jwks --key-file token.key > jwks.json`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			iss, err := devjwt.LoadOrCreate(issuer, keyFile)
			if err != nil {
				return err
			}
			b, err := iss.JWKS()
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), string(b))
			return err
		},
	}
	cmd.AddCommand(create, jwks)
	return cmd
}
