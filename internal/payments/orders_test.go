package payments

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func TestCreateOrderAnswers201WithLocation(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		w := b.do(req{method: "POST", path: "/v1/orders", token: "tok_a", key: newKey(), body: `{"amount": 500, "currency": "gbp", "description": "two mugs"}`})
		wantStatus(t, w, http.StatusCreated)
		o := decode(t, w)
		id, _ := o["id"].(string)
		if !orderID.MatchString(id) || o["object"] != "order" || o["status"] != "open" || o["description"] != "two mugs" || o["currency"] != "gbp" {
			t.Fatalf("order %v", o)
		}
		if loc := w.Header().Get("Location"); loc != "/v1/orders/"+id {
			t.Fatalf("Location %q", loc)
		}
		got := b.do(req{method: "GET", path: "/v1/orders/" + id, token: "tok_a"})
		wantStatus(t, got, http.StatusOK)
		if !bytes.Equal(got.Body.Bytes(), w.Body.Bytes()) {
			t.Fatalf("GET renders\n%s\nPOST rendered\n%s", got.Body, w.Body)
		}
	})
}

func TestCreateOrderRequiresAKeyAndValidParameters(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		w := b.do(req{method: "POST", path: "/v1/orders", token: "tok_a", body: `{"amount": 500, "currency": "gbp"}`})
		wantStatus(t, w, http.StatusBadRequest)
		if apiErr(t, w)["code"] != idem.CodeKeyRequired {
			t.Fatalf("body %s", w.Body)
		}
		key := newKey()
		w = b.do(req{method: "POST", path: "/v1/orders", token: "tok_a", key: key, body: `{"amount": 500, "currency": "gbp", "status": "lost"}`})
		wantStatus(t, w, http.StatusBadRequest)
		if e := apiErr(t, w); e["param"] != "status" {
			t.Fatalf("error %v", e)
		}
		wantStatus(t, b.do(req{method: "POST", path: "/v1/orders", token: "tok_a", key: key, body: `{"amount": 500, "currency": "gbp", "status": "paid"}`}), http.StatusCreated)
	})
}

func TestPutOrderCreatesWith201ThenReplacesWith200(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		path := "/v1/orders/ord_put_1"
		w := b.do(req{method: "PUT", path: path, token: "tok_a", body: `{"amount": 100, "currency": "usd", "description": "first"}`})
		wantStatus(t, w, http.StatusCreated)
		if loc := w.Header().Get("Location"); loc != path {
			t.Fatalf("Location %q, want %q", loc, path)
		}
		created := decode(t, w)["created"]

		// A full replace: the description, absent now, becomes null.
		w = b.do(req{method: "PUT", path: path, token: "tok_a", body: `{"amount": 250, "currency": "usd", "status": "paid"}`})
		wantStatus(t, w, http.StatusOK)
		if w.Header().Get("Location") != "" {
			t.Errorf("a replace sets Location")
		}
		o := decode(t, b.do(req{method: "GET", path: path, token: "tok_a"}))
		if o["amount"] != 250.0 || o["status"] != "paid" || o["description"] != nil || o["created"] != created || o["updated"] == created {
			t.Fatalf("replaced order %v", o)
		}
	})
}

func TestPutOrderHonoursAKeyWhenSent(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		key := newKey()
		r := req{method: "PUT", path: "/v1/orders/ord_keyed", token: "tok_a", key: key, body: `{"amount": 100, "currency": "usd"}`}
		first := b.do(r)
		wantStatus(t, first, http.StatusCreated)
		again := b.do(r)
		wantStatus(t, again, http.StatusCreated) // the stored 201, not a fresh 200
		if again.Header().Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.Body.Bytes(), again.Body.Bytes()) {
			t.Fatalf("keyed PUT not replayed: %s", again.Body)
		}
		if decode(t, first)["idempotency_key"] != key {
			t.Fatalf("order does not carry its key: %s", first.Body)
		}
	})
}

