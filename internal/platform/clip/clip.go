// Package clip cuts text a peer sent (a NACK's reason, a node ID) to a
// length fit for a log line or a status message.
package clip

import "unicode/utf8"

// String returns s when it has at most n bytes, else its first n bytes
// (never half a UTF-8 character) and "…".
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
