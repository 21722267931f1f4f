package idem_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/idem-go/idem"
)

// A lease route reads its key first only while its requests often find the key
// recorded (issue 31): a replay is then one plain read, not the claim statement; a
// route that sees new keys claims them at once, with no read.
func TestALeaseRouteReadsItsKeyFirstWhileRetriesAreFrequent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := &counter{}
	mw := b.mw.Handler(h)
	newKeys := func(n int, prefix string) {
		t.Helper()
		for i := range n {
			if w := serve(mw, req("POST", "/x", fmt.Sprintf("%s-%04d", prefix, i), `{"a":1}`)); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("new key %d: %d %s", i, w.Code, w.Body)
			}
		}
	}
	newKeys(20, "key-new")
	if n := b.store.gets.Load(); n != 0 {
		t.Fatalf("%d reads for new keys only, want none: the claim is the only call", n)
	}
	retries := func(n int) {
		t.Helper()
		for range n {
			if w := serve(mw, req("POST", "/x", "key-new-0000", `{"a":1}`)); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry: %d %s (replayed %q)", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
			}
		}
	}
	retries(12) // the route learns that retries are frequent
	claims, gets := b.store.claims.Load(), b.store.gets.Load()
	retries(10)
	if b.store.claims.Load() != claims || b.store.gets.Load() != gets+10 || h.n.Load() != 20 {
		t.Fatalf("10 retries made %d claims and %d reads (%d executions in all); want no claim, one read each, 20 executions",
			b.store.claims.Load()-claims, b.store.gets.Load()-gets, h.n.Load())
	}
	wantCode(t, serve(mw, req("POST", "/x", "key-new-0000", `{"a":2}`)), http.StatusConflict, idem.CodeKeyReused)
	newKeys(60, "key-again") // and that they are not any more
	gets = b.store.gets.Load()
	newKeys(10, "key-later")
	if n := b.store.gets.Load() - gets; n != 0 {
		t.Fatalf("%d reads for new keys after the retries stopped, want none", n)
	}
}
