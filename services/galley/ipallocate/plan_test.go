package ipallocate

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"

	"github.com/flotilla-mesh/flotilla/internal/istio"
)

// world is the ServiceEntries the tests plan over, and applies what a plan
// writes as the apiserver would.
type world map[string]*istio.Object

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// add creates a ServiceEntry "ns/name", created age minutes after the
// others of lower age.
func (w world) add(name string, age int, spec *networking.ServiceEntry, status ...string) *istio.Object {
	kind, _ := istio.ByName(istio.ServiceEntry)
	ns, n, _ := strings.Cut(name, "/")
	o := &istio.Object{Kind: kind, Meta: istio.Meta{Name: n, Namespace: ns, CreationTime: epoch.Add(time.Duration(age) * time.Minute), ResourceVersion: "1"}, Spec: spec}
	if len(status) > 0 {
		st := &networking.ServiceEntryStatus{}
		for _, s := range status {
			host, value, _ := strings.Cut(s, "=")
			st.Addresses = append(st.Addresses, &networking.ServiceEntryAddress{Host: host, Value: value})
		}
		o.Status = st
	}
	w[name] = o
	return o
}

func (w world) objects() []*istio.Object {
	var out []*istio.Object
	for _, o := range w {
		out = append(out, o)
	}
	return out
}

// apply writes the changes' addresses into the ServiceEntries' status.
func (w world) apply(changes []Change) {
	for _, ch := range changes {
		o := w[ch.ID.Name].DeepCopy()
		if len(ch.Addresses) == 0 {
			o.Status = nil
		} else {
			o.Status = &networking.ServiceEntryStatus{Addresses: ch.Addresses}
		}
		w[ch.ID.Name] = o
	}
}

// addresses is a ServiceEntry's status as "host=address" strings.
func (w world) addresses(name string) []string {
	var out []string
	st, _ := w[name].Status.(*networking.ServiceEntryStatus)
	for _, a := range st.GetAddresses() {
		out = append(out, a.GetHost()+"="+a.GetValue())
	}
	return out
}

func dns(hosts ...string) *networking.ServiceEntry {
	return &networking.ServiceEntry{Hosts: hosts, Resolution: networking.ServiceEntry_DNS, Ports: []*networking.ServicePort{{Number: 5432, Name: "tcp", Protocol: "TCP"}}}
}

