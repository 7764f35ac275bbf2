package istio

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// MaxFileBytes bounds one YAML file.
const MaxFileBytes = 8 << 20

// Document is one YAML document of a file: a decoded object, or the reason
// it could not be decoded.
type Document struct {
	File string
	// Line is where the document starts (1-based).
	Line int
	// Object is nil when Err is set.
	Object *Object
	// Err is a *DecodeError.
	Err error
	// Foreign is a document of another kind than Istio's, kept (as JSON)
	// when DecodeOptions.KeepForeign asks; Object and Err are then nil.
	Foreign *Foreign

	root *yaml.Node
}

// Foreign is a Kubernetes object of a kind Flotilla does not serve (a
// Service, a Deployment): its type and its JSON encoding.
type Foreign struct {
	APIVersion, Kind string
	JSON             []byte
}

// DecodeOptions change what Decode keeps.
type DecodeOptions struct {
	// KeepForeign keeps documents with an apiVersion and kind that is not
	// an Istio kind as Foreign, rather than as an error.
	KeepForeign bool
}

// DecodeError says which document failed and why, formatted the way
// compilers do: "file:line: Kind namespace/name: reason".
type DecodeError struct {
	File   string
	Line   int
	Object string // "Kind namespace/name", when known
	Reason string
}

func (e *DecodeError) Error() string {
	if e.Object == "" {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Object, e.Reason)
}

// Decode reads every document of a multi-document YAML file. Objects
// without a namespace get defaultNamespace. Documents are independent: one
// bad document does not affect the others. Empty documents are skipped.
func Decode(file string, data []byte, defaultNamespace string) []Document {
	return DecodeWith(file, data, defaultNamespace, DecodeOptions{})
}

// DecodeWith is Decode with options.
func DecodeWith(file string, data []byte, defaultNamespace string, o DecodeOptions) []Document {
	if len(data) > MaxFileBytes {
		return []Document{{File: file, Line: 1, Err: &DecodeError{
			File: file, Line: 1,
			Reason: fmt.Sprintf("file is %d bytes, larger than the %d allowed", len(data), MaxFileBytes),
		}}}
	}
	var docs []Document
	for _, chunk := range split(data) {
		d, ok := decodeOne(file, chunk, defaultNamespace, o)
		if ok {
			docs = append(docs, d)
		}
	}
	return docs
}

type chunk struct {
	line int // first line of the chunk in the file, 1-based
	data []byte
}

// split cuts a file at document separators ("---" lines), remembering where
// each document starts. Splitting before parsing keeps a syntax error in one
// document from hiding the documents after it.
func split(data []byte) []chunk {
	var out []chunk
	cur := chunk{line: 1}
	var buf bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), MaxFileBytes+1)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Bytes()
		if isSeparator(line) {
			cur.data = append([]byte(nil), buf.Bytes()...)
			out = append(out, cur)
			buf.Reset()
			cur = chunk{line: n + 1}
			continue
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	cur.data = buf.Bytes()
	return append(out, cur)
}

func isSeparator(line []byte) bool {
	if !bytes.HasPrefix(line, []byte("---")) {
		return false
	}
	rest := line[3:]
	return len(rest) == 0 || rest[0] == ' ' || rest[0] == '\t' || rest[0] == '#'
}

// envelope is the Kubernetes object around a spec.
type envelope struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   json.RawMessage `json:"metadata"` // decoded leniently: ObjectMeta has many fields
	Spec       json.RawMessage `json:"spec"`
	Status     json.RawMessage `json:"status"`
}

type metadata struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace"`
	Labels          map[string]string `json:"labels"`
	Annotations     map[string]string `json:"annotations"`
	ResourceVersion string            `json:"resourceVersion"`
	Generation      int64             `json:"generation"`
	// CreationTimestamp is RFC 3339, as the apiserver writes it (kubectl
	// get -o yaml); null or absent in most files.
	CreationTimestamp string `json:"creationTimestamp"`
}

