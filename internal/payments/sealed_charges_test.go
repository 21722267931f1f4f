package payments

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/seal/cloudkeys"
)

// withSeal seals the bundle's records under a local key (SPEC §19): on a store no call
// used yet, sealing begins with the first claim.
func withSeal(t testing.TB) option {
	return func(c *Config) {
		ctx := testenv.Context(t)
		key, err := cloudkeys.Open(ctx, "base64key://AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = key.Close() })
		if c.Seal, err = idem.OpenKeyring(ctx, c.Store, key); err != nil {
			t.Fatal(err)
		}
	}
}

// lossyProcessor stands between the API and the card processor p: while lose is set,
// the processor charges and its reply is lost on the way back (503), as when the
// process that called it crashed after the call.
func lossyProcessor(t *testing.T, p *cardProcessor) (url string, lose *atomic.Bool) {
	t.Helper()
	lose = new(atomic.Bool)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, err := http.NewRequestWithContext(r.Context(), r.Method, p.url+r.URL.Path, r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		out.Header = r.Header.Clone()
		res, err := http.DefaultClient.Do(out)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		if lose.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		for k, v := range res.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(res.StatusCode)
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, lose
}

// chargeRow returns what the charges table keeps of charge id: its scope and its
// request fingerprint.
func (b *bundle) chargeRow(id string) (scope, fingerprint string) {
	b.t.Helper()
	const q = "SELECT scope, request_fingerprint FROM charges WHERE id = "
	var err error
	if b.db.dialect == dialectPostgres {
		err = b.db.pool.QueryRow(testenv.Context(b.t), q+"$1", id).Scan(&scope, &fingerprint)
	} else {
		err = b.db.sqlDB.QueryRowContext(testenv.Context(b.t), q+"?1", id).Scan(&scope, &fingerprint)
	}
	if err != nil {
		b.t.Fatalf("reading charge %s: %v", id, err)
	}
	return scope, fingerprint
}

// charges lists token's charges through the API.
func (b *bundle) charges(token string) []chargeJSON {
	b.t.Helper()
	w := b.do(req{method: "GET", path: "/v1/charges", token: token})
	if w.Code != http.StatusOK {
		b.t.Fatalf("GET /v1/charges: %d %s", w.Code, w.Body)
	}
	var l listJSON
	if err := json.Unmarshal(w.Body.Bytes(), &l); err != nil {
		b.t.Fatal(err)
	}
	return l.Data
}

// The completer settles every charge whose processor reply was lost, sealed or not:
// its settle step finds the charge whatever scope the record has. (Before, sealed,
// the settle looked the charge up under the record's keyed scope while the charges
// table kept the plain one: "no rows", the charge stayed pending, and the processor
// was called again at every pass.) Sealed, the charges table keeps the record's keyed
// scope and fingerprint, not the token's SHA-256 and the plain fingerprint.
func TestTheCompleterSettlesEveryChargeWhoseProcessorReplyWasLostSealedOrNot(t *testing.T) {
	for _, mode := range []string{"clear", "sealed"} {
		t.Run(mode, func(t *testing.T) {
			eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
				p := newCardProcessor(t)
				url, lose := lossyProcessor(t, p)
				opts := []option{withProcessor(url)}
				if mode == "sealed" {
					opts = append(opts, withSeal(t))
				}
				b := newBundle(opts...)
				lose.Store(true)
				const n = 3
				for range n {
					wantStatus(t, b.postCharge("tok_a", newKey(), `{"amount": 700, "currency": "usd"}`), http.StatusServiceUnavailable)
				}
				if got := len(p.charges(t)); got != n {
					t.Fatalf("the processor holds %d charges, want %d", got, n)
				}
				lose.Store(false)
				pass := idem.NewCompleter(b.srv.Guard(), idem.CompleterConfig{Logger: quietLogger()}).Pass(testenv.Context(t))
				if pass.Resumed != n || pass.Failed != 0 || pass.Err != nil {
					t.Fatalf("completer pass %+v, want %d records resumed", pass, n)
				}
				charges := b.charges("tok_a")
				if len(charges) != n || len(p.charges(t)) != n {
					t.Fatalf("%d charges and %d at the processor, want %d each", len(charges), len(p.charges(t)), n)
				}
				for _, c := range charges {
					if c.Status != statusSucceeded || c.ProcessorChargeID == nil {
						t.Fatalf("charge %+v, want succeeded with the processor's charge", c)
					}
					sc, fp := b.chargeRow(c.ID)
					plain := sc == ScopeOfToken("tok_a")
					if wantPlain := mode == "clear"; plain != wantPlain {
						t.Fatalf("charge %s has scope %s, want the plain one: %v", c.ID, sc, wantPlain)
					}
					keyed := false
					if f, ok := parseFingerprint(fp); ok {
						keyed = f.Keyed()
					}
					if keyed == plain {
						t.Fatalf("charge %s has fingerprint %s under scope %s: want it keyed exactly when the scope is", c.ID, fp, sc)
					}
				}
			})
		})
	}
}