func newAllocator(t *testing.T, v4, v6 string) *Allocator {
	t.Helper()
	a, err := New(netip.MustParsePrefix(v4), netip.MustParsePrefix(v6))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// settle plans and applies until nothing changes (at most a few rounds).
func settle(t *testing.T, a *Allocator, w world) []string {
	t.Helper()
	var problems []string
	for range 5 {
		var changes []Change
		changes, problems = a.Plan(w.objects())
		if len(changes) == 0 {
			return problems
		}
		w.apply(changes)
	}
	t.Fatal("the plan does not settle: it keeps changing what it wrote")
	return nil
}

func want(t *testing.T, w world, name string, expect ...string) {
	t.Helper()
	if got := w.addresses(name); !slices.Equal(got, expect) {
		t.Errorf("%s: status.addresses %q, want %q", name, got, expect)
	}
}

func TestEachHostGetsTheNextIPv4AndIPv6AddressInOrderOfCreation(t *testing.T) {
	w := world{}
	w.add("b/db", 2, dns("db.example.com", "*.example.com", "db.example.com"))
	w.add("a/mq", 1, dns("mq.example.com"))
	dyn := dns("*.dynamic.example.com")
	dyn.Resolution = networking.ServiceEntry_DYNAMIC_DNS
	w.add("c/dynamic", 3, dyn)
	settle(t, newAllocator(t, DefaultIPv4Prefix, DefaultIPv6Prefix), w)
	want(t, w, "a/mq", "mq.example.com=240.240.0.1", "mq.example.com=2001:2::1")
	// A wildcard host gets none (Istio's keepHost), a repeated host one.
	want(t, w, "b/db", "db.example.com=240.240.0.2", "db.example.com=2001:2::2")
	// With DYNAMIC_DNS a wildcard host gets addresses.
	want(t, w, "c/dynamic", "*.dynamic.example.com=240.240.0.3", "*.dynamic.example.com=2001:2::3")
}

func TestHostsKeepTheirAddressesAndNewHostsSkipThoseInUse(t *testing.T) {
	w := world{}
	// Written by an earlier leader: .1 and .3 are in use.
	w.add("ns/old", 1, dns("old.example.com", "gone.example.com"), "old.example.com=240.240.0.3", "old.example.com=2001:2::3", "gone.example.com=240.240.0.1", "gone.example.com=2001:2::1")
	w.add("ns/new", 2, dns("new.example.com"))
	a := newAllocator(t, DefaultIPv4Prefix, DefaultIPv6Prefix)
	settle(t, a, w)
	want(t, w, "ns/new", "new.example.com=240.240.0.2", "new.example.com=2001:2::2")

	// The ServiceEntry's hosts change: the one kept keeps its address,
	// the one removed loses its, the one added takes the next free after
	// the last allocation.
	w["ns/old"].Spec = dns("old.example.com", "added.example.com")
	settle(t, a, w)
	want(t, w, "ns/old", "old.example.com=240.240.0.3", "old.example.com=2001:2::3", "added.example.com=240.240.0.4", "added.example.com=2001:2::4")
	want(t, w, "ns/new", "new.example.com=240.240.0.2", "new.example.com=2001:2::2")
}

func TestTwoAllocatorsGivenTheSameServiceEntriesPlanTheSameAddresses(t *testing.T) {
	build := func() world {
		w := world{}
		for i := range 50 {
			w.add(fmt.Sprintf("ns%d/se%d", i%7, i), 50-i, dns(fmt.Sprintf("h%d.example.com", i), fmt.Sprintf("g%d.example.com", i)))
		}
		return w
	}
	one, two := build(), build()
	settle(t, newAllocator(t, DefaultIPv4Prefix, DefaultIPv6Prefix), one)
	settle(t, newAllocator(t, DefaultIPv4Prefix, DefaultIPv6Prefix), two)
	seen := map[string]string{}
	for name := range one {
		if !slices.Equal(one.addresses(name), two.addresses(name)) {
			t.Errorf("%s: %q and %q", name, one.addresses(name), two.addresses(name))
		}
		for _, a := range one.addresses(name) {
			_, ip, _ := strings.Cut(a, "=")
			if other, dup := seen[ip]; dup {
				t.Errorf("%s given to %s and %s", ip, other, name)
			}
			seen[ip] = name
		}
	}
	if len(seen) != 200 {
		t.Errorf("%d addresses for 100 hosts, want 200", len(seen))
	}
}

func TestAConflictIsResolvedOnTheYoungerServiceEntryOrAgainstTheUsersAddress(t *testing.T) {
	w := world{}
	w.add("ns/elder", 1, dns("elder.example.com"), "elder.example.com=240.240.0.1", "elder.example.com=2001:2::1")
	// The same addresses in a younger one's status (a bug, or a copy made
	// with kubectl): it is given new ones for all of its hosts.
	w.add("ns/younger", 2, dns("younger.example.com", "second.example.com"), "younger.example.com=240.240.0.1", "younger.example.com=2001:2::1", "second.example.com=240.240.0.7", "second.example.com=2001:2::7")
	a := newAllocator(t, DefaultIPv4Prefix, DefaultIPv6Prefix)
	settle(t, a, w)
	want(t, w, "ns/elder", "elder.example.com=240.240.0.1", "elder.example.com=2001:2::1")
	want(t, w, "ns/younger", "younger.example.com=240.240.0.2", "younger.example.com=2001:2::2", "second.example.com=240.240.0.3", "second.example.com=2001:2::3")

	// A user's address in a spec wins over any allocation, older or not;
	// the spec itself is never changed.
	user := dns("user.example.com")
	user.Addresses = []string{"240.240.0.1"}
	w.add("ns/user", 3, user)
	settle(t, a, w)
	want(t, w, "ns/elder", "elder.example.com=240.240.0.4", "elder.example.com=2001:2::4")
	want(t, w, "ns/user")
	if got := w["ns/user"].Spec.(*networking.ServiceEntry).GetAddresses(); !slices.Equal(got, []string{"240.240.0.1"}) {
		t.Errorf("spec.addresses %q changed", got)
	}
}

func TestAddressesAreClearedWhenTheServiceEntryNoLongerTakesThem(t *testing.T) {
	for name, change := range map[string]func(o *istio.Object){
		"opt-out label": func(o *istio.Object) {
			o.Meta.Labels = map[string]string{"networking.istio.io/enable-autoallocate-ip": "FALSE"}
		},
		"resolution NONE": func(o *istio.Object) { o.Spec.(*networking.ServiceEntry).Resolution = networking.ServiceEntry_NONE },
		"addresses of its own": func(o *istio.Object) {
			o.Spec.(*networking.ServiceEntry).Addresses = []string{"10.9.9.9"}
		},
		"only wildcard hosts": func(o *istio.Object) { o.Spec.(*networking.ServiceEntry).Hosts = []string{"*.example.com"} },
	} {
		t.Run(name, func(t *testing.T) {
			w := world{}
			w.add("ns/se", 1, dns("se.example.com"))
			a := newAllocator(t, DefaultIPv4Prefix, DefaultIPv6Prefix)
			settle(t, a, w)
			want(t, w, "ns/se", "se.example.com=240.240.0.1", "se.example.com=2001:2::1")
			change(w["ns/se"])
			settle(t, a, w)
			want(t, w, "ns/se")
		})
	}
}

func TestAClearedAddressIsReusedAndADeletedOnesOnlyAfterTheRangeWraps(t *testing.T) {
	w := world{}
	a := newAllocator(t, "10.0.0.0/29", "fd00::/125") // 7 addresses each after the network's
	for i := range 3 {
		w.add(fmt.Sprintf("ns/se%d", i), i, dns(fmt.Sprintf("se%d.example.com", i)))
	}
	settle(t, a, w)
	want(t, w, "ns/se0", "se0.example.com=10.0.0.1", "se0.example.com=fd00::1")

	// Deleted: its address is not handed out again at once.
	delete(w, "ns/se0")
	w.add("ns/next", 4, dns("next.example.com"))
	settle(t, a, w)
	want(t, w, "ns/next", "next.example.com=10.0.0.4", "next.example.com=fd00::4")

	// Cleared (opted out): the address goes back to the allocator at once.
	w["ns/se1"].Meta.Labels = map[string]string{"networking.istio.io/enable-autoallocate-ip": "false"}
	settle(t, a, w)
	w.add("ns/after", 5, dns("after.example.com"))
	settle(t, a, w)
	want(t, w, "ns/after", "after.example.com=10.0.0.2", "after.example.com=fd00::2")

	// .5 to .7 are taken in turn; past the end the allocator wraps and
	// takes what is free (.1).
	for i := range 4 {
		w.add(fmt.Sprintf("ns/more%d", i), 6+i, dns(fmt.Sprintf("more%d.example.com", i)))
	}
	settle(t, a, w)
	want(t, w, "ns/more2", "more2.example.com=10.0.0.7", "more2.example.com=fd00::7")
	want(t, w, "ns/more3", "more3.example.com=10.0.0.1", "more3.example.com=fd00::1")

	// A full range is reported, and the host waits.
	w.add("ns/full", 11, dns("full.example.com"))
	problems := settle(t, a, w)
	want(t, w, "ns/full")
	if len(problems) != 2 || !strings.Contains(problems[0], "10.0.0.0/29 is exhausted") || !strings.Contains(problems[1], "fd00::/125 is exhausted") {
		t.Errorf("problems %q, want both ranges exhausted", problems)
	}
}

func TestRangesMustBeOfTheirFamily(t *testing.T) {
	for _, c := range [][2]string{{"2001:2::/48", DefaultIPv6Prefix}, {DefaultIPv4Prefix, "10.0.0.0/8"}, {DefaultIPv4Prefix, "::ffff:10.0.0.0/104"}} {
		if _, err := New(netip.MustParsePrefix(c[0]), netip.MustParsePrefix(c[1])); err == nil {
			t.Errorf("New(%s, %s) accepted", c[0], c[1])
		}
	}
}

func TestAddressesOfAChangeNotWrittenAreHandedOutAgain(t *testing.T) {
	w := world{}
	w.add("ns/a", 1, dns("a.example.com"))
	a := newAllocator(t, DefaultIPv4Prefix, DefaultIPv6Prefix)
	changes, _ := a.Plan(w.objects())
	if len(changes) != 1 || len(changes[0].Allocated) != 2 {
		t.Fatalf("changes %v, want one allocating two addresses", changes)
	}
	// The write was refused (the informer lagged): the same plan again
	// gives the same addresses, not the next ones.
	a.Release(changes[0].Allocated)
	settle(t, a, w)
	want(t, w, "ns/a", "a.example.com=240.240.0.1", "a.example.com=2001:2::1")
}

// BenchmarkPlan is what the leader does on each change of a cluster with
// 10,000 ServiceEntries of two hosts, all allocated: plan them all, find
// the one new host, allocate its addresses.
func BenchmarkPlan(b *testing.B) {
	w := world{}
	for i := range 10000 {
		w.add(fmt.Sprintf("ns%d/se%d", i%50, i), i, dns(fmt.Sprintf("a%d.example.com", i), fmt.Sprintf("b%d.example.com", i)))
	}
	a, err := New(netip.MustParsePrefix(DefaultIPv4Prefix), netip.MustParsePrefix(DefaultIPv6Prefix))
	if err != nil {
		b.Fatal(err)
	}
	changes, _ := a.Plan(w.objects())
	w.apply(changes)
	w.add("ns0/new", 20000, dns("new.example.com"))
	objects := w.objects()
	b.ReportAllocs()
	for b.Loop() {
		changes, _ := a.Plan(objects)
		if len(changes) != 1 {
			b.Fatalf("%d changes, want the new ServiceEntry's", len(changes))
		}
		a.Release(changes[0].Allocated)
	}
}

// A status written by hand (anyone who may write status can): values that
// are not addresses, hosts the spec does not name, an address of the
// range given twice, IPv4 inside IPv6. The plan gives the spec's hosts
// clean addresses and never fails.
func TestAStatusWrittenByHandIsReplacedByAddressesForTheSpecsHosts(t *testing.T) {
	w := world{}
	w.add("ns/se", 1, dns("db.example.com"),
		"db.example.com=not-an-ip", "other.example.com=240.240.0.9", "db.example.com=::ffff:240.240.0.1", "db.example.com=240.240.0.1")
	a := newAllocator(t, DefaultIPv4Prefix, DefaultIPv6Prefix)
	problems := settle(t, a, w)
	if len(problems) > 0 {
		t.Fatalf("problems: %q", problems)
	}
	// db.example.com had addresses (the mapped and the plain form of one,
	// kept as they are: Istio keeps what a host has); other.example.com is
	// not in the spec and loses its.
	got := w.addresses("ns/se")
	if slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "other.example.com=") }) {
		t.Errorf("a host the spec does not name kept its address: %q", got)
	}
	for _, s := range got {
		if _, v, _ := strings.Cut(s, "="); v == "not-an-ip" {
			t.Errorf("a value that is no address was kept: %q", got)
		}
	}
}

