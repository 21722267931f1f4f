package e2e

import (
	"bytes"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// setup starts a payments server over a fresh SQLite store with extra flags, and a client.
func setup(t *testing.T, flags ...string) (*server, *client) {
	t.Helper()
	s := startServer(t, append([]string{"--store", sqliteStore(t)}, flags...)...)
	return s, newClient()
}

func TestReplayReturnsSameStatusBodyAndContentType(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	key := newKey()
	first := c.postCharge(t, s.URL(), key, chargeJSON(2000))
	want201(t, "first POST", first)
	if first.replayed() {
		t.Fatalf("first POST carries Idempotent-Replayed: %s", first)
	}
	if got := first.object(t)["idempotency_key"]; got != key {
		t.Fatalf("charge idempotency_key = %v, want %q", got, key)
	}
	if got := first.Header.Get("Idempotency-Key"); got != key {
		t.Fatalf("first POST: Idempotency-Key header = %q, want %q", got, key)
	}

	replay := c.postCharge(t, s.URL(), key, chargeJSON(2000))
	wantReplayOf(t, "replay", first, replay, key)
	if n := len(c.listCharges(t, s.URL())); n != 1 {
		t.Fatalf("after a replay the principal has %d charges, want 1", n)
	}
}

// wantReplayOf fails unless replay repeats first: same status, body bytes and
// Content-Type, with Idempotent-Replayed: true and the echoed key.
func wantReplayOf(t testing.TB, what string, first, replay *response, key string) {
	t.Helper()
	if replay.Status != first.Status {
		t.Fatalf("%s: status %d, want %d (%s)", what, replay.Status, first.Status, replay)
	}
	if !bytes.Equal(replay.Body, first.Body) {
		t.Fatalf("%s: body differs:\n got %s\nwant %s", what, replay.Body, first.Body)
	}
	if got, want := replay.Header.Get("Content-Type"), first.Header.Get("Content-Type"); got != want {
		t.Fatalf("%s: Content-Type %q, want %q", what, got, want)
	}
	if !replay.replayed() {
		t.Fatalf("%s: want Idempotent-Replayed: true, got %s", what, replay)
	}
	if got := replay.Header.Get("Idempotency-Key"); got != key {
		t.Fatalf("%s: Idempotency-Key header = %q, want %q", what, got, key)
	}
}

func TestReplayMatchesJSONReserialisedInAnotherOrder(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	key := newKey()
	first := c.postCharge(t, s.URL(), key, []byte(`{"amount":2000,"currency":"usd","customer_id":"cust_abc123"}`))
	want201(t, "first POST", first)
	reordered := []byte("{\n  \"customer_id\" : \"cust_abc123\",\n\t\"currency\":\"usd\",  \"amount\":2000\n}\n")
	replay := c.postCharge(t, s.URL(), key, reordered)
	wantReplayOf(t, "re-serialised JSON", first, replay, key)
}

func TestReplayMatchesFormParametersInAnotherOrder(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	key := newKey()
	post := func(body []byte) *response {
		return c.do(t, s.URL(), request{method: "POST", path: "/v1/charges", key: key, contentType: contentForm, body: body})
	}
	first := post(formBody("amount", "2000", "currency", "usd", "customer_id", "cust_abc123"))
	want201(t, "first form POST", first)
	if got := first.object(t)["amount"]; got != float64(2000) {
		t.Fatalf("form-encoded charge amount = %v, want 2000: %s", got, first.Body)
	}
	replay := post(formBody("customer_id", "cust_abc123", "currency", "usd", "amount", "2000"))
	wantReplayOf(t, "reordered form", first, replay, key)
}

func TestMismatchIs409KeyReusedUnderSeedProfile(t *testing.T) {
	t.Parallel()
	s, c := setup(t, "--profile", "seed")
	key := newKey()
	want201(t, "first POST", c.postCharge(t, s.URL(), key, chargeJSON(2000)))

	res := c.postCharge(t, s.URL(), key, chargeJSON(2001))
	wantSeedError(t, "same key, other amount", res, http.StatusConflict, "key_reused", key)

	res = c.do(t, s.URL(), request{method: "POST", path: "/v1/orders", key: key, contentType: contentJSON, body: orderJSON("widget", 1)})
	wantSeedError(t, "charge key reused on /v1/orders", res, http.StatusConflict, "key_reused", key)

	if n := len(c.listCharges(t, s.URL())); n != 1 {
		t.Fatalf("after mismatches the principal has %d charges, want 1", n)
	}
}

// wantSeedError fails unless res is a Stripe-shaped error with status and code.
func wantSeedError(t testing.TB, what string, res *response, status int, code, key string) {
	t.Helper()
	wantError(t, what, res, status, code)
	body := res.object(t)
	e, _ := body["error"].(map[string]any)
	if e == nil || e["type"] != "idempotency_error" || e["message"] == "" || e["message"] == nil {
		t.Fatalf("%s: want {\"error\": {\"type\": \"idempotency_error\", \"code\", \"message\"}}, got %s", what, res.Body)
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s: Content-Type %q, want application/json", what, ct)
	}
	if got := res.Header.Get("Idempotency-Key"); got != key {
		t.Fatalf("%s: Idempotency-Key header = %q, want %q", what, got, key)
	}
}

func TestMismatchIs422ProblemJSONUnderIETFProfile(t *testing.T) {
	t.Parallel()
	s, c := setup(t, "--profile", "ietf")
	key := newKey()
	want201(t, "first POST", c.postCharge(t, s.URL(), key, chargeJSON(2000)))

	res := c.postCharge(t, s.URL(), key, chargeJSON(2001))
	wantProblem(t, "same key, other amount", res, http.StatusUnprocessableEntity, "key_reused")

	res = c.do(t, s.URL(), request{method: "POST", path: "/v1/orders", key: key, contentType: contentJSON, body: orderJSON("widget", 1)})
	wantProblem(t, "charge key reused on /v1/orders", res, http.StatusUnprocessableEntity, "key_reused")
}

// wantProblem fails unless res is an RFC 9457 problem with status and code.
func wantProblem(t testing.TB, what string, res *response, status int, code string) {
	t.Helper()
	wantError(t, what, res, status, code)
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Fatalf("%s: Content-Type %q, want application/problem+json", what, ct)
	}
	p := res.object(t)
	typ, _ := p["type"].(string)
	if !strings.HasSuffix(typ, code) || p["title"] == nil || p["status"] != float64(status) {
		t.Fatalf("%s: want a problem with type …%s, title and status %d, got %s", what, code, status, res.Body)
	}
}

