package validation

import (
	"fmt"
	"net/netip"
	"regexp/syntax"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	networking "istio.io/api/networking/v1alpha3"
)

// Limits that keep what users write within what Envoy and the mesh accept.
const (
	maxRegexBytes = 1024
	// maxRegexProgram is Envoy's default RE2 program size error level: a
	// larger regex is rejected by the proxy at load time.
	maxRegexProgram = 100
	// maxRegexBytesPerObject and maxRegexInstsPerObject bound the regex
	// work of one object: thousands of ordinary regexes fit.
	maxRegexBytesPerObject = 256 << 10
	maxRegexInstsPerObject = 200_000
	maxHostBytes           = 255
	maxLabelValue          = 63
	// MinTimeout is the smallest meaningful timeout: Envoy's resolution.
	minTimeout = time.Millisecond
	// maxTimeout bounds durations users type, catching unit slips (a
	// "10000h" timeout is a mistake, not a policy).
	maxTimeout = 30 * 24 * time.Hour
)

func at(path string, i int) string   { return fmt.Sprintf("%s[%d]", path, i) }
func key(path, k string) string      { return fmt.Sprintf("%s[%s]", path, k) }
func field(path, name string) string { return path + "." + name }
func quoted(ss []string) string      { return "[" + strings.Join(ss, ", ") + "]" }

// dns1123Label returns why s is not a DNS-1123 label, or "".
func dns1123Label(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > 63:
		return "must be at most 63 characters"
	}
	for i, c := range s {
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(s)-1) {
			return "must consist of lower case letters, digits and '-', and start and end with a letter or digit"
		}
	}
	return ""
}

// dns1123Subdomain returns why s is not a DNS-1123 subdomain, or "".
func dns1123Subdomain(s string) string {
	if s == "" {
		return "must not be empty"
	}
	if len(s) > 253 {
		return "must be at most 253 characters"
	}
	for _, l := range strings.Split(s, ".") {
		if dns1123Label(l) != "" {
			return "must be lower case labels of letters, digits and '-' separated by '.'"
		}
	}
	return ""
}

// hostLabel accepts a DNS label in any case (hostnames are case-insensitive).
func hostLabel(l string) bool {
	if l == "" || len(l) > 63 {
		return false
	}
	for i, c := range l {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(l)-1) {
			return false
		}
	}
	return true
}

// host checks a service host as Istio accepts it: "*", "*.suffix", a fully
// qualified name or a short name (resolved against the object's namespace).
func (v *validator) host(path, h string, allowStar bool) {
	switch {
	case h == "":
		v.r.errorf(path, "host must not be empty")
		return
	case len(h) > maxHostBytes:
		v.r.errorf(path, "host is longer than %d characters", maxHostBytes)
		return
	case h == "*":
		if !allowStar {
			v.r.errorf(path, "wildcard host * is not allowed here")
		}
		return
	}
	rest := strings.TrimPrefix(h, "*.")
	if _, err := netip.ParseAddr(rest); err == nil && rest == h {
		return // an IP address as host
	}
	if rest == h && strings.HasPrefix(h, "*") {
		// "*foo.com": Istio's wildcard domains take a * prefixed to the
		// first label too.
		rest = strings.TrimPrefix(h, "*")
	}
	for _, l := range strings.Split(rest, ".") {
		if !hostLabel(l) {
			if strings.Contains(l, "*") {
				v.r.errorf(path, "host %q: a wildcard is only allowed as the whole first label (\"*.example.com\")", h)
			} else {
				v.r.errorf(path, "host %q is not a valid DNS name: label %q", h, l)
			}
			return
		}
	}
}

// namespacedHost checks "namespace/host" as used by Gateway servers and
// Sidecar egress: namespace is "*", "." , "~" or a namespace name.
func (v *validator) namespacedHost(path, h string) {
	ns, host, ok := strings.Cut(h, "/")
	if !ok {
		v.r.errorf(path, "host %q must be namespace/dnsName (e.g. \"*/reviews.example.com\", \"./*\")", h)
		return
	}
	if ns != "*" && ns != "." && ns != "~" && dns1123Label(ns) != "" {
		v.r.errorf(path, "host %q: namespace %q must be *, ., ~ or a namespace name", h, ns)
	}
	v.host(path, host, true)
}

func (v *validator) port(path string, n uint32) {
	if n < 1 || n > 65535 {
		v.r.errorf(path, "port %d must be between 1 and 65535", n)
	}
}

