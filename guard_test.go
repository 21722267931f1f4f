package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/memory"
)

// The core API without HTTP (SPEC §16) on the in-memory store; store/storetest runs
// the store-generic cases of Do and DoTx on every store.

func newGuard(t *testing.T, mod func(*idem.GuardConfig)) (*idem.Guard, *countingStore) {
	t.Helper()
	st := &countingStore{Store: memory.New()}
	cfg := idem.GuardConfig{Store: st, Logger: slog.New(slog.DiscardHandler)}
	if mod != nil {
		mod(&cfg)
	}
	return idem.NewGuard(cfg), st
}

func chargeCall(amount int) idem.Call {
	fp, err := idem.FingerprintJSON("charges.create", map[string]any{"amount": amount, "currency": "usd"})
	if err != nil {
		panic(err)
	}
	return idem.Call{Scope: "alice", Key: key, Fingerprint: fp}
}

func TestBeginReturnsAClaimThenTheStoredResponse(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, nil)
	ctx := context.Background()
	h, replay, err := g.Begin(ctx, chargeCall(2000))
	if err != nil || replay != nil || h == nil {
		t.Fatalf("Begin = %v, %v, %v; want an acquired claim", h, replay, err)
	}
	if idem.FromContext(h.Context()) != h || h.Key() != key || h.Scope() != "alice" || h.RecordID() == "" {
		t.Fatal("the claim's context, key, scope or record id is wrong")
	}
	resp := &idem.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}
	h.SetResponse(resp)
	if err := h.Complete(); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if h.Context().Err() == nil {
		t.Error("the operation's context lives on after Complete")
	}
	if err := h.Complete(); err != nil {
		t.Errorf("second Complete: %v, want nil and nothing changed", err)
	}
	h2, replay, err := g.Begin(ctx, chargeCall(2000))
	if err != nil || h2 != nil || !replay.Equal(resp) {
		t.Fatalf("repeat Begin = %v, %v, %v; want the stored response", h2, replay, err)
	}
	if _, _, err := g.Begin(ctx, chargeCall(3000)); !errors.Is(err, idem.ErrKeyReused) {
		t.Fatalf("Begin with another input = %v, want ErrKeyReused", err)
	}
}

func TestReleaseLetsTheRepeatExecute(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, nil)
	h, _, err := g.Begin(context.Background(), chargeCall(2000))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if h, _, err := g.Begin(context.Background(), chargeCall(2000)); err != nil || h == nil {
		t.Fatalf("Begin after Release = %v, %v; want the key acquired again", h, err)
	}
}

func TestBeginOfANotStoredResponseIsResponseNotStored(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, nil)
	h, _, _ := g.Begin(context.Background(), chargeCall(2000))
	h.SetResponse(&idem.Response{Status: 200, NotStored: true})
	if err := h.Complete(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Begin(context.Background(), chargeCall(2000)); !errors.Is(err, idem.ErrResponseNotStored) {
		t.Fatalf("Begin = %v, want ErrResponseNotStored", err)
	}
}

func TestBeginWhileTheStoreFailsIsStoreUnavailable(t *testing.T) {
	t.Parallel()
	g, st := newGuard(t, nil)
	st.down.Store(true)
	_, _, err := g.Begin(context.Background(), chargeCall(2000))
	var se *idem.StoreError
	if !errors.Is(err, idem.ErrStoreUnavailable) || !errors.As(err, &se) || se.Op != "claim" || !errors.Is(err, errStoreDown) {
		t.Fatalf("Begin = %v, want a StoreError of the claim wrapping the store's error", err)
	}
}

func TestBeginRefusesACallWithoutScopeOrKey(t *testing.T) {
	t.Parallel()
	g, st := newGuard(t, nil)
	if _, _, err := g.Begin(context.Background(), idem.Call{Key: key}); !errors.Is(err, idem.ErrScopeRequired) {
		t.Errorf("no scope: %v", err)
	}
	if _, _, err := g.Begin(context.Background(), idem.Call{Scope: "alice"}); !errors.Is(err, idem.ErrKeyRequired) {
		t.Errorf("no key: %v", err)
	}
	if st.calls() != 0 {
		t.Errorf("%d store calls for refused calls", st.calls())
	}
}