func TestValidationErrorDoesNotBurnTheKey(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	key := newKey()
	bad := c.postCharge(t, s.URL(), key, []byte(`{"amount": -5, "currency": "usd"}`))
	if bad.Status != http.StatusBadRequest {
		t.Fatalf("negative amount: want 400, got %s", bad)
	}
	good := c.postCharge(t, s.URL(), key, chargeJSON(2000))
	want201(t, "corrected body with the same key", good)
	if good.replayed() {
		t.Fatalf("corrected body was answered by a replay: %s", good)
	}
}

// bigCharge is a syntactically valid charge body of about 2 MiB.
func bigCharge() []byte {
	return []byte(`{"amount": 2000, "currency": "usd", "description": "` + strings.Repeat("x", 2<<20) + `"}`)
}

func TestOversizedBodyIs413AndStoresNothing(t *testing.T) {
	t.Parallel()
	for _, chunked := range []bool{false, true} {
		name := "with Content-Length"
		if chunked {
			name = "chunked"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, c := setup(t)
			key := newKey()
			res := c.do(t, s.URL(), request{method: "POST", path: "/v1/charges", key: key, contentType: contentJSON, body: bigCharge(), chunked: chunked})
			wantError(t, "2 MiB body", res, http.StatusRequestEntityTooLarge, "body_too_large")
			if chunked && !res.Close {
				t.Fatalf("413 to a chunked body without Connection: close: %s", res)
			}
			if got := res.Header.Get("Idempotency-Key"); got != key {
				t.Fatalf("413: Idempotency-Key header = %q, want %q", got, key)
			}
			if n := len(c.listCharges(t, s.URL())); n != 0 {
				t.Fatalf("after a 413 the principal has %d charges, want 0", n)
			}
			good := c.postCharge(t, s.URL(), key, chargeJSON(2000))
			want201(t, "the same key with a valid body after a 413", good)
			if good.replayed() {
				t.Fatalf("valid body after 413 was answered by a replay: %s", good)
			}
		})
	}
}

