package payments

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testenv"
)

func TestCreateChargeAnswers201WithTheChargeObject(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		key := newKey()
		w := b.postCharge("tok_a", key, `{"amount": 2000, "currency": "USD", "customer_id": "cust_abc123"}`)
		wantStatus(t, w, http.StatusCreated)
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		c := decode(t, w)
		if id, _ := c["id"].(string); !strings.HasPrefix(id, "ch_") {
			t.Errorf("id %v, want ch_…", c["id"])
		}
		want := map[string]any{"object": "charge", "amount": 2000.0, "currency": "usd", "customer_id": "cust_abc123",
			"status": "succeeded", "idempotency_key": key}
		for k, v := range want {
			if c[k] != v {
				t.Errorf("%s = %v, want %v", k, c[k], v)
			}
		}
		if _, ok := c["created"].(float64); !ok {
			t.Errorf("created = %v, want a unix time", c["created"])
		}
	})
}

func TestCreateChargeWithoutCustomerRendersNull(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		w := b.postCharge("tok_a", newKey(), `{"amount": 1, "currency": "eur"}`)
		wantStatus(t, w, http.StatusCreated)
		if !bytes.Contains(w.Body.Bytes(), []byte(`"customer_id":null`)) {
			t.Fatalf("customer_id not null: %s", w.Body.String())
		}
	})
}

func TestReplayReturnsIdenticalBytes(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		key := newKey()
		first := b.postCharge("tok_a", key, `{"amount": 2000, "currency": "usd"}`)
		wantStatus(t, first, http.StatusCreated)
		// A retry that re-serialises the same parameters is the same request.
		again := b.postCharge("tok_a", key, `{"currency":"usd","amount":2000}`)
		wantStatus(t, again, http.StatusCreated)
		if !bytes.Equal(first.Body.Bytes(), again.Body.Bytes()) {
			t.Fatalf("replay differs:\n%s\n%s", first.Body, again.Body)
		}
		if again.Header().Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay lacks Idempotent-Replayed: true")
		}
		list := decode(t, b.do(req{method: "GET", path: "/v1/charges", token: "tok_a"}))
		if n := len(list["data"].([]any)); n != 1 {
			t.Fatalf("%d charges after a replay, want 1", n)
		}
	})
}

