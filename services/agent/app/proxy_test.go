package app

import (
	"log/slog"
	"testing"
)

func TestThePodsLabelsComeFromTheInjectedEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want map[string]string
	}{
		{"", nil},
		{`{"app":"cart","version":"v1"}`, map[string]string{"app": "cart", "version": "v1"}},
		{"null", nil},
		{`{"app": 3}`, nil}, // not strings: refused, logged, no labels
		{"not json", nil},
	} {
		t.Setenv("ISTIO_METAJSON_LABELS", tc.env)
		got := labelsFromEnv(slog.New(slog.DiscardHandler))
		if len(got) != len(tc.want) || got["app"] != tc.want["app"] || got["version"] != tc.want["version"] {
			t.Errorf("%q: %v, want %v", tc.env, got, tc.want)
		}
	}
}

func TestEnvoysLogLevelFollowsTheAgents(t *testing.T) {
	for agent, envoy := range map[string]string{"debug": "debug", "info": "info", "warn": "warning", "error": "error", "": "warning"} {
		if got := envoyLogLevel(agent); got != envoy {
			t.Errorf("%q: %q, want %q", agent, got, envoy)
		}
	}
}