func TestPrincipalsNeverShareChargesOrOrders(t *testing.T) {
	t.Parallel()
	s, a := setup(t)
	b := newClient()
	key := newKey()

	chA := a.postCharge(t, s.URL(), key, chargeJSON(2000))
	want201(t, "A's charge", chA)
	chB := b.postCharge(t, s.URL(), key, chargeJSON(2000))
	want201(t, "B's charge with A's key", chB)
	if chB.replayed() || chB.id(t) == chA.id(t) {
		t.Fatalf("B got A's charge: A %s, B %s", chA.Body, chB.Body)
	}
	if res := b.do(t, s.URL(), request{method: "GET", path: "/v1/charges/" + chA.id(t)}); res.Status != http.StatusNotFound {
		t.Fatalf("B reading A's charge: want 404, got %s", res)
	}
	for who, c := range map[string]*client{"A": a, "B": b} {
		if n := len(c.listCharges(t, s.URL())); n != 1 {
			t.Fatalf("%s lists %d charges, want 1", who, n)
		}
	}

	// A's order; B addresses the same id. Ids are per principal (SPEC §11), so B's PUT
	// and DELETE act on B's own order of that id, never on A's.
	id := "ord_" + randHex(6)
	path := "/v1/orders/" + id
	want201(t, "A's PUT", a.do(t, s.URL(), request{method: "PUT", path: path, contentType: contentJSON, body: orderJSON("A's widget", 1)}))
	orderA := a.do(t, s.URL(), request{method: "GET", path: path})
	if orderA.Status != http.StatusOK {
		t.Fatalf("A reading its order: %s", orderA)
	}
	if res := b.do(t, s.URL(), request{method: "GET", path: path}); res.Status != http.StatusNotFound {
		t.Fatalf("B reading A's order: want 404, got %s", res)
	}
	if res := b.do(t, s.URL(), request{method: "PUT", path: path, contentType: contentJSON, body: orderJSON("B's gadget", 7)}); res.Status != http.StatusCreated {
		t.Fatalf("B's PUT on A's order id: want 201 (B's own new order), got %s", res)
	}
	wantSameOrder(t, a, s.URL(), path, orderA, "after B's PUT")
	if res := b.do(t, s.URL(), request{method: "DELETE", path: path}); res.Status != http.StatusNoContent {
		t.Fatalf("B's DELETE: want 204, got %s", res)
	}
	wantSameOrder(t, a, s.URL(), path, orderA, "after B's DELETE")
}

// wantSameOrder fails unless GET path by c answers want again.
func wantSameOrder(t testing.TB, c *client, base, path string, want *response, when string) {
	t.Helper()
	got := c.do(t, base, request{method: "GET", path: path})
	if got.Status != http.StatusOK || !bytes.Equal(got.Body, want.Body) {
		t.Fatalf("A's order %s: got %s, want 200 %s", when, got, want.Body)
	}
}

