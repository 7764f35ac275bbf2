// Package testenv is what tests of every module share of their
// environment: a loopback port reserved for the test's lifetime
// (FreeAddr), and a sink for logs that concurrent goroutines or child
// processes write while the test reads them (SyncBuffer).
package testenv

import (
	"bytes"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

// FreeAddr returns a free 127.0.0.1 port for a process to listen on,
// reserved for the test's lifetime. It is taken below the kernel's range of
// ephemeral ports (32768 up, by default), at random: a port the kernel
// handed out (port 0) is also where it puts the next outgoing connections'
// local ends, so, released for a child to bind, it could be one of those by
// then (seen under parallel test packages). Test packages run as parallel
// processes, and two of them once drew the same port between its check and
// a child's bind (CI: "address already in use"), so a port is also reserved
// by an advisory lock on a file named after it, which the test holds until
// it ends and the kernel drops if the test process dies.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(os.TempDir(), "flotilla-test-ports")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		tb.Fatal(err)
	}
	for range 100 {
		port := strconv.Itoa(freeAddrLow + rand.IntN(freeAddrHigh-freeAddrLow)) //nolint:gosec // spreading ports, not security
		lock, ok := reservePort(filepath.Join(dir, port))
		if !ok {
			continue
		}
		addr := "127.0.0.1:" + port
		if l, err := net.Listen("tcp", addr); err == nil {
			_ = l.Close()
			tb.Cleanup(func() { _ = lock.Close() })
			return addr
		}
		_ = lock.Close()
	}
	tb.Fatal("no free port in 100 tries")
	return ""
}

// reservePort takes an exclusive advisory lock on the file at path; false
// if another holder (this process or another) has it. Closing the file
// releases the reservation.
func reservePort(path string) (*os.File, bool) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, false
	}
	return f, true
}

// FreeAddr's range: below the kernel's ephemeral ports, above the
// services' own (15000s) and the stacks tests move by --port-offset 5000
// to 8000 (20010–23123, test/dashboards).
const freeAddrLow, freeAddrHigh = 24000, 32000

// SyncBuffer is a bytes.Buffer safe for concurrent writers and readers:
// a log sink a test reads while what it runs writes to it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