func decodeOne(file string, c chunk, defaultNamespace string, o DecodeOptions) (Document, bool) {
	doc := Document{File: file, Line: c.line}
	fail := func(object, format string, args ...any) (Document, bool) {
		doc.Err = &DecodeError{File: file, Line: doc.Line, Object: object, Reason: fmt.Sprintf(format, args...)}
		return doc, true
	}
	var root yaml.Node
	if err := yaml.Unmarshal(c.data, &root); err != nil {
		msg := shiftYAMLLines(err.Error(), c.line-1)
		if n, ok := firstLine(msg); ok {
			doc.Line = n // where the parser stopped, not where the document starts
		}
		return fail("", "invalid YAML: %s", msg)
	}
	if len(root.Content) == 0 {
		return doc, false // empty document: only comments or blank lines
	}
	body := root.Content[0]
	doc.Line = c.line - 1 + body.Line
	doc.root = &root
	if body.Kind != yaml.MappingNode {
		return fail("", "a document must be a mapping (an object with apiVersion and kind)")
	}
	var generic any
	if err := body.Decode(&generic); err != nil {
		return fail("", "invalid YAML: %s", shiftYAMLLines(err.Error(), c.line-1))
	}
	generic, err := jsonable(generic)
	if err != nil {
		return fail("", "cannot convert to JSON: %v", err)
	}
	foreign := false
	m, _ := generic.(map[string]any)
	apiVersion, _ := m["apiVersion"].(string)
	kindName, _ := m["kind"].(string)
	if apiVersion != "" && kindName != "" {
		if k, kerr := ByAPIVersion(apiVersion, kindName); kerr == nil {
			normalizeDurations(m["spec"], k.NewSpec().ProtoReflect().Descriptor())
		} else if o.KeepForeign && !strings.HasSuffix(strings.SplitN(apiVersion, "/", 2)[0], ".istio.io") {
			foreign = true // a kind of an Istio group Flotilla does not serve stays an error
		}
	}
	raw, err := json.Marshal(generic)
	if err != nil {
		return fail("", "cannot convert to JSON (are all map keys strings?): %v", err)
	}
	if foreign {
		doc.Foreign = &Foreign{APIVersion: apiVersion, Kind: kindName, JSON: raw}
		return doc, true
	}
	var env envelope
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return fail("", "%s", jsonReason(err))
	}
	if env.APIVersion == "" || env.Kind == "" {
		return fail("", "apiVersion and kind are required")
	}
	var meta metadata
	if len(env.Metadata) > 0 {
		if err := json.Unmarshal(env.Metadata, &meta); err != nil {
			return fail("", "metadata.%s", jsonReason(err))
		}
	}
	ns := meta.Namespace
	if ns == "" {
		ns = defaultNamespace
	}
	kind, err := ByAPIVersion(env.APIVersion, env.Kind)
	if err != nil {
		return fail("", "%v", err)
	}
	name := kind.Kind + " " + ns + "/" + meta.Name
	if meta.Name == "" {
		return fail(kind.Kind, "metadata.name is required")
	}
	var created time.Time
	if meta.CreationTimestamp != "" {
		if created, err = time.Parse(time.RFC3339, meta.CreationTimestamp); err != nil {
			return fail(name, "metadata.creationTimestamp: %q is not an RFC 3339 time", meta.CreationTimestamp)
		}
	}
	spec := kind.NewSpec()
	if len(env.Spec) > 0 && string(env.Spec) != "null" {
		if err := (protojson.UnmarshalOptions{}).Unmarshal(env.Spec, spec); err != nil {
			reason := protoReason(err)
			if field, ok := unknownField(reason); ok {
				if specNode, _ := child(body, "spec"); specNode != nil {
					if line := findKey(specNode, field); line > 0 {
						doc.Line = c.line - 1 + line
					}
				}
			}
			return fail(name, "spec: %s", reason)
		}
	}
	doc.Object = &Object{
		Kind: kind,
		Meta: Meta{
			Name:            meta.Name,
			Namespace:       ns,
			Labels:          meta.Labels,
			Annotations:     meta.Annotations,
			ResourceVersion: meta.ResourceVersion,
			Generation:      meta.Generation,
			CreationTime:    created,
		},
		Spec:   spec,
		Status: servedStatus(kind, env.Status),
	}
	return doc, true
}

