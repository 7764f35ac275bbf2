package translate

import "testing"

func TestParseGRPCInboundName(t *testing.T) {
	for _, tc := range []struct {
		name string
		host string
		port uint32
		ok   bool
	}{
		{GRPCInboundPrefix + "127.0.0.1:50061", "127.0.0.1", 50061, true},
		{GRPCInboundPrefix + "[::]:8080", "::", 8080, true},
		{GRPCInboundPrefix + "0.0.0.0:1", "0.0.0.0", 1, true},
		{GRPCInboundPrefix + "127.0.0.1:0", "", 0, false},
		{GRPCInboundPrefix + "127.0.0.1:65536", "", 0, false},
		{GRPCInboundPrefix + "127.0.0.1:http", "", 0, false},
		{GRPCInboundPrefix + "no-port", "", 0, false},
		{"127.0.0.1:50061", "", 0, false},
		{"", "", 0, false},
	} {
		host, port, ok := ParseGRPCInboundName(tc.name)
		if host != tc.host || port != tc.port || ok != tc.ok {
			t.Errorf("ParseGRPCInboundName(%q) = %q, %d, %v; want %q, %d, %v", tc.name, host, port, ok, tc.host, tc.port, tc.ok)
		}
	}
}
