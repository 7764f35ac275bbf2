package proc

import "testing"

func TestDemoSplitsAreReadFromEitherLogAndSummedOverARun(t *testing.T) {
	log := "client-1  | split: v1 80% (40) · v2 20% (10)\n" +
		"noise\n" +
		"time=… msg=x | split: v1 50% (1) · v2 0% (0) · error 50% (1)\n" +
		"client-1  | split: v1 75% (3) · v2 25% (1)\n" +
		"client-1  | split: v1 0% (0) · v2 100% (5)\n" +
		"intruder-1  | split: denied 100% (50)\n"
	if in := IntruderSplits(log); len(in) != 1 || in[0] != "denied 100% (50)" {
		t.Fatalf("IntruderSplits = %q", in)
	}
	lines := DemoSplits(log)
	if len(lines) != 4 || lines[0] != "v1 80% (40) · v2 20% (10)" {
		t.Fatalf("DemoSplits = %q", lines)
	}
	if c := DemoCounts(lines[1]); c["v1"] != 1 || c["v2"] != 0 || c["error"] != 1 {
		t.Fatalf("DemoCounts(%q) = %v", lines[1], c)
	}
	noErrors := func(l string) bool { return DemoCounts(l)["error"] == 0 }
	if v1, v2, ok := DemoRun(lines, 2, noErrors); !ok || v1 != 3 || v2 != 6 {
		t.Fatalf("DemoRun over 2 error-free lines = %d, %d, %v; want the last two lines: 3, 6", v1, v2, ok)
	}
	if _, _, ok := DemoRun(lines, 3, noErrors); ok {
		t.Fatal("DemoRun found 3 error-free lines in a row where there are 2")
	}
}

func TestDemoLinesOverMTLSNameTheServerIdentity(t *testing.T) {
	line := "v1 spiffe://cluster.local/ns/demo/sa/greeter-v1 79% (39) · v2 spiffe://cluster.local/ns/demo/sa/greeter-v2 21% (11) · error 2% (1)"
	if c := DemoCounts(line); c["v1"] != 39 || c["v2"] != 11 || c["error"] != 1 {
		t.Fatalf("DemoCounts = %v", c)
	}
	ids := DemoIdentities(line)
	if ids["v1"] != "spiffe://cluster.local/ns/demo/sa/greeter-v1" || ids["v2"] != "spiffe://cluster.local/ns/demo/sa/greeter-v2" || ids["error"] != "" {
		t.Fatalf("DemoIdentities = %v", ids)
	}
}