func TestPutOrderRefusesAMalformedIDWith400(t *testing.T) {
	b := sqliteBundle(t)
	long := "ord_" + strings.Repeat("x", 65)
	for _, id := range []string{"order_1", "ord_", "ord_a-b", long} {
		w := b.do(req{method: "PUT", path: "/v1/orders/" + id, token: "tok_a", body: `{"amount": 1, "currency": "usd"}`})
		wantStatus(t, w, http.StatusBadRequest)
		if apiErr(t, w)["param"] != "id" {
			t.Fatalf("%s: body %s", id, w.Body)
		}
	}
	wantStatus(t, b.do(req{method: "PUT", path: "/v1/orders/ord_" + strings.Repeat("x", 64), token: "tok_a", body: `{"amount": 1, "currency": "usd"}`}), http.StatusCreated)
}

func TestGetOrderAnswers404ForUnknownOrMalformedIDs(t *testing.T) {
	b := sqliteBundle(t)
	for _, id := range []string{"ord_missing", "not_an_order"} {
		w := b.do(req{method: "GET", path: "/v1/orders/" + id, token: "tok_a"})
		wantStatus(t, w, http.StatusNotFound)
		if apiErr(t, w)["code"] != "resource_missing" {
			t.Fatalf("%s: body %s", id, w.Body)
		}
	}
}

func TestDeleteOrderAnswers204Always(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		path := "/v1/orders/ord_del"
		wantStatus(t, b.do(req{method: "PUT", path: path, token: "tok_a", body: `{"amount": 1, "currency": "usd"}`}), http.StatusCreated)

		for _, what := range []string{"existing", "already deleted"} {
			w := b.do(req{method: "DELETE", path: path, token: "tok_a"})
			wantStatus(t, w, http.StatusNoContent)
			if w.Body.Len() != 0 {
				t.Fatalf("%s: 204 with a body: %q", what, w.Body)
			}
		}
		wantStatus(t, b.do(req{method: "GET", path: path, token: "tok_a"}), http.StatusNotFound)
		wantStatus(t, b.do(req{method: "DELETE", path: "/v1/orders/ord_never", token: "tok_a"}), http.StatusNoContent)
		wantStatus(t, b.do(req{method: "DELETE", path: "/v1/orders/malformed", token: "tok_a"}), http.StatusNoContent)
		wantStatus(t, b.do(req{method: "DELETE", path: "/v1/orders/ord_never", token: "tok_a", key: newKey()}), http.StatusNoContent)
	})
}

func TestOrdersBelongToTheirPrincipal(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		path := "/v1/orders/ord_shared_name"
		wantStatus(t, b.do(req{method: "PUT", path: path, token: "tok_a", body: `{"amount": 1, "currency": "usd"}`}), http.StatusCreated)

		wantStatus(t, b.do(req{method: "GET", path: path, token: "tok_b"}), http.StatusNotFound)
		// b's DELETE answers 204 and leaves a's order alone.
		wantStatus(t, b.do(req{method: "DELETE", path: path, token: "tok_b"}), http.StatusNoContent)
		wantStatus(t, b.do(req{method: "GET", path: path, token: "tok_a"}), http.StatusOK)
		// b's PUT of the same id creates b's own order.
		wantStatus(t, b.do(req{method: "PUT", path: path, token: "tok_b", body: `{"amount": 2, "currency": "usd"}`}), http.StatusCreated)
		if a := decode(t, b.do(req{method: "GET", path: path, token: "tok_a"})); a["amount"] != 1.0 {
			t.Fatalf("a's order changed: %v", a)
		}
	})
}