func FuzzPlan(f *testing.F) {
	f.Add("db.example.com", "240.240.0.1", "db.example.com", "240.240.0.1", false)
	f.Add("*.x", "2001:2::1", "y", "::ffff:1.2.3.4", true)
	f.Fuzz(func(t *testing.T, host1, value1, host2, value2 string, optOut bool) {
		w := world{}
		one := w.add("ns/one", 1, dns(host1, host2), host1+"="+value1, host2+"="+value2)
		if optOut {
			one.Meta.Labels = map[string]string{"networking.istio.io/enable-autoallocate-ip": "false"}
		}
		w.add("ns/two", 2, dns(host2), host2+"="+value1)
		a, err := New(netip.MustParsePrefix("10.0.0.0/28"), netip.MustParsePrefix("fd00::/124"))
		if err != nil {
			t.Fatal(err)
		}
		settle(t, a, w)
		seen := map[string]string{}
		for _, name := range []string{"ns/one", "ns/two"} {
			for _, s := range w.addresses(name) {
				_, v, _ := strings.Cut(s, "=")
				ip, err := netip.ParseAddr(v)
				if err != nil {
					continue
				}
				if other, dup := seen[ip.Unmap().String()]; dup && other != name {
					t.Fatalf("%s given to %s and %s: %q", ip, other, name, w)
				}
				seen[ip.Unmap().String()] = name
			}
		}
	})
}