// servedStatus reads the part of a status Flotilla serves (Object.Status):
// a ServiceEntry's status.addresses, a WorkloadEntry's Healthy condition,
// as `kubectl get -o yaml` shows them. The rest of a status, and a status
// that does not read as one, are ignored: status is not configuration.
func servedStatus(kind Kind, raw json.RawMessage) proto.Message {
	if len(raw) == 0 {
		return nil
	}
	switch kind.Kind {
	case WorkloadEntry:
		var st struct {
			Conditions []struct {
				Type   string `json:"type"`
				Status string `json:"status"`
			} `json:"conditions"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return nil
		}
		for _, c := range st.Conditions {
			if c.Type == ConditionHealthy {
				return HealthStatus(c.Status)
			}
		}
	case ServiceEntry:
		var st struct {
			Addresses []struct {
				Value string `json:"value"`
				Host  string `json:"host"`
			} `json:"addresses"`
		}
		if err := json.Unmarshal(raw, &st); err != nil || len(st.Addresses) == 0 {
			return nil
		}
		out := &networking.ServiceEntryStatus{}
		for _, a := range st.Addresses {
			out.Addresses = append(out.Addresses, &networking.ServiceEntryAddress{Value: a.Value, Host: a.Host})
		}
		return out
	}
	return nil
}

// jsonReason turns encoding/json errors into field-level messages.
func jsonReason(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("%s: cannot be %s, want %s", te.Field, te.Value, te.Type)
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown field " + f
	}
	return strings.TrimPrefix(msg, "json: ")
}

// protoReason strips protojson's prefix, its position in the intermediate
// JSON (meaningless to someone reading YAML) and its unstable spacing.
func protoReason(err error) string {
	msg := strings.Join(strings.Fields(strings.TrimPrefix(err.Error(), "proto:")), " ")
	if strings.HasPrefix(msg, "(line ") {
		if i := strings.Index(msg, "): "); i > 0 {
			msg = msg[i+3:]
		}
	}
	return msg
}

func unknownField(reason string) (string, bool) {
	rest, ok := strings.CutPrefix(reason, "unknown field ")
	if !ok {
		return "", false
	}
	f, err := strconv.Unquote(rest)
	return f, err == nil
}

// findKey returns the line of the first mapping key named key under n.
func findKey(n *yaml.Node, key string) int {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				return n.Content[i].Line
			}
		}
	}
	for _, c := range n.Content {
		if line := findKey(c, key); line > 0 {
			return line
		}
	}
	return 0
}

// shiftYAMLLines rewrites "line N" in a yaml.v3 message, which counts from
// the start of the document, to count from the start of the file.
// firstLine is the first "line N" of a YAML error message.
func firstLine(msg string) (int, bool) {
	i := strings.Index(msg, "line ")
	if i < 0 {
		return 0, false
	}
	rest := msg[i+len("line "):]
	k := 0
	for k < len(rest) && rest[k] >= '0' && rest[k] <= '9' {
		k++
	}
	n, err := strconv.Atoi(rest[:k])
	return n, err == nil && n > 0
}

func shiftYAMLLines(msg string, offset int) string {
	var out strings.Builder
	for {
		i := strings.Index(msg, "line ")
		if i < 0 {
			out.WriteString(msg)
			return out.String()
		}
		j := i + len("line ")
		k := j
		for k < len(msg) && msg[k] >= '0' && msg[k] <= '9' {
			k++
		}
		out.WriteString(msg[:j])
		if n, err := strconv.Atoi(msg[j:k]); err == nil {
			out.WriteString(strconv.Itoa(n + offset))
		} else {
			out.WriteString(msg[j:k])
		}
		msg = msg[k:]
	}
}

// LineOf returns the line of the field at path (as validation reports it,
// e.g. "spec.http[0].route[1].weight") within the document, or the line of
// the deepest part of the path that exists, or the document's line.
func (d *Document) LineOf(path string) int {
	if d.root == nil || len(d.root.Content) == 0 {
		return d.Line
	}
	offset := d.Line - d.root.Content[0].Line
	n := d.root.Content[0]
	line := n.Line
	for _, seg := range pathSegments(path) {
		next, at := child(n, seg)
		if next == nil {
			break
		}
		n, line = next, at
	}
	return line + offset
}

// child returns the node under seg and the line that names it: a mapping
// key's own line (not its block value's), or a sequence item's line.
func child(n *yaml.Node, seg string) (*yaml.Node, int) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == seg {
				return n.Content[i+1], n.Content[i].Line
			}
		}
	case yaml.SequenceNode:
		if i, err := strconv.Atoi(seg); err == nil && i >= 0 && i < len(n.Content) {
			return n.Content[i], n.Content[i].Line
		}
	default:
	}
	return nil, 0
}

// pathSegments splits "spec.http[0].headers[x-id]" into
// ["spec","http","0","headers","x-id"]. Inside brackets a dot is part of the
// key, as in "matchLabels[app.kubernetes.io/name]".
func pathSegments(path string) []string {
	var segs []string
	var cur strings.Builder
	flush := func() {
		if cur.Len() > 0 {
			segs = append(segs, cur.String())
			cur.Reset()
		}
	}
	inBracket := false
	for _, r := range path {
		switch {
		case !inBracket && r == '.':
			flush()
		case !inBracket && r == '[':
			flush()
			inBracket = true
		case inBracket && r == ']':
			flush()
			inBracket = false
		default:
			cur.WriteRune(r)
		}
	}
	flush()
	return segs
}
