// Package logging builds the log/slog logger every Flotilla service uses:
// JSON (the default, for clusters) or text (for terminals), at a configured
// level, with the service name on every record.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Options selects the log format and level.
type Options struct {
	// Format is "json" or "text".
	Format string `yaml:"format" usage:"log format: json or text"`
	// Level is "debug", "info", "warn" or "error".
	Level string `yaml:"level" usage:"minimum log level: debug, info, warn or error"`
}

// Defaults returns JSON logging at info level.
func Defaults() Options {
	return Options{Format: "json", Level: "info"}
}

// Validate reports an unknown format or level.
func (o Options) Validate() error {
	if _, err := ParseLevel(o.Level); err != nil {
		return err
	}
	switch o.Format {
	case "json", "text":
		return nil
	default:
		return fmt.Errorf("log format %q: must be json or text", o.Format)
	}
}

// ParseLevel turns a level name into a slog.Level.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	default:
		return 0, fmt.Errorf("log level %q: must be debug, info, warn or error", s)
	}
}

// New returns a logger writing to w. service is added to every record.
func New(w io.Writer, service string, o Options) (*slog.Logger, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	level, _ := ParseLevel(o.Level) // validated above
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	if o.Format == "text" {
		h = slog.NewTextHandler(w, hopts)
	} else {
		h = slog.NewJSONHandler(w, hopts)
	}
	return slog.New(h).With("service", service), nil
}
