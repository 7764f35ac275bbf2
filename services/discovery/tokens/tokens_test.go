package tokens

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	cav1 "github.com/flotilla-mesh/flotilla/api/gen/flotilla/ca/v1"
)

// reviews answers over real gRPC as ca's TokenReviewService would: a
// token "sa:<namespace>:<account>:<cache seconds>" is that account's,
// "down" finds ca unable to check, anything else is refused. It counts
// the reviews it makes.
type reviews struct {
	cav1.UnimplementedTokenReviewServiceServer
	calls atomic.Int32
	peers chan string
}

func (r *reviews) Review(_ context.Context, req *cav1.ReviewRequest) (*cav1.ReviewResponse, error) {
	r.calls.Add(1)
	select {
	case r.peers <- req.GetPeerAddress():
	default:
	}
	parts := strings.Split(req.GetToken(), ":")
	switch {
	case req.GetToken() == "down":
		return nil, status.Error(codes.Unavailable, "the apiserver does not answer")
	case len(parts) == 4 && parts[0] == "sa":
		var secs int64
		for _, c := range parts[3] {
			secs = secs*10 + int64(c-'0')
		}
		return &cav1.ReviewResponse{TrustDomain: "cluster.local", Namespace: parts[1], ServiceAccount: parts[2], CacheSeconds: secs}, nil
	case req.GetToken() == "half":
		return &cav1.ReviewResponse{Namespace: "demo"}, nil
	}
	return nil, status.Error(codes.Unauthenticated, "token: signature does not verify")
}

func start(t *testing.T, maxEntries int) (*reviews, *Reviewer, *time.Time) {
	t.Helper()
	r := &reviews{peers: make(chan string, 1)}
	gs := grpc.NewServer()
	cav1.RegisterTokenReviewServiceServer(gs, r)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	now := time.Unix(1_000_000, 0)
	return r, New(Options{Client: cav1.NewTokenReviewServiceClient(cc), MaxEntries: maxEntries, Now: func() time.Time { return now }}), &now
}

func TestAReviewIsRememberedForAsLongAsCAAllowsAndNoLonger(t *testing.T) {
	r, rev, now := start(t, 0)
	ctx := context.Background()
	id, cached, err := rev.Authenticate(ctx, "sa:demo:greeter:60", "10.0.0.7")
	if err != nil || cached || id.String() != "spiffe://cluster.local/ns/demo/sa/greeter" {
		t.Fatalf("first: %v %v %v", id, cached, err)
	}
	if got := <-r.peers; got != "10.0.0.7" {
		t.Fatalf("ca was told the proxy is at %q", got)
	}
	*now = now.Add(59 * time.Second)
	if _, cached, err := rev.Authenticate(ctx, "sa:demo:greeter:60", "10.0.0.7"); err != nil || !cached {
		t.Fatalf("within the minute ca allows: cached=%v %v", cached, err)
	}
	*now = now.Add(time.Second)
	if _, cached, err := rev.Authenticate(ctx, "sa:demo:greeter:60", "10.0.0.7"); err != nil || cached {
		t.Fatalf("once the minute is over, ca must be asked again: cached=%v %v", cached, err)
	}
	// An answer ca says not to keep (a token about to expire) is not kept.
	for range 2 {
		if _, cached, err := rev.Authenticate(ctx, "sa:demo:greeter:0", ""); err != nil || cached {
			t.Fatalf("a review not to be reused: cached=%v %v", cached, err)
		}
	}
	if got := r.calls.Load(); got != 4 {
		t.Fatalf("ca reviewed %d times, want 4", got)
	}
}

func TestRefusedUnavailableAndHostileTokensAreToldApartAndNeverRemembered(t *testing.T) {
	r, rev, _ := start(t, 0)
	ctx := context.Background()
	for name, c := range map[string]struct {
		token string
		want  error
		asks  bool
	}{
		"forged":          {"forged", ErrRefused, true},
		"ca cannot check": {"down", ErrUnavailable, true},
		"ca half answers": {"half", ErrUnavailable, true},
		"empty":           {"", ErrRefused, false},
		"oversized":       {strings.Repeat("x", MaxTokenBytes+1), ErrRefused, false},
	} {
		before := r.calls.Load()
		if _, _, err := rev.Authenticate(ctx, c.token, "10.0.0.8"); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
		if asked := r.calls.Load() > before; asked != c.asks {
			t.Errorf("%s: ca asked: %v, want %v", name, asked, c.asks)
		}
	}
	if rev.Len() != 0 {
		t.Fatalf("%d failures remembered", rev.Len())
	}
}

func TestTheCacheStaysWithinItsBoundWhateverTokensCome(t *testing.T) {
	_, rev, now := start(t, 8)
	ctx := context.Background()
	add := func(name string) {
		t.Helper()
		if _, _, err := rev.Authenticate(ctx, "sa:demo:"+name+":300", ""); err != nil {
			t.Fatal(err)
		}
		if n := rev.Len(); n > 8 {
			t.Fatalf("the cache holds %d, more than its 8", n)
		}
	}
	for i := range 50 {
		add("a" + strings.Repeat("b", i))
	}
	for i := rev.Len(); i < 8; i++ {
		add("fill" + strings.Repeat("b", i))
	}
	// Full, and every entry expired: they make room, the new one is kept.
	*now = now.Add(time.Hour)
	add("late")
	if n := rev.Len(); n != 1 {
		t.Fatalf("after every entry expired, the cache holds %d, want the new one only", n)
	}
}
