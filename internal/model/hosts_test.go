package model

import "testing"

func TestResolveHost(t *testing.T) {
	tests := []struct{ host, ns, want string }{
		{"reviews", "default", "reviews.default.svc.cluster.local"},
		{"reviews.default", "other", "reviews.default"}, // Istio takes dotted names as written
		{"reviews.default.svc.cluster.local", "other", "reviews.default.svc.cluster.local"},
		{"*.example.com", "default", "*.example.com"},
		{"*", "default", "*"},
		{"", "default", ""},
	}
	for _, tt := range tests {
		if got := ResolveHost(tt.host, tt.ns, "cluster.local"); got != tt.want {
			t.Errorf("ResolveHost(%q, %q) = %q, want %q", tt.host, tt.ns, got, tt.want)
		}
	}
}

func TestHostMatches(t *testing.T) {
	tests := []struct {
		pattern, host string
		want          bool
	}{
		{"a.example.com", "a.example.com", true},
		{"a.example.com", "b.example.com", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "*.b.example.com", true},
		{"*.b.example.com", "*.example.com", false},
		{"*", "anything", true},
		{"*.com", "a.example.com", true},
		{"*.example.com", "aexample.com", false},
	}
	for _, tt := range tests {
		if got := HostMatches(tt.pattern, tt.host); got != tt.want {
			t.Errorf("HostMatches(%q, %q) = %v, want %v", tt.pattern, tt.host, got, tt.want)
		}
	}
}

func TestExportedTo(t *testing.T) {
	tests := []struct {
		name       string
		list, mesh []string
		own, to    string
		want       bool
	}{
		{"default is everywhere", nil, nil, "a", "b", true},
		{"mesh default applies when unset", nil, []string{"."}, "a", "b", false},
		{"dot is own namespace", []string{"."}, nil, "a", "a", true},
		{"dot hides from others", []string{"."}, nil, "a", "b", false},
		{"tilde hides from all", []string{"~"}, nil, "a", "a", false},
		{"named namespace", []string{"b"}, nil, "a", "b", true},
		{"star", []string{"c", "*"}, nil, "a", "b", true},
	}
	for _, tt := range tests {
		if got := ExportedTo(tt.list, tt.mesh, tt.own, tt.to); got != tt.want {
			t.Errorf("%s: got %v", tt.name, got)
		}
	}
}

func TestLabelsMatch(t *testing.T) {
	if !LabelsMatch(nil, map[string]string{"a": "1"}) {
		t.Error("an empty selector matches")
	}
	if !LabelsMatch(map[string]string{"a": "1"}, map[string]string{"a": "1", "b": "2"}) {
		t.Error("a subset matches")
	}
	if LabelsMatch(map[string]string{"a": "1"}, map[string]string{"a": "2"}) {
		t.Error("a different value does not match")
	}
	if LabelsMatch(map[string]string{"a": ""}, nil) {
		t.Error("a missing label does not match, even with an empty value")
	}
}
