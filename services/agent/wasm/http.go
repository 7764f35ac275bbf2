package wasm

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

func (c *Cache) newHTTPClient(dial func(context.Context, string, string) (net.Conn, error), insecure bool) *http.Client {
	return &http.Client{
		Timeout:   c.o.HTTPRequestTimeout,
		Transport: newTransport(dial, insecure),
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 10 {
				return errors.New("stopped after 10 redirects")
			}
			if req.URL.Scheme == "http" && via[len(via)-1].URL.Scheme == "https" && !c.insecure(req.URL.Host) {
				return fmt.Errorf("redirect from https to plain HTTP %s refused", req.URL.Host)
			}
			return nil
		},
	}
}

// errPermanent marks an HTTP failure not worth another attempt.
var errPermanent = errors.New("not retried")

// fetchHTTP downloads a module over HTTP(S), in HTTPRequestMaxRetries
// attempts at most with exponential backoff between them (Istio's
// HTTPFetcher.Fetch), and unpacks it if it came in a tar or gzip.
func (c *Cache) fetchHTTP(ctx context.Context, rawURL string, insecure bool) ([]byte, error) {
	client := c.httpClient
	if insecure {
		client = c.insecureHTTPClient
	}
	backoff := c.o.retryBackoff
	var last error
	attempt := 1
	for ; ; attempt++ {
		data, err := c.httpAttempt(ctx, client, rawURL)
		if err == nil {
			return c.unbox(data), nil
		}
		last = err
		if errors.Is(err, errPermanent) || ctx.Err() != nil || attempt >= c.o.HTTPRequestMaxRetries {
			break
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("after %d attempts: %w (last: %w)", attempt, ctx.Err(), last)
		case <-t.C:
		}
		backoff = min(2*backoff, 10*time.Second)
	}
	return nil, fmt.Errorf("after %d attempts: %w", attempt, last)
}

func (c *Cache) httpAttempt(ctx context.Context, client *http.Client, rawURL string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errPermanent, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err // the network's: retried
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		err := fmt.Errorf("HTTP status %s", resp.Status)
		if !retryable(resp.StatusCode) {
			err = fmt.Errorf("%w: %w", errPermanent, err)
		}
		return nil, err
	}
	if resp.ContentLength > c.o.MaxModuleBytes {
		return nil, fmt.Errorf("%w: the module's %d bytes exceed the limit of %d", errPermanent, resp.ContentLength, c.o.MaxModuleBytes)
	}
	data, err := readAtMost(resp.Body, c.o.MaxModuleBytes)
	if errors.Is(err, errTooLarge) {
		return nil, fmt.Errorf("%w: %w", errPermanent, err)
	}
	return data, err
}

// retryable is Istio's: server errors but those another attempt cannot
// mend.
func retryable(code int) bool {
	return code >= 500 && code != http.StatusNotImplemented && code != http.StatusHTTPVersionNotSupported &&
		code != http.StatusNetworkAuthenticationRequired
}

var errTooLarge = errors.New("the module exceeds the size limit")

// readAtMost reads r whole, refusing more than limit bytes.
func readAtMost(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%w of %d bytes", errTooLarge, limit)
	}
	return data, nil
}

// unbox unpacks a module served in a gzip or a tar (its first file), a
// few levels deep, and returns the body as it came otherwise (Istio's
// unboxIfPossible): a failure shows in the checks that follow.
func (c *Cache) unbox(body []byte) []byte {
	b := body
	for range 4 {
		var err error
		switch {
		case isWasm(b):
			return b
		case len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b:
			var zr *gzip.Reader
			if zr, err = gzip.NewReader(bytes.NewReader(b)); err == nil {
				b, err = readAtMost(zr, c.o.MaxModuleBytes)
			}
		case len(b) > 262 && string(b[257:262]) == "ustar":
			tr := tar.NewReader(bytes.NewReader(b))
			if _, err = tr.Next(); err == nil {
				b, err = readAtMost(tr, c.o.MaxModuleBytes)
			}
		default:
			return body
		}
		if err != nil {
			return body
		}
	}
	return body
}
