// Package config loads a service's configuration struct from, in order, its
// defaults, a YAML file, command-line flags and FLOTILLA_* environment
// variables, each later source overriding the earlier ones, and then calls the
// struct's Validate method.
//
// Every leaf field of the struct gets all three spellings from its yaml tag
// path, so no service hand-writes flags:
//
//	yaml  log.level       flag  --log-level       env  FLOTILLA_LOG_LEVEL
//	yaml  otlpEndpoint    flag  --otlp-endpoint   env  FLOTILLA_OTLP_ENDPOINT
//
// Structs tagged `yaml:",inline"` add no path segment. A `usage:"…"` tag is
// the flag's help text. The YAML file is decoded strictly: an unknown field is
// an error that names the field and its line.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/flotilla-mesh/flotilla/internal/platform/boundedfile"
)

// MaxFileBytes bounds the size of a configuration file.
const MaxFileBytes = 1 << 20

// Validator is implemented by configuration structs that check themselves.
type Validator interface {
	Validate() error
}

// Binding ties a configuration type to a flag set and an environment prefix.
type Binding[T any] struct {
	defaults  func() T
	shadow    *T // flags write here; copied onto the result only when set
	fields    []field
	flags     *pflag.FlagSet
	envPrefix string
}

type field struct {
	index    []int
	yamlPath string
	flag     string
	env      string
}

// Bind registers one flag per leaf field of T on fs. defaults must return a
// fresh value each call (maps and slices are not shared between loads).
// envPrefix is prepended to environment variable names, e.g. "FLOTILLA_".
func Bind[T any](fs *pflag.FlagSet, defaults func() T, envPrefix string) (*Binding[T], error) {
	d := defaults()
	t := reflect.TypeOf(d)
	if t == nil || t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("config type %T: must be a struct", d)
	}
	b := &Binding[T]{defaults: defaults, flags: fs, envPrefix: envPrefix}
	b.shadow = &d
	if err := b.walk(reflect.ValueOf(b.shadow).Elem(), nil, nil); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *Binding[T]) walk(v reflect.Value, index []int, path []string) error {
	t := v.Type()
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, inline, skip := yamlName(sf)
		if skip {
			continue
		}
		idx := append(append([]int(nil), index...), i)
		fv := v.Field(i)
		if fv.Kind() == reflect.Struct && fv.Type() != reflect.TypeFor[time.Duration]() {
			p := path
			if !inline {
				p = append(append([]string(nil), path...), name)
			}
			if err := b.walk(fv, idx, p); err != nil {
				return err
			}
			continue
		}
		if inline {
			return fmt.Errorf("field %s: inline is only allowed on structs", sf.Name)
		}
		segs := append(append([]string(nil), path...), name)
		f := field{
			index:    idx,
			yamlPath: strings.Join(segs, "."),
			flag:     kebab(segs),
			env:      b.envPrefix + strings.ToUpper(strings.ReplaceAll(kebab(segs), "-", "_")),
		}
		val, err := newValue(fv)
		if err != nil {
			return fmt.Errorf("field %s: %w", f.yamlPath, err)
		}
		usage := sf.Tag.Get("usage")
		if usage == "" {
			usage = f.yamlPath
		}
		usage += " (env " + f.env + ")"
		flag := b.flags.VarPF(val, f.flag, "", usage)
		if fv.Kind() == reflect.Bool {
			flag.NoOptDefVal = "true"
		}
		b.fields = append(b.fields, f)
	}
	return nil
}

// Fields lists the yaml path, flag and environment variable of every field,
// for documentation and tests.
func (b *Binding[T]) Fields() [][3]string {
	out := make([][3]string, 0, len(b.fields))
	for _, f := range b.fields {
		out = append(out, [3]string{f.yamlPath, "--" + f.flag, f.env})
	}
	return out
}

// Load builds the configuration: defaults, then the YAML file at path (if
// path is not empty), then the flags set on the command line, then the
// environment as seen through lookupEnv, then Validate.
func (b *Binding[T]) Load(path string, lookupEnv func(string) (string, bool)) (T, error) {
	cfg := b.defaults()
	if path != "" {
		if err := decodeFile(path, &cfg); err != nil {
			return cfg, err
		}
	}
	dst := reflect.ValueOf(&cfg).Elem()
	src := reflect.ValueOf(b.shadow).Elem()
	for _, f := range b.fields {
		if b.flags.Changed(f.flag) {
			dst.FieldByIndex(f.index).Set(src.FieldByIndex(f.index))
		}
	}
	for _, f := range b.fields {
		s, ok := lookupEnv(f.env)
		if !ok {
			continue
		}
		val, err := newValue(dst.FieldByIndex(f.index))
		if err != nil {
			return cfg, fmt.Errorf("environment %s: %w", f.env, err)
		}
		if err := val.Set(s); err != nil {
			return cfg, fmt.Errorf("environment %s=%q: %w", f.env, s, err)
		}
	}
	if v, ok := any(&cfg).(Validator); ok {
		if err := v.Validate(); err != nil {
			return cfg, fmt.Errorf("invalid configuration: %w", err)
		}
	}
	return cfg, nil
}