func TestCreateChargeRefusesABadBodyWith400WithoutBurningTheKey(t *testing.T) {
	cases := []struct {
		name, contentType, body, code, param string
	}{
		{"float amount", "", `{"amount": 20.5, "currency": "usd"}`, "parameter_invalid_integer", "amount"},
		{"exponent amount", "", `{"amount": 2e3, "currency": "usd"}`, "parameter_invalid_integer", "amount"},
		{"string amount in JSON", "", `{"amount": "2000", "currency": "usd"}`, "parameter_invalid_integer", "amount"},
		{"zero amount", "", `{"amount": 0, "currency": "usd"}`, "amount_too_small", "amount"},
		{"negative amount", "", `{"amount": -5, "currency": "usd"}`, "amount_too_small", "amount"},
		{"amount too large", "", `{"amount": 100000000, "currency": "usd"}`, "amount_too_large", "amount"},
		{"huge amount", "", `{"amount": 123456789012345678901234567890, "currency": "usd"}`, "amount_too_large", "amount"},
		{"missing amount", "", `{"currency": "usd"}`, "parameter_missing", "amount"},
		{"null amount", "", `{"amount": null, "currency": "usd"}`, "parameter_missing", "amount"},
		{"two-letter currency", "", `{"amount": 100, "currency": "us"}`, "parameter_invalid", "currency"},
		{"non-letter currency", "", `{"amount": 100, "currency": "u$d"}`, "parameter_invalid", "currency"},
		{"non-ASCII currency", "", `{"amount": 100, "currency": "usé"}`, "parameter_invalid", "currency"},
		{"number currency", "", `{"amount": 100, "currency": 840}`, "parameter_invalid_string", "currency"},
		{"missing currency", "", `{"amount": 100}`, "parameter_missing", "currency"},
		{"unknown parameter", "", `{"amount": 100, "currency": "usd", "capture": true}`, "parameter_unknown", "capture"},
		{"customer not a string", "", `{"amount": 100, "currency": "usd", "customer_id": 7}`, "parameter_invalid_string", "customer_id"},
		{"JSON array", "", `[1]`, "body_invalid", ""},
		{"malformed JSON", "", `{"amount": `, "body_invalid", ""},
		{"form decimal amount", "application/x-www-form-urlencoded", `amount=20.5&currency=usd`, "parameter_invalid_integer", "amount"},
		{"form repeated amount", "application/x-www-form-urlencoded", `amount=1&amount=2&currency=usd`, "parameter_invalid", "amount"},
		{"form unknown parameter", "application/x-www-form-urlencoded", `amount=1&currency=usd&foo=bar`, "parameter_unknown", "foo"},
	}
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				key := newKey()
				w := b.do(req{method: "POST", path: "/v1/charges", token: "tok_a", key: key, contentType: tc.contentType, body: tc.body})
				wantStatus(t, w, http.StatusBadRequest)
				e := apiErr(t, w)
				if e["type"] != "invalid_request_error" || e["code"] != tc.code || (tc.param != "" && e["param"] != tc.param) {
					t.Fatalf("error %v, want invalid_request_error %s param %q", e, tc.code, tc.param)
				}
				// The 400 released the key: the corrected request executes.
				wantStatus(t, b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`), http.StatusCreated)
			})
		}
	})
}

func TestCreateChargeTakesFormBodiesLikeJSON(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		w := b.do(req{method: "POST", path: "/v1/charges", token: "tok_a", key: newKey(),
			contentType: "application/x-www-form-urlencoded", body: "amount=2000&currency=USD&customer_id=cust_1"})
		wantStatus(t, w, http.StatusCreated)
		c := decode(t, w)
		if c["amount"] != 2000.0 || c["currency"] != "usd" || c["customer_id"] != "cust_1" {
			t.Fatalf("form charge %v", c)
		}
		// An empty form value leaves an optional parameter unset, as Stripe's does.
		w = b.do(req{method: "POST", path: "/v1/charges", token: "tok_a", key: newKey(),
			contentType: "application/x-www-form-urlencoded", body: "amount=5&currency=usd&customer_id="})
		wantStatus(t, w, http.StatusCreated)
		if decode(t, w)["customer_id"] != nil {
			t.Fatalf("empty customer_id not null: %s", w.Body)
		}
	})
}

func TestCreateChargeRefusesOtherMediaTypesWith415(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		w := b.do(req{method: "POST", path: "/v1/charges", token: "tok_a", key: newKey(), contentType: "text/plain", body: "amount=1"})
		wantStatus(t, w, http.StatusUnsupportedMediaType)
		if apiErr(t, w)["code"] != "unsupported_media_type" {
			t.Fatalf("body %s", w.Body)
		}
	})
}

func TestCreateChargeRequiresAKey(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		w := b.postCharge("tok_a", "", `{"amount": 100, "currency": "usd"}`)
		wantStatus(t, w, http.StatusBadRequest)
		if e := apiErr(t, w); e["type"] != "idempotency_error" || e["code"] != idem.CodeKeyRequired {
			t.Fatalf("error %v", e)
		}
	})
}

func TestRequestsWithoutABearerTokenAre401(t *testing.T) {
	b := sqliteBundle(t)
	for _, auth := range []string{"", "Basic dXNlcjpwdw==", "Bearer", "Bearer ", "Bearer two words"} {
		w := b.do(req{method: "POST", path: "/v1/charges", auth: auth, key: newKey(), body: `{"amount": 1, "currency": "usd"}`})
		wantStatus(t, w, http.StatusUnauthorized)
		if e := apiErr(t, w); e["type"] != "invalid_request_error" || e["code"] != "api_key_invalid" {
			t.Fatalf("Authorization %q: error %v", auth, e)
		}
	}
}

func TestChargesOfAnotherPrincipalAreInvisible(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		key := newKey()
		w := b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`)
		wantStatus(t, w, http.StatusCreated)
		id := decode(t, w)["id"].(string)

		wantStatus(t, b.do(req{method: "GET", path: "/v1/charges/" + id, token: "tok_a"}), http.StatusOK)
		wantStatus(t, b.do(req{method: "GET", path: "/v1/charges/" + id, token: "tok_b"}), http.StatusNotFound)
		list := decode(t, b.do(req{method: "GET", path: "/v1/charges", token: "tok_b"}))
		if n := len(list["data"].([]any)); n != 0 {
			t.Fatalf("principal b lists %d charges of a", n)
		}
		// The same key under another principal is another record: it executes.
		other := b.postCharge("tok_b", key, `{"amount": 100, "currency": "usd"}`)
		wantStatus(t, other, http.StatusCreated)
		if other.Header().Get("Idempotent-Replayed") != "" || decode(t, other)["id"] == id {
			t.Fatalf("principal b got a's charge: %s", other.Body)
		}
	})
}

