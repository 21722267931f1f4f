package idem_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func withCache(size int) func(*idem.Config) {
	return func(c *idem.Config) { c.ReplayCacheSize = size }
}

// bobReq is req from another principal.
func bobReq(method, path, key, body string) *http.Request {
	r := req(method, path, key, body)
	r.Header.Set("Authorization", "Bearer bob")
	return r
}

func TestReplayCacheHitServesSameBytesWithoutTheStore(t *testing.T) {
	t.Parallel()
	b := setup(t, withCache(16))
	h := &counter{}
	mw := b.mw.Handler(h)
	first := serve(mw, req("POST", "/v1/charges", key, `{"amount":2000}`))
	calls := b.store.calls()

	second := serve(mw, req("POST", "/v1/charges", key, `{"amount": 2000}`))
	if n := b.store.calls() - calls; n != 0 {
		t.Errorf("a cached replay made %d store calls, want 0", n)
	}
	if h.n.Load() != 1 {
		t.Errorf("handler ran %d times", h.n.Load())
	}
	if second.Code != first.Code || second.Body.String() != first.Body.String() {
		t.Errorf("replay %d %q, want %d %q", second.Code, second.Body, first.Code, first.Body)
	}
	if second.Header().Get("Idempotent-Replayed") != "true" || second.Header().Get("Idempotency-Key") != key {
		t.Errorf("replay headers %v", second.Header())
	}
	if got, want := second.Header().Get("Location"), first.Header().Get("Location"); got != want {
		t.Errorf("Location %q, want %q", got, want)
	}
	if second.Header().Get("Set-Cookie") != "" {
		t.Error("a cached replay carries Set-Cookie")
	}
}

func TestReplayCacheIsFilledByAReplayFromTheStore(t *testing.T) {
	t.Parallel()
	st := setup(t, nil).store // completed by a process without a cache
	h := &counter{}
	serve(setup(t, func(c *idem.Config) { c.Store = st }).mw.Handler(h), req("POST", "/x", key, "{}"))

	b := setup(t, func(c *idem.Config) { c.Store = st; c.ReplayCacheSize = 16 })
	mw := b.mw.Handler(h)
	serve(mw, req("POST", "/x", key, "{}")) // from the store
	calls := st.calls()
	w := serve(mw, req("POST", "/x", key, "{}"))
	if st.calls() != calls || w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || h.n.Load() != 1 {
		t.Errorf("second replay: %d store calls, status %d, %d executions", st.calls()-calls, w.Code, h.n.Load())
	}
}

func TestReplayCacheMissesForAnotherScope(t *testing.T) {
	t.Parallel()
	b := setup(t, withCache(16))
	h := &counter{}
	mw := b.mw.Handler(h)
	serve(mw, req("POST", "/x", key, "{}"))
	claims := b.store.claims.Load()
	w := serve(mw, bobReq("POST", "/x", key, "{}"))
	if b.store.claims.Load() != claims+1 {
		t.Error("another principal's request did not go to the store")
	}
	if w.Header().Get("Idempotent-Replayed") != "" || h.n.Load() != 2 {
		t.Errorf("bob got alice's response: replayed %q, %d executions", w.Header().Get("Idempotent-Replayed"), h.n.Load())
	}
}

func TestReplayCacheMismatchAnswersKeyReused(t *testing.T) {
	t.Parallel()
	b := setup(t, withCache(16))
	h := &counter{}
	mw := b.mw.Handler(h)
	serve(mw, req("POST", "/x", key, `{"amount":2000}`))
	w := serve(mw, req("POST", "/x", key, `{"amount":3000}`))
	wantCode(t, w, 409, idem.CodeKeyReused)
	if w.Header().Get("Idempotent-Replayed") != "" || h.n.Load() != 1 {
		t.Errorf("mismatch served the cached body or executed: %s", w.Body)
	}
}

func TestReplayCacheDropsEntriesBeforeTheyExpire(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.ReplayCacheSize = 16; c.TTL = time.Hour })
	h := &counter{}
	mw := b.mw.Handler(h)
	serve(mw, req("POST", "/x", key, "{}"))

	// Within the margin before expires_at the cache no longer answers; the store
	// (whose record is still live) does, and the entry is not cached again.
	b.clock.Advance(time.Hour - time.Second)
	for i := range 2 {
		claims := b.store.claims.Load()
		w := serve(mw, req("POST", "/x", key, "{}"))
		if b.store.claims.Load() != claims+1 || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay %d near expiry: served from the cache, or not a replay (%d)", i, w.Code)
		}
	}
	// After expires_at the key starts a new operation.
	b.clock.Advance(time.Second)
	w := serve(mw, req("POST", "/x", key, "{}"))
	if w.Header().Get("Idempotent-Replayed") != "" || h.n.Load() != 2 {
		t.Errorf("expired record replayed: %d executions", h.n.Load())
	}
}

func TestReplayCacheIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, withCache(2))
	h := &counter{}
	mw := b.mw.Handler(h)
	keys := []string{key + "-1", key + "-2", key + "-3"}
	for _, k := range keys {
		serve(mw, req("POST", "/x", k, "{}"))
	}
	for i, want := range []int64{1, 0} { // keys[0] was evicted; keys[2] is cached
		k := keys[2*i]
		claims := b.store.claims.Load()
		w := serve(mw, req("POST", "/x", k, "{}"))
		if got := b.store.claims.Load() - claims; got != want || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("key %s: %d claims (want %d), status %d", k, got, want, w.Code)
		}
	}
	if idem.ReplayCacheLen(b.mw) != 2 {
		t.Errorf("cache holds %d entries, want 2", idem.ReplayCacheLen(b.mw))
	}
}

func TestReplayCacheNeverHoldsAReleasedKey(t *testing.T) {
	t.Parallel()
	b := setup(t, withCache(16))
	h := &counter{status: 503}
	mw := b.mw.Handler(h)
	serve(mw, req("POST", "/x", key, "{}"))
	h.status = 201
	w := serve(mw, req("POST", "/x", key, "{}"))
	if w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" || h.n.Load() != 2 {
		t.Errorf("retry after a release: %d, replayed %q, %d executions", w.Code, w.Header().Get("Idempotent-Replayed"), h.n.Load())
	}
	if idem.ReplayCacheLen(b.mw) != 1 {
		t.Errorf("cache holds %d entries, want only the completed one", idem.ReplayCacheLen(b.mw))
	}
}

func TestReplayCacheNeverServesInFlightState(t *testing.T) {
	t.Parallel()
	b := setup(t, withCache(16))
	h := newHeld()
	mw := b.mw.Handler(h)
	done := make(chan struct{})
	go func() { serve(mw, req("POST", "/x", key, "{}")); close(done) }()
	<-h.entered
	wantCode(t, serve(mw, req("POST", "/x", key, "{}")), 409, idem.CodeRequestInProgress)
	if idem.ReplayCacheLen(b.mw) != 0 {
		t.Error("the cache holds an in-flight record")
	}
	close(h.gate)
	<-done
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("after completion: %d", w.Code)
	}
}

func TestReplayCacheKeepsTransactionCompletions(t *testing.T) {
	t.Parallel()
	b := setup(t, withCache(16))
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := inTx(r.Context(), b.store, nil, func() error {
			w.WriteHeader(201)
			io.WriteString(w, `{"id":"ch_1"}`)
			return nil
		})
		if err != nil {
			t.Errorf("inTx: %v", err)
		}
	}))
	serve(mw, req("POST", "/x", key, "{}"))
	calls := b.store.calls()
	w := serve(mw, req("POST", "/x", key, "{}"))
	if b.store.calls() != calls || w.Body.String() != `{"id":"ch_1"}` {
		t.Errorf("replay after a §7 completion: %d store calls, body %s", b.store.calls()-calls, w.Body)
	}
}

func TestReplayCacheConcurrentUse(t *testing.T) {
	t.Parallel()
	b := setup(t, withCache(4))
	h := &counter{}
	mw := b.mw.Handler(h)
	const keys, workers, rounds = 8, 8, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				k := fmt.Sprintf("%s-%d", key, (w+i)%keys)
				r := req("POST", "/x", k, "{}")
				if i%2 == 1 {
					r = bobReq("POST", "/x", k, "{}")
				}
				got := serve(mw, r)
				if got.Code != 201 && got.Code != 409 {
					t.Errorf("status %d", got.Code)
				}
			}
		})
	}
	wg.Wait()
	if n := h.n.Load(); n != 2*keys {
		t.Errorf("%d executions, want one per (scope, key): %d", n, 2*keys)
	}
}

func TestReplayCacheSizeMustNotBeNegative(t *testing.T) {
	t.Parallel()
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "Config.ReplayCacheSize") {
			t.Errorf("panic %v, want one naming Config.ReplayCacheSize", p)
		}
	}()
	setup(t, withCache(-1))
}
