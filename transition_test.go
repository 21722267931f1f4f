package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/seal"
	"github.com/idem-go/idem/store/memory"
)

// Sealing as a transition (SPEC §20, issue 46 items 2, 3, 5, 7): processes with and
// without a key on one store, the begin and the end of sealing between a request and
// its retry, and records altered in the store.

// fleet is processes (middlewares) sharing one store and one clock, as a deployment's
// processes share a store and (within a bound) the time.
type fleet struct {
	t     *testing.T
	store *countingStore
	clock *testkit.Clock
	logs  map[string]*testkit.Buffer
}

func newFleet(t *testing.T) *fleet {
	return &fleet{t: t, store: &countingStore{Store: memory.New()}, clock: newClock(), logs: map[string]*testkit.Buffer{}}
}

// process starts a middleware named name on the fleet's store: with a keyring of
// keys (none: without a key), scoped by the bearer token, keyed when keyScope.
func (f *fleet) process(name string, keyScope bool, mod func(*idem.Config), keys ...seal.KeyWrapper) *idem.Middleware {
	f.t.Helper()
	var ring *seal.Keyring
	if len(keys) > 0 {
		ring = openKeyring(f.t, f.store, keys...)
	}
	logs := &testkit.Buffer{}
	f.logs[name] = logs
	cfg := idem.Config{
		// A lease longer than the test's clock moves: the held request's lease stays
		// live as its heartbeat would keep it.
		Store: f.store, Scope: bearerScope, KeyScope: keyScope, Clock: f.clock.Now, Seal: ring, Lease: time.Hour,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	mw := idem.New(cfg)
	idem.UseManualTicker(mw)
	return mw
}

// begin begins sealing at the fleet's time, with a handoff of a minute.
func (f *fleet) begin(keys ...seal.KeyWrapper) idem.StoreState {
	f.t.Helper()
	st, err := idem.BeginSealing(context.Background(), f.store, openKeyring(f.t, f.store, keys...),
		idem.SealingChange{At: f.clock.Now(), Handoff: time.Minute})
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

// useInClear makes the fleet's store used, as a process without a key leaves it: its
// first call records that, and sealing no longer begins at once.
func (f *fleet) useInClear() {
	f.t.Helper()
	mw := f.process("first", false, nil)
	wantCode(f.t, serve(mw.Handler(&counter{}), req("POST", "/v1/first", "key-first-001", `{}`)), http.StatusCreated, "")
}

// keyedFingerprint reports whether the record of alice's key under scope holds a
// keyed fingerprint, and whether its body is sealed.
func recordForm(t *testing.T, st idemstore.Store, scope, key string, now time.Time) (keyedFp, sealedBody bool) {
	t.Helper()
	rec, err := st.RecordGet(context.Background(), &idemstore.GetParams{Scope: scope, Key: key, Now: now})
	if err != nil {
		t.Fatalf("the record of %s under %q: %v", key, scope, err)
	}
	return rec.Fingerprint.Keyed(), rec.Response != nil && seal.Sealed(rec.Response.Body)
}

func TestAProcessWithAKeyOnAStoreWhoseSealingHasNotBegunWritesInClearAndSaysSo(t *testing.T) {
	f := newFleet(t)
	f.useInClear()
	key := newSealKey(t, 1)
	mw := f.process("ready", true, nil, key)
	h := &cardHandler{}
	for _, k := range []string{"key-ready-001", "key-ready-002"} {
		wantCode(t, serve(mw.Handler(h), req("POST", "/v1/x", k, `{"a":1}`)), http.StatusCreated, "")
	}
	if keyed, sealed := recordForm(t, f.store, "alice", "key-ready-001", f.clock.Now()); keyed || sealed {
		t.Errorf("ready mode stored keyed fingerprint %v, sealed body %v; want the record in clear under the plain scope", keyed, sealed)
	}
	logs := f.logs["ready"].String()
	if strings.Count(logs, "ready mode") != 1 || !strings.Contains(logs, "idem keys seal --begin") {
		t.Errorf("want one WARN naming ready mode and what begins sealing; logs:\n%s", logs)
	}
	if st, err := idem.CheckSealing(context.Background(), f.store, nil, false); err != nil || st.Phase != idem.SealingNone {
		t.Errorf("CheckSealing without a key on a store whose sealing has not begun: %v, %v", st, err)
	}
}

func TestANewStoreSealsFromItsFirstRequestAndThenRefusesAProcessWithoutItsKey(t *testing.T) {
	f := newFleet(t)
	key := newSealKey(t, 1)
	mw := f.process("keyed", true, nil, key)
	wantCode(t, serve(mw.Handler(&cardHandler{}), req("POST", "/v1/x", "key-first-001", `{"a":1}`)), http.StatusCreated, "")
	ring := openKeyring(t, f.store, key)
	if keyed, sealed := recordForm(t, f.store, ring.Scope("alice"), "key-first-001", f.clock.Now()); !keyed || !sealed {
		t.Errorf("the first record of a new store: keyed fingerprint %v, sealed body %v; want both", keyed, sealed)
	}
	st, err := idem.CheckSealing(context.Background(), f.store, nil, false)
	if !errors.Is(err, idem.ErrStoreSealed) || !strings.Contains(err.Error(), key.ID()) || st.Phase != idem.SealingBegun {
		t.Errorf("CheckSealing without a key: %v, %v; want ErrStoreSealed naming %s", st, err, key.ID())
	}
	if _, err := idem.CheckSealing(context.Background(), f.store, nil, true); err != nil {
		t.Errorf("CheckSealing without a key, sealing being turned off: %v", err)
	}
}

func TestBeginSealingNeedsFormatLevel2AndIsMACdUnderTheStoresSecret(t *testing.T) {
	key := newSealKey(t, 1)
	ms := memory.New()
	dropState(t, ms) // as idem 0.2.0 left it: level 1
	ring := openKeyring(t, ms, key)
	if _, err := idem.BeginSealing(context.Background(), ms, ring, idem.SealingChange{}); err == nil || !strings.Contains(err.Error(), "--finalize") {
		t.Fatalf("BeginSealing at format level 1: %v; want it refused, naming idem migrate --finalize", err)
	}
	if _, err := idem.FinalizeUpgrade(context.Background(), ms, idem.FinalizeOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	st, err := idem.BeginSealing(context.Background(), ms, ring, idem.SealingChange{})
	if err != nil || st.Sealing.Phase != idem.SealingBegun || st.Sealing.MAC == "" {
		t.Fatalf("BeginSealing at level 2: %+v, %v", st, err)
	}
	// Moved by someone who can write the store but has no key: the begin a year
	// later. A process with the key refuses to serve the store rather than follow it.
	if _, err := idem.UpdateStoreState(context.Background(), ms, func(s *idem.StoreState) error {
		s.Sealing.At = s.Sealing.At.AddDate(1, 0, 0)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.CheckSealing(context.Background(), ms, ring, false); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("CheckSealing of a moved begin: %v; want it refused", err)
	}
	g := idem.NewGuard(idem.GuardConfig{Store: ms, Seal: ring, Logger: slog.New(slog.DiscardHandler)})
	runs := 0
	if _, _, err := idem.Do(context.Background(), g, idem.Call{Scope: "alice", Key: "k"}, func(context.Context) (int, error) { runs++; return 1, nil }); !errors.Is(err, idem.ErrStoreUnavailable) || runs != 0 {
		t.Errorf("a call on a store whose sealing state does not verify: %v after %d runs; want ErrStoreUnavailable, no run", err, runs)
	}
}

// gate is a handler that counts its executions and, while held, blocks each until
// released, telling entered when it is in.
type gate struct {
	n       atomic.Int64
	held    atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 8), release: make(chan struct{})} }

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.n.Add(1)
	if g.held.Load() {
		g.entered <- struct{}{}
		<-g.release
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"charged":true}`))
}

// Defect 2 (issue 46): switching sealing on re-executed a completed request, and a
// duplicate that arrived while the first was executing ran twice, records under two
// scopes. Here a process without the key holds a request in its handler (a charge at
// the processor) when sealing begins; the process with the key gets its duplicate
// after the handoff, under the keyed scope, and finds the first (409), then replays
// it once it completed. The process without the key stops claiming once it reads the
// begin. Ordered by a gate and the injected clock, not by sleeps.
func TestTheBeginOfSealingBetweenARequestAndItsDuplicateNeverSplitsIt(t *testing.T) {
	for _, keyScope := range []bool{false, true} {
		t.Run(map[bool]string{false: "scope as given", true: "keyed scope"}[keyScope], func(t *testing.T) {
			f := newFleet(t)
			f.useInClear()
			key := newSealKey(t, 1)
			keyless := f.process("keyless", keyScope, nil)
			keyed := f.process("keyed", keyScope, nil, key)
			g := newGate()
			body := `{"amount":100}`
			// A completed request before the begin, and one held in its handler.
			wantCode(t, serve(keyless.Handler(g), req("POST", "/v1/charges", "key-charge-done", body)), http.StatusCreated, "")
			g.held.Store(true)
			first := make(chan *httptest.ResponseRecorder)
			go func() { first <- serve(keyless.Handler(g), req("POST", "/v1/charges", "key-charge-held", body)) }()
			<-g.entered
			g.held.Store(false)

			f.clock.Advance(time.Second)
			st := f.begin(key)
			if keyedNow := serve(keyed.Handler(g), req("POST", "/v1/charges", "key-handoff-01", body)); keyedNow.Code != http.StatusCreated {
				t.Fatalf("a new request during the handoff: %d", keyedNow.Code)
			}
			if keyedFp, _ := recordForm(t, f.store, "alice", "key-handoff-01", f.clock.Now()); keyedFp {
				t.Error("a record made during the handoff is keyed; want it in clear until the handoff ends")
			}
			// The process without the key reads the begin within StoreStateRefresh.
			f.clock.Advance(idem.StoreStateRefresh)
			wantCode(t, serve(keyless.Handler(g), req("POST", "/v1/charges", "key-keyless-02", body)), http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
			if logs := f.logs["keyless"].String(); strings.Count(logs, "level=ERROR") != 1 || !strings.Contains(logs, key.ID()) {
				t.Errorf("the process without the key: want one ERROR naming %s; logs:\n%s", key.ID(), logs)
			}

			advanceTo(f.clock, st.Sealing.SealsFrom().Add(time.Second))
			wantCode(t, serve(keyed.Handler(g), req("POST", "/v1/charges", "key-charge-held", body)), http.StatusConflict, idem.CodeRequestInProgress)
			replay := serve(keyed.Handler(g), req("POST", "/v1/charges", "key-charge-done", body))
			wantCode(t, replay, http.StatusCreated, "")
			if replay.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("the request completed before the begin was not replayed: %v", replay.Header())
			}
			wantCode(t, serve(keyed.Handler(g), req("POST", "/v1/charges", "key-charge-done", `{"amount":200}`)), http.StatusConflict, idem.CodeKeyReused)

			close(g.release)
			wantCode(t, <-first, http.StatusCreated, "")
			again := serve(keyed.Handler(g), req("POST", "/v1/charges", "key-charge-held", body))
			if again.Code != http.StatusCreated || again.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("the duplicate once the first completed: %d %v", again.Code, again.Header())
			}
			wantCode(t, serve(keyed.Handler(g), req("POST", "/v1/charges", "key-sealed-001", body)), http.StatusCreated, "")
			scope := "alice"
			if keyScope {
				scope = openKeyring(t, f.store, key).Scope("alice")
			}
			if keyedFp, sealed := recordForm(t, f.store, scope, "key-sealed-001", f.clock.Now()); !keyedFp || !sealed {
				t.Errorf("a record made after the handoff: keyed %v, sealed %v; want both", keyedFp, sealed)
			}
			// done, held, handoff-01, sealed-001: one execution each.
			if n := g.n.Load(); n != 4 {
				t.Errorf("%d executions, want 4 (one per request)", n)
			}
		})
	}
}

// A process with the key meets a record in clear whose lease lapsed (its process
// died): it takes over that record, so that its record id, and the keys derived from
// it for outside calls, continue.
func TestARecordInClearWhoseHolderDiedIsTakenOverInItsForm(t *testing.T) {
	f := newFleet(t)
	f.useInClear()
	key := newSealKey(t, 1)
	ctx := context.Background()
	plain := idem.Call{Scope: "acct_1", Key: "charge-1", KeyScope: true, Fingerprint: idem.FingerprintInput("charge", []byte(`{"amount":100}`))}
	g0 := idem.NewGuard(idem.GuardConfig{Store: f.store, Clock: f.clock.Now, Logger: slog.New(slog.DiscardHandler)})
	h, _, err := g0.Begin(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	id := h.RecordID()
	st := f.begin(key) // the process dies holding the key (no release)
	advanceTo(f.clock, st.Sealing.SealsFrom().Add(idem.DefaultLease))
	g := idem.NewGuard(idem.GuardConfig{Store: f.store, Clock: f.clock.Now, Seal: openKeyring(t, f.store, key), Logger: slog.New(slog.DiscardHandler)})
	h2, replay, err := g.Begin(ctx, plain)
	if err != nil || replay != nil {
		t.Fatalf("the retry: %v, %v", replay, err)
	}
	if h2.RecordID() != id || h2.Scope() != "acct_1" || !h2.TookOver() {
		t.Errorf("the retry holds record %s under %q (took over %v); want the record in clear %s taken over", h2.RecordID(), h2.Scope(), h2.TookOver(), id)
	}
	h2.SetResponse(&idem.Response{Status: 201, Body: []byte(`{"charged":true}`)})
	if err := h2.Complete(); err != nil {
		t.Fatal(err)
	}
	if _, sealed := recordForm(t, f.store, "acct_1", "charge-1", f.clock.Now()); !sealed {
		t.Error("completed under sealing, the record in clear holds its response in clear")
	}
	if _, replay, err := g.Begin(ctx, plain); err != nil || replay == nil || string(replay.Body) != `{"charged":true}` {
		t.Errorf("a second retry: %v, %v; want the replay", replay, err)
	}
}

// forge replaces the record of (scope, key) by one in clear fingerprinted fp,
// created at created, living a week, and completed with body, as someone who can
// write the store would.
func forge(t *testing.T, st *countingStore, scope, key string, fp idem.Fingerprint, created time.Time, body string) {
	t.Helper()
	ctx := context.Background()
	ms := st.Store
	if err := ms.RecordDelete(ctx, &admin.RecordDeleteParams{Scope: scope, Key: key, Force: true}); err != nil && !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatal(err)
	}
	res, err := ms.RecordClaim(ctx, &idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: fp, Token: "forged", RecordID: "r1forged",
		Lease: time.Minute, TTL: 7 * 24 * time.Hour, Now: created})
	if err != nil || res.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("forging: %v, %v", res, err)
	}
	if err := ms.RecordComplete(ctx, &idemstore.CompleteParams{Scope: scope, Key: key, Token: "forged", TTL: 7 * 24 * time.Hour, Now: created,
		Response: &idem.Response{Status: 201, Body: []byte(body)}}); err != nil {
		t.Fatal(err)
	}
}

// Defect 7 (issue 46): a sealed record whose fingerprint version was set back to the
// plain one, with any body, was replayed as 201 Idempotent-Replayed, to another body
// too. A keyed fingerprint and a plain one never match now; a record in clear is
// honoured only within the transition window, when made before the handoff, and
// compared with the request's plain fingerprint exactly.
func TestARecordDowngradedInTheStoreIsNeverReplayed(t *testing.T) {
	body := `{"a":1}`
	plainFp := idem.FingerprintRequest(req("POST", "/v1/x", "", body), []byte(body))
	t.Run("sealed from the store's first request", func(t *testing.T) {
		f := newFleet(t)
		key := newSealKey(t, 1)
		mw := f.process("keyed", false, nil, key)
		h := &cardHandler{}
		wantCode(t, serve(mw.Handler(h), req("POST", "/v1/x", "key-downgrade", body)), http.StatusCreated, "")
		rec := rawRecord(t, f.store, "key-downgrade")
		// The keyed sum under the plain version, and the very plain fingerprint.
		for _, fp := range []idem.Fingerprint{{Version: 1, Sum: rec.Fingerprint.Sum}, plainFp} {
			forge(t, f.store, "alice", "key-downgrade", fp, rec.CreatedAt, `{"forged":true}`)
			for _, b := range []string{body, `{"a":2}`} {
				w := serve(mw.Handler(h), req("POST", "/v1/x", "key-downgrade", b))
				if w.Code == http.StatusCreated || strings.Contains(w.Body.String(), "forged") {
					t.Errorf("a downgraded record (fingerprint v%d) answered %d %q to %s", fp.Version, w.Code, w.Body, b)
				}
			}
		}
		if n := h.n.Load(); n != 1 {
			t.Errorf("%d executions, want 1", n)
		}
	})
	for _, c := range []struct {
		name     string
		keyScope bool
		after    time.Duration // after the handoff
	}{
		{"after the transition window", false, idem.DefaultTTL},
		{"in clear under a keyed scope", true, time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t)
			f.useInClear()
			key := newSealKey(t, 1)
			mw := f.process("keyed", c.keyScope, nil, key)
			st := f.begin(key)
			advanceTo(f.clock, st.Sealing.SealsFrom().Add(c.after))
			scope := "alice"
			if c.keyScope {
				scope = openKeyring(t, f.store, key).Scope("alice")
			}
			forge(t, f.store, scope, "key-downgrade", plainFp, st.Sealing.At.Add(-time.Hour), `{"forged":true}`)
			h := &cardHandler{}
			wantCode(t, serve(mw.Handler(h), req("POST", "/v1/x", "key-downgrade", body)), http.StatusInternalServerError, idem.CodeRecordUnreadable)
			if h.n.Load() != 0 {
				t.Error("executed")
			}
		})
	}
}

// Turning sealing off: after the end's handoff the processes with the key write in
// clear, and still find and replay the sealed records, under the keyed scope too.
func TestTheEndOfSealingKeepsReplayingSealedRecordsAndWritesInClear(t *testing.T) {
	for _, keyScope := range []bool{false, true} {
		t.Run(map[bool]string{false: "scope as given", true: "keyed scope"}[keyScope], func(t *testing.T) {
			f := newFleet(t)
			key := newSealKey(t, 1)
			mw := f.process("keyed", keyScope, nil, key)
			h := &cardHandler{}
			first := serve(mw.Handler(h), req("POST", "/v1/x", "key-sealed-01", `{"a":1}`))
			wantCode(t, first, http.StatusCreated, "")
			st, err := idem.EndSealing(context.Background(), f.store, openKeyring(t, f.store, key), idem.SealingChange{At: f.clock.Now(), Handoff: time.Minute})
			if err != nil || st.Sealing.Phase != idem.SealingEnded {
				t.Fatalf("EndSealing: %+v, %v", st, err)
			}
			advanceTo(f.clock, st.Sealing.ClearFrom().Add(time.Second))
			again := serve(mw.Handler(h), req("POST", "/v1/x", "key-sealed-01", `{"a":1}`))
			if again.Code != http.StatusCreated || again.Body.String() != first.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("a sealed record after the end: %d %q", again.Code, again.Body)
			}
			wantCode(t, serve(mw.Handler(h), req("POST", "/v1/x", "key-sealed-01", `{"a":2}`)), http.StatusConflict, idem.CodeKeyReused)
			wantCode(t, serve(mw.Handler(h), req("POST", "/v1/x", "key-clear-001", `{"a":1}`)), http.StatusCreated, "")
			if keyedFp, sealed := recordForm(t, f.store, "alice", "key-clear-001", f.clock.Now()); keyedFp || sealed {
				t.Errorf("a record after the end: keyed %v, sealed %v; want it in clear", keyedFp, sealed)
			}
			if n := h.n.Load(); n != 2 {
				t.Errorf("%d executions, want 2", n)
			}
			// Without a key, told that sealing is being turned off: it serves.
			off := f.process("off", keyScope, func(c *idem.Config) { c.SealingOff = true })
			wantCode(t, serve(off.Handler(h), req("POST", "/v1/x", "key-clear-001", `{"a":1}`)), http.StatusCreated, "")
			if !keyScope {
				wantCode(t, serve(off.Handler(h), req("POST", "/v1/x", "key-sealed-01", `{"a":1}`)), http.StatusInternalServerError, idem.CodeRecordUnreadable)
			}
			if n := h.n.Load(); n != 2 {
				t.Errorf("%d executions after the process without a key, want 2", n)
			}
		})
	}
}

// advanceTo moves c forward to t.
func advanceTo(c *testkit.Clock, t time.Time) { c.Advance(t.Sub(c.Now())) }

// The first call of a process whose guard has not read the store's state yet (ready,
// as far as it knows) learns on its claim that the records are sealed: its record is
// made in the sealed form, with the record id of that form (idemstore.RecordIDFor), so
// that its retry, which knows the state, makes the same id and so sends the same
// derived keys. (The id was derived from the form known before the state was read:
// a gateway that refused the first attempt refused the retry too, as a new request.)
func TestTheFirstCallOfAProcessDerivesItsRecordIDFromTheFormItWrites(t *testing.T) {
	f := newFleet(t)
	f.useInClear()
	key := newSealKey(t, 1)
	st := f.begin(key)
	advanceTo(f.clock, st.Sealing.SealsFrom().Add(time.Second))
	g := idem.NewGuard(idem.GuardConfig{Store: f.store, Clock: f.clock.Now, Seal: openKeyring(t, f.store, key), Logger: slog.New(slog.DiscardHandler)})
	call := idem.Call{Scope: "acct_1", Key: "charge-1", KeyScope: true, Fingerprint: idem.FingerprintInput("charge", []byte(`{"amount":100}`))}
	h, _, err := g.Begin(context.Background(), call)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Fingerprint().Keyed() || h.Scope() == "acct_1" {
		t.Fatalf("the first call claimed under %q with a keyed fingerprint %v; want the sealed form", h.Scope(), h.Fingerprint().Keyed())
	}
	if want := idemstore.RecordIDFor(h.Scope(), h.Key(), h.Fingerprint()); h.RecordID() != want {
		t.Errorf("record id %s, want %s: the id of the form it writes", h.RecordID(), want)
	}
	first := h.DerivedKey("charge")
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	h2, _, err := g.Begin(context.Background(), call)
	if err != nil {
		t.Fatal(err)
	}
	if h2.DerivedKey("charge") != first {
		t.Error("the retry after a release derives another key for the same request")
	}
}