// The store never sees a bearer token: a principal's records are scoped by the hex
// SHA-256 of its token (SPEC §3).
func TestRecordsAreScopedByTheHashOfTheBearerToken(t *testing.T) {
	t.Parallel()
	b := sqliteBundle(t)
	key := newKey()
	wantStatus(t, b.postCharge("tok_secret", key, `{"amount": 100, "currency": "usd"}`), http.StatusCreated)
	sum := sha256.Sum256([]byte("tok_secret"))
	ctx := testenv.Context(t)
	if _, err := b.store.RecordGet(ctx, &idemstore.GetParams{Scope: hex.EncodeToString(sum[:]), Key: key}); err != nil {
		t.Fatalf("no record under the token's hash: %v", err)
	}
	if _, err := b.store.RecordGet(ctx, &idemstore.GetParams{Scope: "tok_secret", Key: key}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("a record under the raw token: %v", err)
	}
}

func TestGetChargeAnswers404ForAnUnknownID(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		w := newBundle().do(req{method: "GET", path: "/v1/charges/ch_nope", token: "tok_a"})
		wantStatus(t, w, http.StatusNotFound)
		if apiErr(t, w)["code"] != "resource_missing" {
			t.Fatalf("body %s", w.Body)
		}
	})
}

func TestListChargesPaginatesNewestFirst(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		var ids []string
		for i := range 5 {
			w := b.postCharge("tok_a", newKey(), fmt.Sprintf(`{"amount": %d, "currency": "usd"}`, i+1))
			wantStatus(t, w, http.StatusCreated)
			ids = append([]string{decode(t, w)["id"].(string)}, ids...) // newest first
		}
		var got []string
		after := ""
		for page := 0; ; page++ {
			path := "/v1/charges?limit=2"
			if after != "" {
				path += "&starting_after=" + after
			}
			w := b.do(req{method: "GET", path: path, token: "tok_a"})
			wantStatus(t, w, http.StatusOK)
			l := decode(t, w)
			if l["object"] != "list" || l["url"] != "/v1/charges" {
				t.Fatalf("list %v", l)
			}
			data := l["data"].([]any)
			for _, c := range data {
				got = append(got, c.(map[string]any)["id"].(string))
			}
			if l["has_more"] != (page < 2) {
				t.Fatalf("page %d has_more = %v", page, l["has_more"])
			}
			if l["has_more"] == false {
				break
			}
			after = got[len(got)-1]
		}
		if strings.Join(got, ",") != strings.Join(ids, ",") {
			t.Fatalf("pages list\n%v\nwant\n%v", got, ids)
		}
		all := decode(t, b.do(req{method: "GET", path: "/v1/charges", token: "tok_a"}))
		if len(all["data"].([]any)) != 5 || all["has_more"] != false {
			t.Fatalf("default limit lists %v", all)
		}
	})
}

func TestListChargesRefusesABadLimitOrCursor(t *testing.T) {
	b := sqliteBundle(t)
	for _, q := range []string{"limit=0", "limit=1001", "limit=abc", "limit=-1", "limit=1.5", "starting_after=ch_unknown"} {
		w := b.do(req{method: "GET", path: "/v1/charges?" + q, token: "tok_a"})
		wantStatus(t, w, http.StatusBadRequest)
		if apiErr(t, w)["param"] == nil {
			t.Fatalf("%s: error names no param: %s", q, w.Body)
		}
	}
	wantStatus(t, b.do(req{method: "GET", path: "/v1/charges?limit=1000", token: "tok_a"}), http.StatusOK)
}

