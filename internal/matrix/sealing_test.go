package matrix

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/seal"
)

// The sealing transitions (SPEC §20, issue 46): on each store, a process without a key
// and one with a key (its scope keyed by the core, as idem proxy's and idem payments'
// are) share the store and a clock, and the cells walk the store's sealing state
// through its stages (SealingCells): ready, the begin's handoff, sealed, a record made
// in clear before the begin replayed exactly, a record downgraded in the store
// refused, a process without the key after the begin refused.
func TestSealingTransitions(t *testing.T) {
	t.Parallel()
	for _, s := range SealingStores {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			runSealingCells(t, s)
		})
	}
}

// sealingFleet is the cells' two processes on one store.
type sealingFleet struct {
	t       *testing.T
	e       *env
	clock   *testkit.Clock
	clients map[string]*http.Client
	urls    map[string]string
	logs    map[string]*lockedBuffer
	runs    sync.Map // key → *int, executions by key
	ring    *seal.Keyring
}

func (f *sealingFleet) handler(w http.ResponseWriter, r *http.Request) {
	n, _ := f.runs.LoadOrStore(r.Header.Get("Idempotency-Key"), new(int))
	*(n.(*int))++
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"ch_%s","card":"4242424242424242"}`, r.Header.Get("Idempotency-Key"))
}

func (f *sealingFleet) ran(key string) int {
	n, ok := f.runs.Load(key)
	if !ok {
		return 0
	}
	return *(n.(*int))
}

// process starts a process named name: with the matrix's key when keyed, its scope
// keyed by the core when keyScope.
func (f *sealingFleet) process(name string, keyed, keyScope bool) *httptest.Server {
	cfg := idem.Config{Store: f.e.store, Scope: scope, KeyScope: keyScope, Clock: f.clock.Now, Lease: time.Hour}
	if keyed {
		cfg.Seal = openKeyring(f.t, f.e.store)
		f.ring = cfg.Seal
	}
	f.logs[name] = &lockedBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(f.logs[name], nil))
	srv := serve(f.t, idem.New(cfg).Handler(http.HandlerFunc(f.handler)))
	f.urls[name], f.clients[name] = srv.URL, srv.Client()
	return srv
}

func (f *sealingFleet) post(name, key string, opts ...reqOption) answer {
	return post(f.t, f.clients[name], f.urls[name], key, opts...)
}

// form reads the record of key under the scope in its plain form, or keyed under the
// keyring, and reports whether its fingerprint is keyed and its body sealed.
func (f *sealingFleet) form(key string, keyedScope bool) (keyedFp, sealed bool) {
	f.t.Helper()
	sc := "Bearer sk_test_matrix"
	if keyedScope {
		sc = f.ring.Scope(sc)
	}
	rec, err := f.e.store.RecordGet(f.t.Context(), &idemstore.GetParams{Scope: sc, Key: key, Now: f.clock.Now()})
	if err != nil {
		f.t.Fatalf("the record of %s (keyed scope %v): %v", key, keyedScope, err)
	}
	return rec.Fingerprint.Keyed(), rec.Response != nil && seal.Sealed(rec.Response.Body)
}

func runSealingCells(t *testing.T, s Store) {
	f := &sealingFleet{t: t, e: openEnv(t, s), clock: testkit.NewClock(time.Now()), urls: map[string]string{},
		clients: map[string]*http.Client{}, logs: map[string]*lockedBuffer{}}
	f.process("keyless", false, true)
	want := func(what string, a answer, status int, code string, replayed bool) {
		t.Helper()
		if a.status != status || a.code != code || a.replayed != replayed {
			t.Fatalf("%s: %v (code %q); want %d %q, replayed %v", what, a, a.code, status, code, replayed)
		}
	}
	// A store used in clear, by a process without a key.
	want("before any key", f.post("keyless", "key-before-begin"), http.StatusCreated, "", false)

	// Ready: a process with a key on a store whose sealing has not begun writes in
	// clear, under the plain scope, and says so.
	f.process("keyed", true, true)
	// And one whose scope is not keyed, whose route reads each key first (it saw
	// retries): a record of the other form is then judged on that read.
	warmUp(t, f.process("reading", true, false))
	want("ready", f.post("keyed", "key-ready"), http.StatusCreated, "", false)
	if keyedFp, sealed := f.form("key-ready", false); keyedFp || sealed {
		t.Fatalf("ready: the record is keyed %v, sealed %v; want it in clear", keyedFp, sealed)
	}
	want("ready, replayed by the process without a key", f.post("keyless", "key-ready"), http.StatusCreated, "", true)
	if !strings.Contains(f.logs["keyed"].String(), "ready mode") {
		t.Fatalf("ready: no WARN says so:\n%s", f.logs["keyed"])
	}

	// Begun: during the handoff the process with a key still writes in clear. (A
	// store this release did not create is at format level 1: finalized first.)
	if _, err := idem.FinalizeUpgrade(t.Context(), f.e.store, idem.FinalizeOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	st, err := idem.BeginSealing(t.Context(), f.e.store, f.ring, idem.SealingChange{At: f.clock.Now(), Handoff: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(idem.StoreStateRefresh)
	want("the handoff", f.post("keyed", "key-handoff"), http.StatusCreated, "", false)
	if keyedFp, sealed := f.form("key-handoff", false); keyedFp || sealed {
		t.Fatalf("the handoff: the record is keyed %v, sealed %v; want it in clear until the handoff ends", keyedFp, sealed)
	}
	// The process without a key read the begin: it claims nothing more.
	want("without a key after the begin", f.post("keyless", "key-keyless-after"), http.StatusServiceUnavailable, idem.CodeStoreUnavailable, false)
	if f.ran("key-keyless-after") != 0 || !strings.Contains(f.logs["keyless"].String(), "level=ERROR") {
		t.Fatalf("without a key after the begin: ran %d times; logs:\n%s", f.ran("key-keyless-after"), f.logs["keyless"])
	}

	// Sealed, after the handoff: new records sealed under the keyed scope; those made
	// in clear before replayed, compared exactly with the request's fingerprint.
	f.clock.Advance(st.Sealing.SealsFrom().Sub(f.clock.Now()) + time.Second)
	want("sealed", f.post("keyed", "key-sealed"), http.StatusCreated, "", false)
	if keyedFp, sealed := f.form("key-sealed", true); !keyedFp || !sealed {
		t.Fatalf("sealed: the record is keyed %v, sealed %v; want both, under the keyed scope", keyedFp, sealed)
	}
	for _, k := range []string{"key-before-begin", "key-ready", "key-handoff"} {
		for _, p := range []string{"keyed", "reading"} {
			want("a record in clear made before, under sealing ("+p+")", f.post(p, k), http.StatusCreated, "", true)
			want("a record in clear made before, another body ("+p+")", f.post(p, k, withBody(`{"amount":1}`)), http.StatusConflict, idem.CodeKeyReused, false)
		}
		if n := f.ran(k); n != 1 {
			t.Fatalf("%s ran %d times, want 1", k, n)
		}
	}

	// Downgraded: the sealed record rewritten in clear, under its plain fingerprint,
	// by someone who can write the store: refused, never run again.
	downgrade(t, f.e.store, f.ring.Scope("Bearer sk_test_matrix"), "key-sealed", f.clock.Now())
	a := f.post("keyed", "key-sealed")
	want("a downgraded record", a, http.StatusInternalServerError, idem.CodeRecordUnreadable, false)
	if strings.Contains(a.body, "forged") || f.ran("key-sealed") != 1 {
		t.Fatalf("a downgraded record: %v after %d runs", a, f.ran("key-sealed"))
	}
}

// downgrade replaces the record of (sc, key) by one in clear under the request's plain
// fingerprint, as someone who can write the store (but has no key) would.
func downgrade(t *testing.T, st idemstore.Store, sc, key string, now time.Time) {
	t.Helper()
	ctx := t.Context()
	as, ok := st.(admin.Store)
	if !ok {
		t.Fatalf("the store %T has no admin interface", st)
	}
	rec, err := st.RecordGet(ctx, &idemstore.GetParams{Scope: sc, Key: key, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if err := as.RecordDelete(ctx, &admin.RecordDeleteParams{Scope: sc, Key: key, Force: true}); err != nil && !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "/v1/charges", nil)
	req.Header.Set("Content-Type", "application/json")
	fp := idem.FingerprintRequest(req, []byte(chargeBody))
	res, err := st.RecordClaim(ctx, &idemstore.ClaimParams{Scope: sc, Key: key, Fingerprint: fp, Token: "forged", RecordID: rec.ID,
		Lease: time.Minute, TTL: 24 * time.Hour, Now: rec.CreatedAt})
	if err != nil || res.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("forging: %v, %v", res, err)
	}
	if err := st.RecordComplete(ctx, &idemstore.CompleteParams{Scope: sc, Key: key, Token: "forged", TTL: 24 * time.Hour, Now: rec.CreatedAt,
		Response: &idemstore.Response{Status: 201, Body: []byte(`{"forged":true}`)}}); err != nil {
		t.Fatal(err)
	}
}
