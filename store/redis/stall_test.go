package redis_test

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/redis"
)

// A Redis that stops answering (connections open, no replies) costs a store call no
// more than its context allows, even when the URL's read_timeout is far longer: the
// middleware's StoreTimeout and the lease bound every call (SPEC §9).
func TestStalledRedisCallEndsAtItsContextDeadline(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.New(t, u.Host)
	u.Host = proxy.Addr()
	u.RawQuery = "read_timeout=60s&write_timeout=60s&max_retries=-1"
	s, err := redis.Open(t.Context(), u.String(), redis.Config{Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	proxy.Stall()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.RecordGet(ctx, &idemstore.GetParams{Scope: "stall", Key: "stalled-key-1"})
	elapsed := time.Since(start)
	if err == nil || errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("RecordGet on a stalled Redis: %v, want a store error", err)
	}
	// The bound is the context's (200 ms), not read_timeout's (60 s); 30 s leaves room
	// for a loaded machine and still fails on the old behaviour.
	if elapsed > 30*time.Second {
		t.Fatalf("RecordGet on a stalled Redis returned after %v, past its context's deadline", elapsed)
	}
	proxy.Resume()
	if _, err := s.RecordGet(t.Context(), &idemstore.GetParams{Scope: "stall", Key: "stalled-key-1"}); err != nil && !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("RecordGet after the stall: %v", err)
	}
}