func TestChargeKeyReusedWithOtherParametersIsRefused(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle(withProfile(idem.ProfileIETF))
		key := newKey()
		wantStatus(t, b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`), http.StatusCreated)
		w := b.postCharge("tok_a", key, `{"amount": 200, "currency": "usd"}`)
		wantStatus(t, w, http.StatusUnprocessableEntity)
		if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Fatalf("Content-Type %q", ct)
		}
	})
}

// A record can vanish while the charge stays (it expired and was cleaned, or a store
// without §7 transactions lost it): the UNIQUE (scope, idempotency_key) backstop then
// answers the same request with the same charge and another with key_reused.
func TestChargeBackstopWhenTheRecordIsGone(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		key := newKey()
		first := b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`)
		wantStatus(t, first, http.StatusCreated)
		b.exec("DELETE FROM idem_records")

		again := b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`)
		wantStatus(t, again, http.StatusCreated)
		if !bytes.Equal(first.Body.Bytes(), again.Body.Bytes()) {
			t.Fatalf("re-rendered charge differs:\n%s\n%s", first.Body, again.Body)
		}
		b.exec("DELETE FROM idem_records")
		w := b.postCharge("tok_a", key, `{"amount": 999, "currency": "usd"}`)
		wantStatus(t, w, http.StatusConflict)
		if apiErr(t, w)["code"] != idem.CodeKeyReused {
			t.Fatalf("body %s", w.Body)
		}
		list := decode(t, b.do(req{method: "GET", path: "/v1/charges", token: "tok_a"}))
		if n := len(list["data"].([]any)); n != 1 {
			t.Fatalf("%d charges, want 1", n)
		}
	})
}

func TestDisabledIdempotencyServesWithoutKeys(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle(withoutIdempotency())
		w := b.postCharge("tok_a", "", `{"amount": 100, "currency": "usd"}`)
		wantStatus(t, w, http.StatusCreated)
		if decode(t, w)["idempotency_key"] != nil {
			t.Fatalf("idempotency_key not null: %s", w.Body)
		}
		// A key is ignored: the same request executes twice.
		key := newKey()
		wantStatus(t, b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`), http.StatusCreated)
		wantStatus(t, b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`), http.StatusCreated)
		list := decode(t, b.do(req{method: "GET", path: "/v1/charges", token: "tok_a"}))
		if n := len(list["data"].([]any)); n != 3 {
			t.Fatalf("%d charges, want 3", n)
		}
	})
}

// After the TTL a key starts a new operation (SPEC §8), even when the charge it wrote
// is still there: the old charge's key is retired, not replayed.
func TestExpiredKeyStartsANewCharge(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		clock := newSkippableClock()
		b := newBundle(withClock(clock.now))
		key := newKey()
		first := b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`)
		wantStatus(t, first, http.StatusCreated)
		b.exec("DELETE FROM idem_records") // the record expired and was cleaned
		clock.advance(idem.DefaultTTL)

		again := b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`)
		wantStatus(t, again, http.StatusCreated)
		if decode(t, again)["id"] == decode(t, first)["id"] {
			t.Fatalf("the expired key was replayed: %s", again.Body)
		}
		// The old charge renders as before, key included.
		old := b.do(req{method: "GET", path: "/v1/charges/" + decode(t, first)["id"].(string), token: "tok_a"})
		if !bytes.Equal(old.Body.Bytes(), first.Body.Bytes()) {
			t.Fatalf("the old charge renders\n%s\nwas\n%s", old.Body, first.Body)
		}
		// The new charge now answers for the key.
		b.exec("DELETE FROM idem_records")
		third := b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`)
		if !bytes.Equal(third.Body.Bytes(), again.Body.Bytes()) {
			t.Fatalf("backstop answers\n%s\nwant\n%s", third.Body, again.Body)
		}
	})
}

// SPEC §7: the charge and the record's completion commit together. When the key is
// taken over while the charge is at the card processor, the fenced completion finds
// another token, the charge rolls back, and the client gets 503 store_unavailable
// instead of a 201 for a charge that does not exist.
func TestChargeRollsBackWhenTheKeyIsTakenOverMidRequest(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		tokenColumn := "token"
		if b.db.dialect == dialectPostgres {
			tokenColumn = "lock_token"
		}
		b.srv.beforeCharge = func(*http.Request) {
			// Another process took the key over after our lease lapsed.
			b.exec("UPDATE idem_records SET " + tokenColumn + " = 'stolen-token'")
		}
		w := b.postCharge("tok_a", newKey(), `{"amount": 100, "currency": "usd"}`)
		wantStatus(t, w, http.StatusServiceUnavailable)
		if e := apiErr(t, w); e["code"] != idem.CodeStoreUnavailable {
			t.Fatalf("error %v", e)
		}
		b.srv.beforeCharge = nil
		list := decode(t, b.do(req{method: "GET", path: "/v1/charges", token: "tok_a"}))
		if n := len(list["data"].([]any)); n != 0 {
			t.Fatalf("%d charges committed without their completion, want 0", n)
		}
	})
}