// knownProtocol reports whether Istio understands a port protocol.
func knownProtocol(p string) bool {
	switch strings.ToUpper(p) {
	case "HTTP", "HTTPS", "HTTP2", "GRPC", "GRPC-WEB", "MONGO", "REDIS", "MYSQL", "TCP", "TLS", "UDP":
		return true
	}
	return false
}

func (v *validator) protocol(path, p string) {
	if !knownProtocol(p) {
		v.r.errorf(path, "unknown protocol %q (known: HTTP, HTTPS, HTTP2, GRPC, GRPC-WEB, TCP, TLS, MONGO, MYSQL, REDIS, UDP)", p)
	}
}

// sniffedProtocol checks a port protocol that may be left out, as a
// ServiceEntry's or a Sidecar listener's may (Istio's ValidateProtocol:
// no protocol means the proxy tells it per connection).
func (v *validator) sniffedProtocol(path, p string) {
	if p != "" && !knownProtocol(p) {
		v.r.errorf(path, "unknown protocol %q (known: HTTP, HTTPS, HTTP2, GRPC, GRPC-WEB, TCP, TLS, MONGO, MYSQL, REDIS, UDP)", p)
	}
}

// portName checks a port name: a DNS label (Kubernetes' rule).
func (v *validator) portName(path, name string) {
	if msg := dns1123Label(name); msg != "" {
		v.r.errorf(path, "port name %q %s", name, msg)
	}
}

// labels checks Kubernetes label keys and values.
func (v *validator) labels(path string, m map[string]string) {
	for k, val := range m {
		if msg := labelKey(k); msg != "" {
			v.r.errorf(key(path, k), "label key %q %s", k, msg)
		}
		if msg := labelValue(val); msg != "" {
			v.r.errorf(key(path, k), "label value %q %s", val, msg)
		}
	}
}