// Keys that the HTTP, gRPC and consumer adapters could never pass are refused by the
// core too, before the store is asked: longer than idem.MaxKeyLength bytes, or with
// control characters, which would break every log line and listing that shows them
// (issue 19 item 9: Do took a 100,000-byte key and keys with NUL or a newline).
func TestBeginRefusesKeysNoAdapterCouldPass(t *testing.T) {
	t.Parallel()
	g, st := newGuard(t, nil)
	for _, k := range []string{strings.Repeat("k", idem.MaxKeyLength+1), strings.Repeat("k", 100_000), "key\x00with-nul", "key\nwith-newline", "key\x7fdel"} {
		_, _, err := g.Begin(context.Background(), idem.Call{Scope: "alice", Key: k})
		if !errors.Is(err, idem.ErrKeyInvalid) || strings.Contains(err.Error(), k) {
			t.Errorf("key of %d bytes: Begin = %v, want an error wrapping ErrKeyInvalid that does not hold the key", len(k), err)
		}
	}
	if st.calls() != 0 {
		t.Errorf("%d store calls for refused keys", st.calls())
	}
	for _, k := range []string{strings.Repeat("k", idem.MaxKeyLength), "job 42 of tenant été", "x"} {
		h, _, err := g.Begin(context.Background(), idem.Call{Scope: "alice", Key: k})
		if err != nil {
			t.Errorf("key %q: Begin = %v, want a claim", k, err)
			continue
		}
		_ = h.Release()
	}
}

// Do, DoTx and Begin on a nil *Guard panic with a message that says what is wrong,
// as every other misuse does, rather than a bare nil dereference.
func TestANilGuardPanicsNamingIt(t *testing.T) {
	t.Parallel()
	var g *idem.Guard
	for name, f := range map[string]func(){
		"Begin": func() { _, _, _ = g.Begin(context.Background(), chargeCall(1)) },
		"Do": func() {
			_, _, _ = idem.Do(context.Background(), g, chargeCall(1), func(context.Context) (int, error) { return 1, nil })
		},
	} {
		func() {
			defer func() {
				if got := fmt.Sprint(recover()); !strings.HasPrefix(got, "idem: ") || !strings.Contains(got, "nil *Guard") {
					t.Errorf("%s: panic %q, want one naming the nil *Guard", name, got)
				}
			}()
			f()
		}()
	}
}

func TestGuardPanicsNamingTheField(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		want  string
		build func()
	}{
		{"GuardConfig.Store is required", func() { idem.NewGuard(idem.GuardConfig{}) }},
		{"GuardConfig.TTL (1s) must be longer than GuardConfig.Lease (30s)", func() {
			idem.NewGuard(idem.GuardConfig{Store: memory.New(), TTL: time.Second})
		}},
		{"GuardConfig.Heartbeat", func() {
			idem.NewGuard(idem.GuardConfig{Store: memory.New(), Heartbeat: time.Hour})
		}},
		{"GuardConfig.StoreTimeout", func() {
			idem.NewGuard(idem.GuardConfig{Store: memory.New(), StoreTimeout: -1})
		}},
		{"Call.TTL (30s) must be longer than GuardConfig.Lease (30s)", func() {
			g := idem.NewGuard(idem.GuardConfig{Store: memory.New()})
			g.Begin(context.Background(), idem.Call{Scope: "s", Key: key, TTL: 30 * time.Second})
		}},
	} {
		t.Run(tt.want, func(t *testing.T) {
			defer func() {
				if got := fmt.Sprint(recover()); !strings.HasPrefix(got, "idem: ") || !strings.Contains(got, tt.want) {
					t.Errorf("panic %q, want one saying %q", got, tt.want)
				}
			}()
			tt.build()
		})
	}
}

type receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func TestDoPanicReleasesTheKeyAndIsRaisedAgain(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, nil)
	func() {
		defer func() {
			if p := recover(); p != "processor exploded" {
				t.Fatalf("recovered %v, want the function's panic", p)
			}
		}()
		idem.Do(context.Background(), g, chargeCall(2000), func(context.Context) (receipt, error) {
			panic("processor exploded")
		})
	}()
	v, replayed, err := idem.Do(context.Background(), g, chargeCall(2000), func(context.Context) (receipt, error) {
		return receipt{ID: "ch_2"}, nil
	})
	if err != nil || replayed || v.ID != "ch_2" {
		t.Fatalf("Do after the panic = %+v, %v, %v; want it executed afresh", v, replayed, err)
	}
}

func TestDoOfAResultThatDoesNotDecodeFails(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, nil)
	if _, _, err := idem.Do(context.Background(), g, chargeCall(2000), func(context.Context) (string, error) {
		return "ch_1", nil
	}); err != nil {
		t.Fatal(err)
	}
	_, replayed, err := idem.Do(context.Background(), g, chargeCall(2000), func(context.Context) (receipt, error) {
		t.Error("the function ran for a completed key")
		return receipt{}, nil
	})
	if !replayed || err == nil || !strings.Contains(err.Error(), "decoding the stored result") {
		t.Fatalf("Do = replayed %v, %v; want a decoding error", replayed, err)
	}
}

