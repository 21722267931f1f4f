package idem_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/store/memory"
)

// A scope may have MaxInFlightPerScope calls under way in a process: past it a call is
// refused with a QuotaError (429 quota_exceeded behind the middleware) and nothing is
// claimed; another scope is not affected, and the scope's next call goes through once
// one of its calls ended (SPEC §19).
func TestAScopePastItsCallsInFlightIsRefusedAndNothingClaimed(t *testing.T) {
	t.Parallel()
	st := memory.New()
	var events []observe.Outcome
	var mu sync.Mutex
	g := idem.NewGuard(idem.GuardConfig{Store: st, MaxInFlightPerScope: 2, Observer: &observe.Observer{Claimed: func(e observe.ClaimEvent) {
		mu.Lock()
		events = append(events, e.Outcome)
		mu.Unlock()
	}}})
	ctx := context.Background()
	begin := func(scope, key string) (*idem.Handle, error) {
		h, _, err := g.Begin(ctx, idem.Call{Scope: scope, Key: key, Fingerprint: idem.FingerprintInput(key, nil)})
		return h, err
	}
	h1, err1 := begin("alice", "k1")
	h2, err2 := begin("alice", "k2")
	if err1 != nil || err2 != nil {
		t.Fatalf("two calls within the bound: %v, %v", err1, err2)
	}
	_, err := begin("alice", "k3")
	var qerr *idem.QuotaError
	if !errors.Is(err, idem.ErrQuotaExceeded) || !errors.As(err, &qerr) || qerr.Limit != idem.QuotaInFlight || qerr.RetryAfter <= 0 {
		t.Fatalf("a third call of alice: %v, want a QuotaError of in_flight with a RetryAfter", err)
	}
	if _, err := st.RecordGet(ctx, &idemstore.GetParams{Scope: "alice", Key: "k3"}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the refused call left a record: %v", err)
	}
	if h, err := begin("bob", "k1"); err != nil {
		t.Fatalf("bob's call: %v", err)
	} else {
		_ = h.Release()
	}
	h1.SetResponse(&idem.Response{Status: 201, Body: []byte("ok")})
	if err := h1.Complete(); err != nil {
		t.Fatal(err)
	}
	if h, err := begin("alice", "k3"); err != nil {
		t.Fatalf("alice's call once one of hers ended: %v", err)
	} else {
		_ = h.Release()
	}
	_ = h2.Release()
	mu.Lock()
	defer mu.Unlock()
	if !containsOutcome(events, observe.OutcomeQuotaExceeded) {
		t.Fatalf("the observer was told %v, want a quota_exceeded claim", events)
	}
}

func containsOutcome(events []observe.Outcome, o observe.Outcome) bool {
	for _, e := range events {
		if e == o {
			return true
		}
	}
	return false
}

// Once a scope stored MaxStoredBytesPerScope bytes of responses in the window, its new
// keys get 429 quota_exceeded with Retry-After (the rest of the window) and nothing is
// claimed, while its retries are still replayed; another scope is not affected; the
// next window lets it store again. The log line names the bound, not the key.
func TestAScopePastItsStoredBytesGets429UntilTheWindowEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.MaxStoredBytesPerScope, c.QuotaWindow = 100, time.Minute })
	h := b.mw.Handler(&counter{})
	first := serve(h, req("POST", "/v1/charges", "key-quota-0001", `{"n":1}`))
	second := serve(h, req("POST", "/v1/charges", "key-quota-0002", `{"n":2}`))
	if first.Code != 201 || second.Code != 201 {
		t.Fatalf("within the bound: %d, %d", first.Code, second.Code)
	}
	b.clock.Advance(10 * time.Second)
	claims := b.store.claims.Load()
	third := serve(h, req("POST", "/v1/charges", "key-quota-0003", `{"n":3}`))
	wantCode(t, third, http.StatusTooManyRequests, idem.CodeQuotaExceeded)
	if ra := third.Header().Get("Retry-After"); ra != "50" {
		t.Fatalf("Retry-After %q, want the rest of the window, 50", ra)
	}
	if b.store.claims.Load() != claims {
		t.Fatal("the refused request made a claim")
	}
	if _, err := b.store.RecordGet(context.Background(), &idemstore.GetParams{Scope: "alice", Key: "key-quota-0003"}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the refused request left a record: %v", err)
	}
	if retry := serve(h, req("POST", "/v1/charges", "key-quota-0001", `{"n":1}`)); retry.Code != 201 || retry.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a retry past the bound: %d, want its replay", retry.Code)
	}
	if reused := serve(h, req("POST", "/v1/charges", "key-quota-0001", `{"n":9}`)); reused.Code != http.StatusConflict {
		t.Fatalf("a reused key past the bound: %d, want key_reused", reused.Code)
	}
	bob := req("POST", "/v1/charges", "key-quota-0003", `{"n":3}`)
	bob.Header.Set("Authorization", "Bearer bob")
	if got := serve(h, bob); got.Code != 201 {
		t.Fatalf("bob's request: %d", got.Code)
	}
	b.clock.Advance(time.Minute)
	if got := serve(h, req("POST", "/v1/charges", "key-quota-0003", `{"n":3}`)); got.Code != 201 {
		t.Fatalf("a new window: %d", got.Code)
	}
	logs := b.logs.String()
	if !strings.Contains(logs, "limit=stored_bytes") || strings.Contains(logs, "key-quota-0003") || strings.Contains(logs, "alice") {
		t.Fatalf("the log line of the refusal:\n%s", logs)
	}
}

// A negative bound is none.
func TestNegativeBoundsPerScopeAreNone(t *testing.T) {
	t.Parallel()
	g := idem.NewGuard(idem.GuardConfig{Store: memory.New(), MaxInFlightPerScope: -1, MaxStoredBytesPerScope: -1})
	var hs []*idem.Handle
	for i := range idem.DefaultMaxInFlightPerScope + 1 {
		h, _, err := g.Begin(context.Background(), idem.Call{Scope: "alice", Key: "k" + itoa(int64(i))})
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		hs = append(hs, h)
	}
	for _, h := range hs {
		_ = h.Release()
	}
}