func TestDeleteAnswers204EveryTime(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	never := "/v1/orders/ord_" + randHex(6)
	for i := 0; i < 2; i++ {
		if res := c.do(t, s.URL(), request{method: "DELETE", path: never}); res.Status != http.StatusNoContent {
			t.Fatalf("DELETE of an order that never existed (#%d): want 204, got %s", i+1, res)
		}
	}
	path := "/v1/orders/ord_" + randHex(6)
	want201(t, "PUT", c.do(t, s.URL(), request{method: "PUT", path: path, contentType: contentJSON, body: orderJSON("widget", 1)}))
	for i := 0; i < 3; i++ {
		if res := c.do(t, s.URL(), request{method: "DELETE", path: path}); res.Status != http.StatusNoContent {
			t.Fatalf("DELETE #%d: want 204, got %s", i+1, res)
		}
	}
	if res := c.do(t, s.URL(), request{method: "GET", path: path}); res.Status != http.StatusNotFound {
		t.Fatalf("GET after DELETE: want 404, got %s", res)
	}
}

func TestPutCreatesWith201AndLocationThenReplacesWith200(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	id := "ord_" + randHex(6)
	path := "/v1/orders/" + id
	first := c.do(t, s.URL(), request{method: "PUT", path: path, contentType: contentJSON, body: orderJSON("widget", 1)})
	want201(t, "first PUT", first)
	if loc := first.Header.Get("Location"); !strings.HasSuffix(loc, path) {
		t.Fatalf("first PUT: Location %q, want …%s", loc, path)
	}
	if first.id(t) != id {
		t.Fatalf("first PUT: order id %q, want %q", first.id(t), id)
	}
	second := c.do(t, s.URL(), request{method: "PUT", path: path, contentType: contentJSON, body: orderJSON("gadget", 3)})
	if second.Status != http.StatusOK {
		t.Fatalf("second PUT: want 200, got %s", second)
	}
	got := c.do(t, s.URL(), request{method: "GET", path: path})
	if got.Status != http.StatusOK || !bytes.Equal(got.Body, second.Body) {
		t.Fatalf("GET after replace: got %s, want 200 %s", got, second.Body)
	}
	if !strings.Contains(string(got.Body), "gadget") {
		t.Fatalf("GET after replace does not show the new content: %s", got.Body)
	}
}

// orderJSON is an order body: the payments API's order is a description with an amount.
func orderJSON(description string, quantity int) []byte {
	return []byte(`{"description": "` + description + `", "amount": ` + itoa(1000*quantity) + `, "currency": "usd"}`)
}

func TestPostWithoutKeyIs400KeyRequiredAndWithoutTokenIs401(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	res := c.postCharge(t, s.URL(), "", chargeJSON(2000))
	wantError(t, "POST without Idempotency-Key", res, http.StatusBadRequest, "key_required")

	anon := newClient()
	anon.token = ""
	res = anon.postCharge(t, s.URL(), newKey(), chargeJSON(2000))
	if res.Status != http.StatusUnauthorized {
		t.Fatalf("POST without a bearer token: want 401, got %s", res)
	}
	if n := len(c.listCharges(t, s.URL())); n != 0 {
		t.Fatalf("refused requests left %d charges", n)
	}
}

// A PUT that carries a key is honoured like a POST (SPEC §2): its retry replays the
// first answer, 201 with Location, even though the order now exists.
func TestPutWithKeyReplaysItsFirstAnswer(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	path := "/v1/orders/ord_" + randHex(6)
	key := newKey()
	put := request{method: "PUT", path: path, key: key, contentType: contentJSON, body: orderJSON("widget", 2)}
	first := c.do(t, s.URL(), put)
	want201(t, "first keyed PUT", first)
	replay := c.do(t, s.URL(), put)
	wantReplayOf(t, "keyed PUT retry", first, replay, key)
	if got, want := replay.Header.Get("Location"), first.Header.Get("Location"); got != want || got == "" {
		t.Fatalf("keyed PUT retry: Location %q, want %q", got, want)
	}
}

func TestPostedOrderReplays(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	key := newKey()
	post := request{method: "POST", path: "/v1/orders", key: key, contentType: contentJSON, body: orderJSON("widget", 1)}
	first := c.do(t, s.URL(), post)
	want201(t, "POST /v1/orders", first)
	if obj := first.object(t); obj["object"] != "order" || !strings.HasPrefix(first.id(t), "ord_") {
		t.Fatalf("POST /v1/orders: want an order object with an ord_ id, got %s", first.Body)
	}
	wantReplayOf(t, "POST /v1/orders retry", first, c.do(t, s.URL(), post), key)
	got := c.do(t, s.URL(), request{method: "GET", path: "/v1/orders/" + first.id(t)})
	if got.Status != http.StatusOK {
		t.Fatalf("GET of the posted order: %s", got)
	}
}