func TestDoRepeatsAreServedByTheReplayCache(t *testing.T) {
	t.Parallel()
	g, st := newGuard(t, func(c *idem.GuardConfig) { c.ReplayCacheSize = 8 })
	fn := func(context.Context) (receipt, error) { return receipt{ID: "ch_1", Amount: 2000}, nil }
	first, _, _ := idem.Do(context.Background(), g, chargeCall(2000), fn)
	claims := st.claims.Load()
	v, replayed, err := idem.Do(context.Background(), g, chargeCall(2000), fn)
	if err != nil || !replayed || v != first || st.claims.Load() != claims {
		t.Fatalf("repeat = %+v, replayed %v, %v, %d claims; want the cached result without a store call", v, replayed, err, st.claims.Load()-claims)
	}
}

func TestMiddlewareAndDoShareTheGuard(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	v, _, err := idem.Do(context.Background(), b.mw.Guard(), idem.Call{Scope: "alice", Key: key, Fingerprint: idem.FingerprintInput("job", nil)},
		func(context.Context) (int, error) { return 7, nil })
	if err != nil || v != 7 || b.store.completes.Load() != 1 {
		t.Fatalf("Do through the middleware's guard = %v, %v, %d completions", v, err, b.store.completes.Load())
	}
	// The same key from an HTTP request is another input: key_reused, never a replay
	// of the function's result.
	wantCode(t, serve(b.mw.Handler(&counter{}), req("POST", "/x", key, "{}")), http.StatusConflict, idem.CodeKeyReused)
}

func TestFingerprintInputMatchesReserialisedJSONOnly(t *testing.T) {
	t.Parallel()
	a := idem.FingerprintInput("charges.create", []byte(`{"amount": 2000, "currency": "usd"}`))
	if b := idem.FingerprintInput("charges.create", []byte(`{"currency":"usd","amount":2000}`)); b != a {
		t.Error("the same JSON reserialised has another fingerprint")
	}
	if b, _ := idem.FingerprintJSON("charges.create", map[string]any{"currency": "usd", "amount": 2000}); b != a {
		t.Error("FingerprintJSON of the same value differs from FingerprintInput of its JSON")
	}
	for name, other := range map[string]idem.Fingerprint{
		"another operation": idem.FingerprintInput("refunds.create", []byte(`{"amount": 2000, "currency": "usd"}`)),
		"another number":    idem.FingerprintInput("charges.create", []byte(`{"amount": 2000.0, "currency": "usd"}`)),
		"raw bytes":         idem.FingerprintInput("charges.create", []byte(`amount=2000&currency=usd`)),
	} {
		if other == a {
			t.Errorf("%s has the same fingerprint", name)
		}
	}
	if raw := idem.FingerprintInput("op", []byte{0xff, 0x01}); raw != idem.FingerprintInput("op", []byte{0xff, 0x01}) || raw.Version != idemstore.FingerprintVersion {
		t.Error("the fingerprint of raw bytes is not stable or lacks the version")
	}
}

func TestAHandlerCannotEndTheMiddlewaresClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var completeErr, releaseErr error
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := idem.FromContext(r.Context())
		completeErr, releaseErr = h.Complete(), h.Release()
		h.SetResponse(&idem.Response{Status: 200, Body: []byte("not what the handler wrote")})
		w.WriteHeader(201)
	}))
	serve(mw, req("POST", "/x", key, "{}"))
	if completeErr == nil || releaseErr == nil {
		t.Errorf("Complete = %v, Release = %v from a handler; want errors", completeErr, releaseErr)
	}
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" || w.Body.Len() != 0 {
		t.Errorf("retry: %d %q, want the response the handler wrote, replayed", w.Code, w.Body)
	}
}

func TestBeginAfterALapsedLeaseTakesOverKeepingTheRecordID(t *testing.T) {
	t.Parallel()
	clock := newClock()
	g, _ := newGuard(t, func(c *idem.GuardConfig) { c.Clock = clock.Now })
	dead, _, err := g.Begin(context.Background(), chargeCall(2000)) // a holder that stops renewing
	if err != nil {
		t.Fatal(err)
	}
	if dead.TookOver() {
		t.Error("the first claim of a key reports a takeover")
	}
	clock.Advance(idem.DefaultLease + time.Millisecond)
	h, _, err := g.Begin(context.Background(), chargeCall(2000))
	if err != nil || h == nil || !h.TookOver() || h.RecordID() != dead.RecordID() {
		t.Fatalf("Begin after the lease lapsed = %v, %v; want a takeover keeping record id %q", h, err, dead.RecordID())
	}
	h.SetResponse(&idem.Response{Status: 201})
	if err := h.Complete(); err != nil {
		t.Fatal(err)
	}
	dead.SetResponse(&idem.Response{Status: 201, Body: []byte("late")})
	if err := dead.Complete(); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the old holder's Complete = %v, want ErrLeaseLost (fenced)", err)
	}
	if err := dead.Release(); err != nil {
		t.Errorf("Release after Complete = %v, want nil (already ended)", err)
	}
}