func TestOrderBackstopWhenTheRecordIsGone(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		key := newKey()
		r := req{method: "POST", path: "/v1/orders", token: "tok_a", key: key, body: `{"amount": 100, "currency": "usd"}`}
		first := b.do(r)
		wantStatus(t, first, http.StatusCreated)
		b.exec("DELETE FROM idem_records")
		again := b.do(r)
		wantStatus(t, again, http.StatusCreated)
		if !bytes.Equal(first.Body.Bytes(), again.Body.Bytes()) || again.Header().Get("Location") != first.Header().Get("Location") {
			t.Fatalf("re-rendered order differs:\n%s\n%s", first.Body, again.Body)
		}
		b.exec("DELETE FROM idem_records")
		r.body = `{"amount": 999, "currency": "usd"}`
		wantStatus(t, b.do(r), http.StatusConflict)
	})
}

func TestExpiredKeyStartsANewOrder(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		clock := newSkippableClock()
		b := newBundle(withClock(clock.now))
		r := req{method: "POST", path: "/v1/orders", token: "tok_a", key: newKey(), body: `{"amount": 100, "currency": "usd"}`}
		first := b.do(r)
		wantStatus(t, first, http.StatusCreated)
		b.exec("DELETE FROM idem_records")
		clock.advance(idem.DefaultTTL)
		again := b.do(r)
		wantStatus(t, again, http.StatusCreated)
		if decode(t, again)["id"] == decode(t, first)["id"] {
			t.Fatalf("the expired key was replayed: %s", again.Body)
		}
	})
}

// A key recorded before order_keys kept answers (its body NULL, as migration 003 fills
// it from the orders) is answered with its order as it is now, and once the order is
// deleted with a clear 409 order_deleted, never with a second order.
func TestOrderKeyRecordedWithoutItsAnswerRendersTheOrderOrSaysItIsDeleted(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		r := req{method: "POST", path: "/v1/orders", token: "tok_a", key: newKey(), body: `{"amount": 100, "currency": "usd"}`}
		first := b.do(r)
		wantStatus(t, first, http.StatusCreated)
		b.exec("UPDATE order_keys SET body = NULL")
		b.exec("DELETE FROM idem_records")
		again := b.do(r)
		if again.Code != http.StatusCreated || !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) || again.Header().Get("Location") != first.Header().Get("Location") {
			t.Fatalf("retry answers %d %s, want the order as it is, %s", again.Code, again.Body, first.Body)
		}
		wantStatus(t, b.do(req{method: "DELETE", path: first.Header().Get("Location"), token: "tok_a"}), http.StatusNoContent)
		b.exec("DELETE FROM idem_records")
		gone := b.do(r)
		wantStatus(t, gone, http.StatusConflict)
		if apiErr(t, gone)["code"] != "order_deleted" {
			t.Fatalf("retry after the DELETE: %s", gone.Body)
		}
	})
}

// The rows of order_keys are deleted once their key expired, a batch after every
// cleanEvery-th keyed order write, so that the table holds about a TTL's worth of
// keys rather than every key ever sent; rows of live keys stay.
func TestExpiredOrderKeysAreDeletedAsOrdersAreWritten(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		clock := newSkippableClock()
		b := newBundle(withClock(clock.now))
		b.srv.cleanEvery = 3
		write := func(method, path string) {
			t.Helper()
			w := b.do(req{method: method, path: path, token: "tok_a", key: newKey(), body: `{"amount": 100, "currency": "usd"}`})
			if w.Code != http.StatusCreated && w.Code != http.StatusOK {
				t.Fatalf("%s %s: %d %s", method, path, w.Code, w.Body)
			}
		}
		write("POST", "/v1/orders")
		write("PUT", "/v1/orders/ord_put")
		if n := b.count("order_keys"); n != 2 {
			t.Fatalf("order_keys holds %d rows after two keyed writes, want 2", n)
		}
		clock.advance(idem.DefaultTTL + time.Hour) // both keys expire
		write("POST", "/v1/orders")                // the third write cleans
		if n := b.count("order_keys"); n != 1 {
			t.Fatalf("order_keys holds %d rows after the cleanup, want the live key's only", n)
		}
		if _, err := b.db.DeleteExpiredOrderKeys(t.Context(), clock.now(), 0); err == nil {
			t.Error("DeleteExpiredOrderKeys with limit 0 succeeded")
		}
	})
}