// SPEC §4 keeps number tokens exactly as sent: 2000 and 2000.0 are different requests.
func TestNumberTokensAreNotNormalisedInTheFingerprint(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	key := newKey()
	want201(t, "first POST", c.postCharge(t, s.URL(), key, []byte(`{"amount": 2000, "currency": "usd"}`)))
	res := c.postCharge(t, s.URL(), key, []byte(`{"amount": 2000.0, "currency": "usd"}`))
	wantSeedError(t, "2000.0 after 2000", res, http.StatusConflict, "key_reused", key)
}

// SPEC §3: the RFC 8941 String form and the bare form name the same key; the answer
// echoes the header as received.
func TestQuotedKeyNamesTheSameKeyAsTheBareForm(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	key := newKey()
	first := c.postCharge(t, s.URL(), key, chargeJSON(2000))
	want201(t, "POST with the bare key", first)
	quoted := `"` + key + `"`
	wantReplayOf(t, "POST with the quoted key", first, c.postCharge(t, s.URL(), quoted, chargeJSON(2000)), quoted)
}

// SPEC §10: --disable-idempotency serves the same API without the middleware, so a key
// is ignored and a duplicate executes again.
func TestDisabledIdempotencyExecutesDuplicatesTwice(t *testing.T) {
	t.Parallel()
	s, c := setup(t, "--disable-idempotency")
	key := newKey()
	first := c.postCharge(t, s.URL(), key, chargeJSON(2000))
	want201(t, "first POST", first)
	second := c.postCharge(t, s.URL(), key, chargeJSON(2000))
	want201(t, "duplicate POST", second)
	if second.replayed() || second.id(t) == first.id(t) {
		t.Fatalf("with idempotency disabled the duplicate was deduplicated:\n%s\n%s", first, second)
	}
	if res := c.postCharge(t, s.URL(), "", chargeJSON(2000)); res.Status != http.StatusCreated {
		t.Fatalf("with idempotency disabled a POST without a key: want 201, got %s", res)
	}
}

// SPEC §5: a different request on a record that is still in flight is key_reused, not
// request_in_progress: the key is taken whatever its state.
func TestMismatchWhileInFlightIsKeyReused(t *testing.T) {
	t.Parallel()
	dbPath := filepath.Join(t.TempDir(), "idem.db")
	s := startServer(t, "--store", "sqlite:"+dbPath, "--processor-latency", "2s")
	c := newClient()
	key := newKey()
	got := postInBackground(c, s.URL(), key, chargeJSON(2000))
	waitInFlight(t, dbPath, key)
	res := c.postCharge(t, s.URL(), key, chargeJSON(9999))
	wantSeedError(t, "another body while the first is in flight", res, http.StatusConflict, "key_reused", key)
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	want201(t, "the request in flight", a.res)
}

func TestMalformedKeyIs400KeyInvalid(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	for _, key := range []string{"short", `has"quote`, "a,list,of,keys", `"unterminated`} {
		res := c.postCharge(t, s.URL(), key, chargeJSON(2000))
		wantError(t, "key "+key, res, http.StatusBadRequest, "key_invalid")
	}
	if n := len(c.listCharges(t, s.URL())); n != 0 {
		t.Fatalf("refused keys left %d charges", n)
	}
}

// SPEC §2: safe methods pass through; a key header on them is ignored, even a malformed one.
func TestKeyHeaderOnGetIsIgnored(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	res := c.do(t, s.URL(), request{method: "GET", path: "/v1/charges", key: "bad"})
	if res.Status != http.StatusOK {
		t.Fatalf("GET with a malformed key: want 200, got %s", res)
	}
}
