package idem_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/seal"
	"github.com/idem-go/idem/seal/cloudkeys"
	"github.com/idem-go/idem/store/memory"
	"pgregory.net/rapid"
)

// sealKey is a local key made of b, as `--encryption-key base64key://…` opens it; it
// can be made to fail as a key manager that does not answer.
type sealKey struct {
	seal.KeyWrapper
	away atomic.Bool
}

func (k *sealKey) Unwrap(ctx context.Context, w []byte) ([]byte, error) {
	if k.away.Load() {
		return nil, seal.ErrKeyUnavailable
	}
	return k.KeyWrapper.Unwrap(ctx, w)
}

func newSealKey(t testing.TB, b byte) *sealKey {
	t.Helper()
	k, err := cloudkeys.Open(context.Background(), "base64key://"+base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	return &sealKey{KeyWrapper: k}
}

func openKeyring(t testing.TB, st idemstore.Store, keys ...seal.KeyWrapper) *seal.Keyring {
	t.Helper()
	k, err := idem.OpenKeyring(context.Background(), st, keys...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

const cardBody = `{"id":"pm_1","card_number":"4111111111111111","cvc":"123","access_token":"tok_live_1"}`

// cardHandler answers a payment method with a card number, a token and a Location
// naming it, and counts its executions.
type cardHandler struct{ n atomic.Int64 }

func (c *cardHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/payment_methods/pm_4111111111111111")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, cardBody)
}

// sealedSetup is setup with a keyring of keys over its store, which is kept across
// restarts: pass the previous bundle's store as st.
func sealedSetup(t *testing.T, st *countingStore, keys ...seal.KeyWrapper) *bundle {
	t.Helper()
	if st == nil {
		st = &countingStore{Store: memory.New()}
	}
	var ring *seal.Keyring
	if len(keys) > 0 {
		ring = openKeyring(t, st, keys...)
	}
	b := setup(t, func(c *idem.Config) { c.Store, c.Seal = st, ring })
	b.store = st
	return b
}

// rawRecord reads the record of alice's key as the store keeps it.
func rawRecord(t *testing.T, st idemstore.Store, key string) *idemstore.Record {
	t.Helper()
	rec, err := st.RecordGet(context.Background(), &idemstore.GetParams{Scope: "alice", Key: key, Now: newClock().Now()})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestSealedRecordHoldsNoPlaintextAndReplaysByteForByte(t *testing.T) {
	b := sealedSetup(t, nil, newSealKey(t, 1))
	h := &cardHandler{}
	srv := b.mw.Handler(h)
	first := serve(srv, req("POST", "/v1/payment_methods", "key-00000001", `{"card":"4111111111111111","cvc":"123"}`))
	wantCode(t, first, http.StatusCreated, "")
	rec := rawRecord(t, b.store, "key-00000001")
	raw := string(rec.Response.Body) + strings.Join(rec.Response.Header["Location"], "")
	for _, secret := range []string{"4111111111111111", "tok_live_1", "123", "payment_methods"} {
		if strings.Contains(raw, secret) {
			t.Errorf("the store holds %q in clear: %q", secret, raw)
		}
	}
	if len(rec.Response.Header) != 0 || !seal.Sealed(rec.Response.Body) {
		t.Errorf("stored headers %v, sealed body %v; want none, and a sealed body", rec.Response.Header, seal.Sealed(rec.Response.Body))
	}
	plain := idem.FingerprintRequest(req("POST", "/v1/payment_methods", "", `{"card":"4111111111111111","cvc":"123"}`),
		[]byte(`{"card":"4111111111111111","cvc":"123"}`))
	if !rec.Fingerprint.Keyed() || rec.Fingerprint.Version != idemstore.KeyedVersionOffset+plain.Version || rec.Fingerprint.Sum == plain.Sum {
		t.Errorf("stored fingerprint v%d %x: want a keyed one (v%d), not the plain SHA-256 %x",
			rec.Fingerprint.Version, rec.Fingerprint.Sum, idemstore.KeyedVersionOffset+plain.Version, plain.Sum)
	}
	again := serve(srv, req("POST", "/v1/payment_methods", "key-00000001", `{"cvc":"123", "card":"4111111111111111"}`))
	wantCode(t, again, http.StatusCreated, "")
	if again.Body.String() != first.Body.String() || again.Header().Get("Location") != first.Header().Get("Location") ||
		again.Header().Get("Content-Type") != "application/json" || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay %q %v; want %q with its headers", again.Body, again.Header(), first.Body)
	}
	if n := h.n.Load(); n != 1 {
		t.Errorf("executed %d times", n)
	}
	changed := serve(srv, req("POST", "/v1/payment_methods", "key-00000001", `{"card":"4111111111111112","cvc":"123"}`))
	wantCode(t, changed, http.StatusConflict, idem.CodeKeyReused)
}

// movingStore answers the record of one key with another record's response and steps,
// as a row copied over another in the database would be.
type movingStore struct {
	*countingStore
	from, onto string
}

func (s *movingStore) move(rec *idemstore.Record) *idemstore.Record {
	if rec == nil || rec.Key != s.onto {
		return rec
	}
	src, err := s.countingStore.Store.RecordGet(context.Background(), &idemstore.GetParams{Scope: rec.Scope, Key: s.from, Now: newClock().Now()})
	if err != nil {
		return rec
	}
	out := *rec
	out.Response, out.Steps = src.Response, src.Steps
	return &out
}

func (s *movingStore) RecordClaim(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	res, err := s.countingStore.RecordClaim(ctx, p)
	if err == nil {
		r := *res
		r.Record = s.move(res.Record)
		res = &r
	}
	return res, err
}

func TestASealedBodyMovedOntoAnotherRecordDoesNotOpenThere(t *testing.T) {
	key := newSealKey(t, 1)
	b := sealedSetup(t, nil, key)
	var events []observe.ClaimEvent
	var mu sync.Mutex
	b2 := setup(t, func(c *idem.Config) {
		c.Store = &movingStore{countingStore: b.store, from: "key-bob-0001", onto: "key-alice-01"}
		c.Seal = openKeyring(t, b.store, key)
		c.Logger = slog.New(slog.NewTextHandler(b.logs, nil))
		c.Observer = &observe.Observer{Claimed: func(e observe.ClaimEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }}
	})
	h := &cardHandler{}
	wantCode(t, serve(b.mw.Handler(h), req("POST", "/v1/x", "key-alice-01", `{"a":1}`)), http.StatusCreated, "")
	wantCode(t, serve(b.mw.Handler(h), req("POST", "/v1/x", "key-bob-0001", `{"a":1}`)), http.StatusCreated, "")
	w := serve(b2.mw.Handler(h), req("POST", "/v1/x", "key-alice-01", `{"a":1}`))
	wantCode(t, w, http.StatusInternalServerError, idem.CodeRecordUnreadable)
	if strings.Contains(w.Body.String(), "4111") || h.n.Load() != 2 {
		t.Errorf("answered %q after %d executions; want record_unreadable and no third execution", w.Body, h.n.Load())
	}
	if logs := b.logs.String(); !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "key_id="+key.ID()) {
		t.Errorf("no ERROR line naming the key %s:\n%s", key.ID(), logs)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 || events[0].Outcome != observe.OutcomeUnreadable {
		t.Errorf("observer told %+v, want one record_unreadable", events)
	}
}

func TestRotationOpensOldRecordsSealsNewOnesUnderTheFirstKeyAndFailsClosedWithoutTheOldKey(t *testing.T) {
	a, bKey := newSealKey(t, 1), newSealKey(t, 2)
	h := &cardHandler{}
	old := sealedSetup(t, nil, a)
	st := old.store
	first := serve(old.mw.Handler(h), req("POST", "/v1/x", "key-under-a1", `{"a":1}`))

	both := sealedSetup(t, st, bKey, a) // restarted with "B,A"
	if w := serve(both.mw.Handler(h), req("POST", "/v1/x", "key-under-a1", `{"a":1}`)); w.Body.String() != first.Body.String() {
		t.Fatalf("B,A replays A's record as %d %q", w.Code, w.Body)
	}
	serve(both.mw.Handler(h), req("POST", "/v1/x", "key-under-b1", `{"a":1}`))
	if id := seal.KeyIDOf(rawRecord(t, st, "key-under-b1").Response.Body); id != bKey.ID() {
		t.Errorf("B,A sealed a new record under %s, want B (%s)", id, bKey.ID())
	}

	onlyB := sealedSetup(t, st, bKey) // A retired: the MAC secret is wrapped under B too now
	wantCode(t, serve(onlyB.mw.Handler(h), req("POST", "/v1/x", "key-under-a1", `{"a":1}`)), http.StatusInternalServerError, idem.CodeRecordUnreadable)
	if w := serve(onlyB.mw.Handler(h), req("POST", "/v1/x", "key-under-b1", `{"a":1}`)); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("B alone does not replay B's record: %d %q", w.Code, w.Body)
	}
	if n := h.n.Load(); n != 2 {
		t.Errorf("executed %d times, want 2 (one per key)", n)
	}
	if _, err := idem.OpenKeyring(context.Background(), st, newSealKey(t, 3)); !errors.Is(err, seal.ErrSecretLocked) || !strings.Contains(err.Error(), bKey.ID()) {
		t.Errorf("OpenKeyring with an unrelated key: %v; want it refused, naming the keys the secret is wrapped under", err)
	}
}

func TestWithoutTheKeyASealedRecordFailsClosed(t *testing.T) {
	h := &cardHandler{}
	key := newSealKey(t, 1)
	sealed := sealedSetup(t, nil, key)
	serve(sealed.mw.Handler(h), req("POST", "/v1/x", "key-0000seal", `{"a":1}`))
	// Restarted without a key: the store's sealing began, so the process serves
	// nothing (503), naming the key it needs, and writes nothing.
	clear := sealedSetup(t, sealed.store)
	for _, key := range []string{"key-0000seal", "key-00000new"} {
		w := serve(clear.mw.Handler(h), req("POST", "/v1/x", key, `{"a":1}`))
		wantCode(t, w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	}
	if logs := clear.logs.String(); strings.Count(logs, "level=ERROR") != 1 || !strings.Contains(logs, keyIDOf(t, key)) {
		t.Errorf("want one ERROR naming the key %s; logs:\n%s", keyIDOf(t, key), logs)
	}
	// Told that sealing is being turned off: it serves, and the sealed record still
	// fails closed (a plain fingerprint never matches a keyed one).
	off := setup(t, func(c *idem.Config) { c.Store, c.SealingOff = sealed.store, true })
	w := serve(off.mw.Handler(h), req("POST", "/v1/x", "key-0000seal", `{"a":1}`))
	wantCode(t, w, http.StatusInternalServerError, idem.CodeRecordUnreadable)
	if h.n.Load() != 1 || strings.Contains(w.Body.String(), "4111") {
		t.Errorf("executed %d times, answered %q", h.n.Load(), w.Body)
	}
}

// keyIDOf is the id of a test key.
func keyIDOf(t *testing.T, k seal.KeyWrapper) string { t.Helper(); return k.ID() }

func TestRecordsStoredInClearBeforeTheKeyKeepReplaying(t *testing.T) {
	h := &cardHandler{}
	clear := sealedSetup(t, nil)
	first := serve(clear.mw.Handler(h), req("POST", "/v1/x", "key-00clear1", `{"a":1}`))
	sealed := sealedSetup(t, clear.store, newSealKey(t, 1))
	w := serve(sealed.mw.Handler(h), req("POST", "/v1/x", "key-00clear1", `{"a":1}`))
	if w.Body.String() != first.Body.String() || h.n.Load() != 1 {
		t.Errorf("a record made before the key: %d %q after %d executions", w.Code, w.Body, h.n.Load())
	}
}

// clearingStore stores completions in clear whatever they are: a process without the
// key, writing over a record made under it.
type clearingStore struct{ *countingStore }

func (s clearingStore) RecordComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	if p.Scope == idemstore.ReservedScope { // idem's own records: the store's state
		return s.countingStore.RecordComplete(ctx, p)
	}
	q := *p
	q.Response = &idemstore.Response{Status: 201, Body: []byte(`{"forged":true}`)}
	return s.countingStore.RecordComplete(ctx, &q)
}

func TestAKeyedRecordInClearIsRefused(t *testing.T) {
	st := &countingStore{Store: memory.New()}
	ring := openKeyring(t, st, newSealKey(t, 1))
	writer := setup(t, func(c *idem.Config) { c.Store, c.Seal = clearingStore{st}, ring })
	reader := setup(t, func(c *idem.Config) { c.Store, c.Seal = st, ring })
	h := &cardHandler{}
	serve(writer.mw.Handler(h), req("POST", "/v1/x", "key-000forge", `{"a":1}`))
	wantCode(t, serve(reader.mw.Handler(h), req("POST", "/v1/x", "key-000forge", `{"a":1}`)), http.StatusInternalServerError, idem.CodeRecordUnreadable)
}

func TestAKeyManagerThatDoesNotAnswerIsUnavailableNotUnreadable(t *testing.T) {
	key := newSealKey(t, 1)
	h := &cardHandler{}
	first := sealedSetup(t, nil, key)
	serve(first.mw.Handler(h), req("POST", "/v1/x", "key-000kms01", `{"a":1}`))
	next := sealedSetup(t, first.store, key) // another process: its own data key
	key.away.Store(true)
	wantCode(t, serve(next.mw.Handler(h), req("POST", "/v1/x", "key-000kms01", `{"a":1}`)), http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	key.away.Store(false)
	if w := serve(next.mw.Handler(h), req("POST", "/v1/x", "key-000kms01", `{"a":1}`)); w.Code != http.StatusCreated || h.n.Load() != 1 {
		t.Errorf("once the key manager is back: %d %q after %d executions", w.Code, w.Body, h.n.Load())
	}
}

func TestProcessesStartingAtOnceShareOneMACSecret(t *testing.T) {
	st := memory.New()
	key := newSealKey(t, 1)
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			k, err := idem.OpenKeyring(context.Background(), st, key)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = k.SecretID()
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id == "" || id != ids[0] {
			t.Fatalf("secret ids %v: want one", ids)
		}
	}
	g := idem.NewGuard(idem.GuardConfig{Store: st})
	if _, _, err := g.Begin(context.Background(), idem.Call{Scope: "\x1fidem", Key: "mac-secret-1"}); !errors.Is(err, idem.ErrScopeRequired) {
		t.Errorf("a call in the keyring's reserved scope: %v, want ErrScopeRequired", err)
	}
}

func TestSealedStepsResumeAfterATakeoverAndHoldNoPlaintext(t *testing.T) {
	st := memory.New()
	clock := newClock()
	g := idem.NewGuard(idem.GuardConfig{Store: st, Clock: clock.Now, Seal: openKeyring(t, st, newSealKey(t, 1))})
	call := idem.Call{Scope: "alice", Key: "charge-0001", Fingerprint: idem.FingerprintInput("charge", []byte(`{"amount":1}`))}
	h, _, err := g.Begin(context.Background(), call)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.Step(h.Context(), "authorised", func(context.Context) (string, error) { return "tok_live_1", nil }); err != nil {
		t.Fatal(err)
	}
	if v, err := idem.Step(h.Context(), "authorised", func(context.Context) (string, error) { return "again", nil }); v != "tok_live_1" || err != nil {
		t.Fatalf("the step again in the same run: %q, %v", v, err)
	}
	rec := rawRecord2(t, st, "alice", "charge-0001")
	if !seal.Sealed(rec.Steps) || bytes.Contains(rec.Steps, []byte("tok_live")) {
		t.Fatalf("stored steps %q: want them sealed", rec.Steps)
	}
	clock.Advance(idem.DefaultLease + 1) // the holder died
	h2, _, err := g.Begin(context.Background(), call)
	if err != nil || !h2.TookOver() {
		t.Fatalf("takeover: %v", err)
	}
	v, err := idem.Step(h2.Context(), "authorised", func(context.Context) (string, error) { return "ran again", nil })
	if v != "tok_live_1" || err != nil {
		t.Errorf("resumed step = %q, %v; want the saved result, not a second run", v, err)
	}
	h2.SetResponse(&idem.Response{Status: 200, Body: []byte(`"ok"`)})
	if err := h2.Complete(); err != nil {
		t.Fatal(err)
	}
}

func rawRecord2(t *testing.T, st idemstore.Store, scope, key string) *idemstore.Record {
	t.Helper()
	rec, err := st.RecordGet(context.Background(), &idemstore.GetParams{Scope: scope, Key: key, Now: newClock().Now()})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestARouteThatKeepsOutcomesOnlyStoresNoBodyAndNeverRunsTwice(t *testing.T) {
	b := setup(t, nil)
	h := &cardHandler{}
	srv := b.mw.Route(idem.RouteOptions{NoStoreBody: true})(h)
	first := serve(srv, req("POST", "/v1/api_keys", "key-0mint001", `{"a":1}`))
	if first.Code != http.StatusCreated || first.Body.String() != cardBody || first.Header().Get("Location") == "" {
		t.Fatalf("the first request got %d %q %v; want the handler's response whole", first.Code, first.Body, first.Header())
	}
	rec := rawRecord(t, b.store, "key-0mint001")
	if rec.Response == nil || !rec.Response.NotStored || len(rec.Response.Body) != 0 || len(rec.Response.Header) != 0 || rec.Response.Status != http.StatusCreated {
		t.Fatalf("stored %+v; want the status alone, not stored", rec.Response)
	}
	wantCode(t, serve(srv, req("POST", "/v1/api_keys", "key-0mint001", `{"a":1}`)), http.StatusConflict, idem.CodeResponseNotStored)
	if n := h.n.Load(); n != 1 {
		t.Errorf("executed %d times", n)
	}
	// A response the policy releases is released as ever.
	fail := b.mw.Route(idem.RouteOptions{NoStoreBody: true})(&counter{status: http.StatusServiceUnavailable})
	serve(fail, req("POST", "/v1/api_keys", "key-0mint002", `{"a":1}`))
	if _, err := b.store.RecordGet(context.Background(), &idemstore.GetParams{Scope: "alice", Key: "key-0mint002", Now: newClock().Now()}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("a 503 on such a route left a record: %v", err)
	}
}

func TestASealedResponseDecodesToWhatWasEncoded(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		resp := &idem.Response{Status: rapid.IntRange(100, 999).Draw(t, "status"), Body: rapid.SliceOf(rapid.Byte()).Draw(t, "body")}
		names := rapid.SliceOfDistinct(rapid.StringN(1, 20, -1), rapid.ID[string]).Draw(t, "names")
		if len(names) > 0 {
			resp.Header = http.Header{}
		}
		for _, n := range names {
			resp.Header[n] = rapid.SliceOfN(rapid.String(), 1, 3).Draw(t, "values")
		}
		got, err := idem.DecodeResponse(idem.EncodeResponse(resp))
		if err != nil || !got.Equal(resp) {
			t.Fatalf("decoded %+v, %v; want %+v", got, err, resp)
		}
	})
}

func FuzzDecodeResponseNeverPanics(f *testing.F) {
	f.Add(idem.EncodeResponse(&idem.Response{Status: 201, Header: http.Header{"Location": {"/x"}}, Body: []byte("{}")}))
	f.Add([]byte{1, 0xc9, 1, 5, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		if resp, err := idem.DecodeResponse(b); err == nil && resp == nil {
			t.Fatal("no response and no error")
		}
	})
}
