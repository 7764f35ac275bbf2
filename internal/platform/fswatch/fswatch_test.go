package fswatch

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestABurstOfRelevantEventsIsOneChange(t *testing.T) {
	dir := t.TempDir()
	changes := make(chan struct{}, 10)
	started := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{
			Dirs: []string{dir}, Debounce: 100 * time.Millisecond, Log: slog.New(slog.DiscardHandler),
			Relevant: func(p string) bool { return strings.HasSuffix(p, ".yaml") },
			OnStart:  func() error { close(started); return nil },
			OnChange: func() error { changes <- struct{}{}; return nil },
		})
	}()
	<-started
	for i := range 5 {
		if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte{byte(i)}, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ignored.txt"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changes:
	case <-time.After(20 * time.Second):
		t.Fatal("no change reported")
	}
	select {
	case <-changes:
		t.Fatal("one burst reported twice")
	case <-time.After(400 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestACallbackErrorEndsTheWatch(t *testing.T) {
	boom := errors.New("boom")
	err := Run(context.Background(), Options{
		Dirs: []string{t.TempDir()}, Log: slog.New(slog.DiscardHandler),
		OnStart: func() error { return boom }, OnChange: func() error { return nil },
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if err := Run(context.Background(), Options{Dirs: []string{"/nonexistent/dir"}, Log: slog.New(slog.DiscardHandler)}); err == nil {
		t.Fatal("watching a missing directory succeeded")
	}
}
