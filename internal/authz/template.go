package authz

import (
	"regexp"
	"strings"
)

// Istio's path template operators: {*} one path segment, {**} any number
// of segments (Istio 1.20+, Envoy's uri_template).
const (
	matchOne = "{*}"
	matchAny = "{**}"
)

// templateReplacer writes an Istio path template as Envoy's
// uri_template: {*} → *, {**} → **.
var templateReplacer = strings.NewReplacer(matchAny, "**", matchOne, "*")

// pchar is the character class Envoy's uri_template lets a segment
// operator match (RFC 3986 pchar, less the "%"-encoded forms' checks).
const pchar = `[a-zA-Z0-9\-._~%!$&'()+,;:@=]`

// IsPathTemplate reports whether an AuthorizationPolicy path is a
// template (contains {*} or {**}).
func IsPathTemplate(p string) bool {
	return strings.Contains(p, matchOne) || strings.Contains(p, matchAny)
}

// TemplateRegex is the regular expression (RE2, whole string) a path
// template matches, as Envoy's uri_template compiles it: {*} one or more
// pchar characters (one segment), {**} zero or more pchar characters or
// "/" (any number of segments), the rest literally.
func TemplateRegex(p string) string {
	var b strings.Builder
	for rest := p; rest != ""; {
		i := strings.IndexByte(rest, '{')
		switch {
		case i < 0:
			b.WriteString(regexp.QuoteMeta(rest))
			rest = ""
		case strings.HasPrefix(rest[i:], matchAny):
			b.WriteString(regexp.QuoteMeta(rest[:i]) + pchar[:len(pchar)-1] + `/]*`)
			rest = rest[i+len(matchAny):]
		case strings.HasPrefix(rest[i:], matchOne):
			b.WriteString(regexp.QuoteMeta(rest[:i]) + pchar + `+`)
			rest = rest[i+len(matchOne):]
		default:
			b.WriteString(regexp.QuoteMeta(rest[:i+1]))
			rest = rest[i+1:]
		}
	}
	return b.String()
}