func labelKey(k string) string {
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if hasPrefix && dns1123Subdomain(prefix) != "" {
		return "has an invalid prefix: it must be a DNS subdomain"
	}
	if name == "" || len(name) > 63 || !labelChars(name, false) {
		return "must be 1-63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	}
	return ""
}

func labelValue(val string) string {
	if len(val) > maxLabelValue || !labelChars(val, true) {
		return "must be at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	}
	return ""
}

func labelChars(s string, emptyOK bool) bool {
	if s == "" {
		return emptyOK
	}
	for i, c := range s {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && ((c != '-' && c != '_' && c != '.') || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}

// selector checks a workload selector: at least one label, all valid.
// optionalSelector checks a selector that may be empty: Istio accepts an
// empty one (it selects every workload in the namespace) and warns.
func (v *validator) optionalSelector(path string, m map[string]string) {
	if len(m) == 0 {
		v.r.warnf(path, "the selector has no labels: it selects every workload in the namespace (omit it to say so)")
		return
	}
	v.labels(path, m)
}

// unixAddress checks the path of a unix:// address, as Istio does: an
// abstract socket (@name), or an absolute path to a file.
func (v *validator) unixAddress(path, sock string) {
	switch {
	case sock == "":
		v.r.errorf(path, "unix:// names no socket path")
	case strings.HasPrefix(sock, "@"):
	case !strings.HasPrefix(sock, "/") || strings.HasSuffix(sock, "/"):
		v.r.errorf(path, "unix://%s: the socket must be an absolute path to a file", sock)
	}
}

func (v *validator) selector(path string, m map[string]string) {
	if len(m) == 0 {
		v.r.errorf(path, "a workload selector must have at least one label (omit it to select every workload)")
		return
	}
	v.labels(path, m)
}

// duration checks a protobuf duration lies in [min, maxTimeout].
func (v *validator) duration(path string, d *durationpb.Duration, minimum time.Duration) {
	if d == nil {
		return
	}
	if err := d.CheckValid(); err != nil {
		v.r.errorf(path, "invalid duration: %v", err)
		return
	}
	got := d.AsDuration()
	switch {
	case got < minimum:
		v.r.errorf(path, "duration %s must be at least %s", got, minimum)
	case got > maxTimeout:
		v.r.errorf(path, "duration %s is longer than %s", got, maxTimeout)
	}
}

// regex checks an RE2 regular expression Envoy will accept, within the
// object's regex budget: an object whose regexes together are longer than
// maxRegexBytesPerObject, or compile to more than maxRegexInstsPerObject
// instructions, is refused once, and its other regexes are not compiled
// (a hostile object cannot buy seconds of the webhook's CPU).
func (v *validator) regex(path, re string) {
	if len(re) > maxRegexBytes {
		v.r.errorf(path, "regex is %d bytes, longer than %d", len(re), maxRegexBytes)
		return
	}
	if v.regexOver {
		return
	}
	v.regexBytes += len(re)
	if v.regexBytes > maxRegexBytesPerObject {
		v.regexOver = true
		v.r.errorf(path, "the object's regexes are more than %d bytes in all; not compiled", maxRegexBytesPerObject)
		return
	}
	// Go's regexp.Compile is this parse and compile: its errors are the
	// parse's, word for word.
	parsed, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		v.r.errorf(path, "invalid RE2 regex: %v", err)
		return
	}
	prog, err := syntax.Compile(parsed.Simplify())
	if err != nil {
		v.r.errorf(path, "invalid RE2 regex: %v", err)
		return
	}
	if len(prog.Inst) > maxRegexProgram*4 {
		// RE2's program size and Go's instruction count differ; a Go
		// program four times Envoy's limit is certainly over it.
		v.r.errorf(path, "regex is too complex for Envoy (program size limit %d)", maxRegexProgram)
	}
	v.regexInsts += len(prog.Inst)
	if v.regexInsts > maxRegexInstsPerObject {
		v.regexOver = true
		v.r.errorf(path, "the object's regexes compile to more than %d instructions in all; not compiled further", maxRegexInstsPerObject)
	}
}

// stringMatch checks an Istio StringMatch: exactly one of exact, prefix,
// regex.
func (v *validator) stringMatch(path string, m *networking.StringMatch) {
	if m == nil {
		return
	}
	switch t := m.GetMatchType().(type) {
	case nil:
		v.r.errorf(path, "one of exact, prefix or regex must be set")
	case *networking.StringMatch_Regex:
		v.regex(field(path, "regex"), t.Regex)
	default:
	}
}

// headerName checks an HTTP header name is an RFC 7230 token.
func (v *validator) headerName(path, name string) bool {
	if name == "" {
		v.r.errorf(path, "header name must not be empty")
		return false
	}
	for _, c := range name {
		token := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c)
		if !token {
			v.r.errorf(path, "header name %q is not a valid HTTP token", name)
			return false
		}
	}
	return true
}

// headerOps checks header names that routes may set or remove: valid
// tokens, and never pseudo-headers or Host, which Envoy does not let routes
// change.
func (v *validator) headerOps(path string, ops *networking.Headers_HeaderOperations) {
	if ops == nil {
		return
	}
	check := func(p, name string) {
		if strings.EqualFold(name, "host") || strings.HasPrefix(name, ":") {
			v.r.errorf(p, "header %q cannot be changed by a route", name)
			return
		}
		v.headerName(p, name)
	}
	for name := range ops.GetSet() {
		check(key(field(path, "set"), name), name)
	}
	for name := range ops.GetAdd() {
		check(key(field(path, "add"), name), name)
	}
	for i, name := range ops.GetRemove() {
		check(at(field(path, "remove"), i), name)
	}
}

func (v *validator) percent(path string, p float64) {
	if p < 0 || p > 100 {
		v.r.errorf(path, "percentage %v must be between 0 and 100", p)
	}
}

// exportTo checks Istio's visibility list.
func (v *validator) exportTo(path string, list []string) {
	seen := map[string]bool{}
	for i, ns := range list {
		p := at(path, i)
		switch {
		case ns == "*" || ns == "." || ns == "~":
		case dns1123Label(ns) != "":
			v.r.errorf(p, "%q must be *, ., ~ or a namespace name", ns)
		}
		if seen[ns] {
			v.r.errorf(p, "%q is listed twice", ns)
		}
		seen[ns] = true
	}
	if seen["~"] && len(list) > 1 {
		v.r.errorf(path, "~ (export to no namespace) cannot be combined with other entries")
	}
	if seen["*"] && len(list) > 1 {
		v.r.errorf(path, "* (export to every namespace) cannot be combined with other entries")
	}
}

// addressOrCIDR checks an IP address or CIDR block.
func (v *validator) addressOrCIDR(path, s string) {
	if _, err := netip.ParseAddr(s); err == nil {
		return
	}
	if _, err := netip.ParsePrefix(s); err != nil {
		v.r.errorf(path, "%q is neither an IP address nor a CIDR block", s)
	}
}