func decodeFile(path string, cfg any) error {
	data, err := boundedfile.Read(path, MaxFileBytes)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file changes nothing
		}
		return fmt.Errorf("config file %s: %w", path, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return fmt.Errorf("config file %s: holds more than one YAML document", path)
	}
	return nil
}

func yamlName(sf reflect.StructField) (name string, inline, skip bool) {
	tag := sf.Tag.Get("yaml")
	if tag == "-" {
		return "", false, true
	}
	parts := strings.Split(tag, ",")
	name = parts[0]
	for _, p := range parts[1:] {
		if p == "inline" {
			inline = true
		}
	}
	if name == "" {
		name = strings.ToLower(sf.Name) // yaml.v3's own default
	}
	return name, inline, false
}

// kebab turns yaml path segments into a flag name: ["admin","listenAddress"]
// becomes "admin-listen-address" and "otlpEndpoint" becomes "otlp-endpoint".
func kebab(segs []string) string {
	var out []string
	for _, s := range segs {
		var b strings.Builder
		r := []rune(s)
		for i, c := range r {
			if unicode.IsUpper(c) && i > 0 {
				prevLower := unicode.IsLower(r[i-1]) || unicode.IsDigit(r[i-1])
				// A plural acronym ends the word ("servingIPs" → serving-ips).
				plural := i+2 == len(r) && r[i+1] == 's'
				nextLower := i+1 < len(r) && unicode.IsLower(r[i+1]) && !plural
				if prevLower || (unicode.IsUpper(r[i-1]) && nextLower) {
					b.WriteByte('-')
				}
			}
			b.WriteRune(unicode.ToLower(c))
		}
		out = append(out, b.String())
	}
	return strings.Join(out, "-")
}

// value adapts one struct field to pflag.Value, so flags and environment
// variables parse the same way.
type value struct{ v reflect.Value }

func newValue(v reflect.Value) (*value, error) {
	switch v.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float64:
		return &value{v}, nil
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.String {
			return &value{v}, nil
		}
	case reflect.Map:
		if v.Type().Key().Kind() == reflect.String && v.Type().Elem().Kind() == reflect.String {
			return &value{v}, nil
		}
	default:
	}
	return nil, fmt.Errorf("unsupported type %s", v.Type())
}

func (x *value) Type() string {
	if x.v.Type() == reflect.TypeFor[time.Duration]() {
		return "duration"
	}
	switch x.v.Kind() {
	case reflect.Slice:
		return "strings"
	case reflect.Map:
		return "key=value,..."
	default:
		return x.v.Kind().String()
	}
}

func (x *value) String() string {
	if !x.v.IsValid() {
		return ""
	}
	if x.v.Type() == reflect.TypeFor[time.Duration]() {
		return time.Duration(x.v.Int()).String()
	}
	switch x.v.Kind() {
	case reflect.Slice:
		return strings.Join(x.v.Interface().([]string), ",")
	case reflect.Map:
		m := x.v.Interface().(map[string]string)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, k+"="+m[k])
		}
		return strings.Join(parts, ",")
	default:
		return fmt.Sprint(x.v.Interface())
	}
}

func (x *value) Set(s string) error {
	v := x.v
	if v.Type() == reflect.TypeFor[time.Duration]() {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("not a duration: %w", err)
		}
		v.SetInt(int64(d))
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("not a boolean: %q", s)
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("not an integer of %d bits: %q", v.Type().Bits(), s)
		}
		v.SetInt(n)
	case reflect.Uint, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 10, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("not an unsigned integer of %d bits: %q", v.Type().Bits(), s)
		}
		v.SetUint(n)
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("not a number: %q", s)
		}
		v.SetFloat(f)
	case reflect.Slice:
		var items []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				items = append(items, p)
			}
		}
		v.Set(reflect.ValueOf(items))
	case reflect.Map:
		m := map[string]string{}
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			k, val, ok := strings.Cut(p, "=")
			if !ok || k == "" {
				return fmt.Errorf("want key=value pairs separated by commas, got %q", p)
			}
			m[k] = val
		}
		v.Set(reflect.ValueOf(m))
	default:
		return fmt.Errorf("unsupported type %s", v.Type())
	}
	return nil
}