// Sealing turned on for a running API keeps its charges: those made before are listed
// and read beside the new ones, and a retry of one made before replays it (its record
// is under the plain scope), charging once.
func TestChargesMadeBeforeSealingBeganAreFoundAfter(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		p := newCardProcessor(t)
		// The API before sealing keeps a cache of the store's state of its own (its
		// clock is injected), so that the sealed one reads the begin at once.
		clear := newBundle(withProcessor(p.url), func(c *Config) {
			c.Middleware = idem.New(idem.Config{Store: c.Store, Scope: scopeOf, KeyScope: true, Clock: time.Now, Logger: c.Logger})
		})
		body := `{"amount": 500, "currency": "usd"}`
		oldKey := newKey()
		old := clear.postCharge("tok_a", oldKey, body)
		wantStatus(t, old, http.StatusCreated)
		oldID := decode(t, old)["id"].(string)

		// The same store and database, sealing begun with no handoff (no other process).
		cfg := clear.srv.cfg
		cfg.Middleware = nil
		withSeal(t)(&cfg)
		if _, err := idem.BeginSealing(testenv.Context(t), cfg.Store, cfg.Seal, idem.SealingChange{Handoff: time.Nanosecond}); err != nil {
			t.Fatal(err)
		}
		sealed := &bundle{t: t, store: clear.store, db: clear.db}
		sealed.srv = New(cfg)
		sealed.handler = sealed.srv.Handler()

		retry := sealed.postCharge("tok_a", oldKey, body)
		wantStatus(t, retry, http.StatusCreated)
		if retry.Body.String() != old.Body.String() || retry.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the retry after sealing began: %s, want the replay of %s", retry.Body, old.Body)
		}
		fresh := sealed.postCharge("tok_a", newKey(), body)
		wantStatus(t, fresh, http.StatusCreated)
		freshID := decode(t, fresh)["id"].(string)
		if sc, _ := sealed.chargeRow(freshID); sc == ScopeOfToken("tok_a") {
			t.Fatalf("a charge made sealed has the plain scope")
		}
		list := sealed.charges("tok_a")
		if len(list) != 2 || list[0].ID != freshID || list[1].ID != oldID {
			t.Fatalf("charges %+v, want %s then %s", list, freshID, oldID)
		}
		for _, id := range []string{oldID, freshID} {
			wantStatus(t, sealed.do(req{method: "GET", path: "/v1/charges/" + id, token: "tok_a"}), http.StatusOK)
			wantStatus(t, sealed.do(req{method: "GET", path: "/v1/charges/" + id, token: "tok_b"}), http.StatusNotFound)
		}
		after := sealed.do(req{method: "GET", path: "/v1/charges?limit=1&starting_after=" + freshID, token: "tok_a"})
		var l listJSON
		_ = json.Unmarshal(after.Body.Bytes(), &l)
		if len(l.Data) != 1 || l.Data[0].ID != oldID || !strings.Contains(after.Body.String(), `"has_more":false`) {
			t.Fatalf("the page after %s: %s, want %s alone", freshID, after.Body, oldID)
		}
		// The record made before is lost (an operator deleted it): the key's charge,
		// under the plain scope, still answers the key's sealed requests.
		err := sealed.store.(admin.Store).RecordDelete(testenv.Context(t), &admin.RecordDeleteParams{Scope: ScopeOfToken("tok_a"), Key: oldKey})
		if err != nil {
			t.Fatal(err)
		}
		if again := sealed.postCharge("tok_a", oldKey, body); again.Code != http.StatusCreated || decode(t, again)["id"] != oldID {
			t.Fatalf("the request after its record was lost: %d %s, want the charge %s", again.Code, again.Body, oldID)
		}
		other := sealed.postCharge("tok_a", oldKey, `{"amount": 501, "currency": "usd"}`)
		if apiErr(t, other)["code"] != idem.CodeKeyReused {
			t.Fatalf("another request under the key: %d %s, want key_reused", other.Code, other.Body)
		}
		if n := len(p.charges(t)); n != 2 {
			t.Fatalf("the processor holds %d charges, want 2", n)
		}
		if n := sealed.count("charges"); n != 2 {
			t.Fatalf("payments holds %d charges, want 2", n)
		}
	})
}

// Sealed, a charge without a processor (on PostgreSQL the read-then-write transaction
// instead of the pipelined insert, which cannot look under the other scope) is kept
// under the keyed scope, replayed, and read back.
func TestASealedChargeWithoutAProcessorIsKeptKeyedAndReplayed(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle(withSeal(t))
		key, body := newKey(), `{"amount": 300, "currency": "usd"}`
		w := b.postCharge("tok_a", key, body)
		wantStatus(t, w, http.StatusCreated)
		id := decode(t, w)["id"].(string)
		if again := b.postCharge("tok_a", key, body); again.Body.String() != w.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the retry: %s, want the replay of %s", again.Body, w.Body)
		}
		if other := b.postCharge("tok_a", key, `{"amount": 301, "currency": "usd"}`); apiErr(t, other)["code"] != idem.CodeKeyReused {
			t.Fatalf("another body under the key: %s, want key_reused", other.Body)
		}
		if sc, _ := b.chargeRow(id); sc == ScopeOfToken("tok_a") {
			t.Fatal("the sealed charge is kept under the plain scope")
		}
		if get := b.do(req{method: "GET", path: "/v1/charges/" + id, token: "tok_a"}); get.Code != http.StatusOK || len(b.charges("tok_a")) != 1 {
			t.Fatalf("GET the sealed charge: %d %s", get.Code, get.Body)
		}
	})
}
