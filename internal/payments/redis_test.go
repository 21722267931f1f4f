package payments

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/redis"
)

// redisBundle is the API with its records in Redis (a key prefix of its own on the
// shared server) and its data in a database with plain transactions, as
// `idem payments --store redis://… --db …` runs it. forget deletes every idempotency
// record of the bundle from Redis, as a flush, a restart without persistence or a
// failover would.
type redisBundle struct {
	*bundle
	forget func()
}

// eachRedisDB runs test with the records in Redis and the data on SQLite, then on
// PostgreSQL; opts change the API's Config.
func eachRedisDB(t *testing.T, test func(t *testing.T, b *redisBundle), opts ...option) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		sdb, err := OpenSQLite(filepath.Join(t.TempDir(), "pay.db"), 4)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sdb.Close() })
		test(t, newRedisBundle(t, NewSQLiteDB(sdb, nil), opts...))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		dbURL, schema := pgtest.Schema(t)
		pool, err := pgxpool.New(testenv.Context(t), pgtest.SearchPathURL(t, dbURL, schema))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		test(t, newRedisBundle(t, NewPostgresDB(pool, nil), opts...))
	})
}

func newRedisBundle(t *testing.T, db *DB, opts ...option) *redisBundle {
	t.Helper()
	ctx := testenv.Context(t)
	prefix := testenv.Name("paytest-") + ":"
	st, err := redis.Open(ctx, testenv.RedisURL(t), redis.Config{KeyPrefix: prefix, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	forget := func() {
		t.Helper()
		keys, err := st.Client().Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			t.Fatal("no record to forget: the store kept nothing under " + prefix)
		}
		for _, k := range keys {
			if err := st.Client().Del(ctx, k).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() {
		keys, _ := st.Client().Keys(context.Background(), prefix+"*").Result()
		for _, k := range keys {
			st.Client().Del(context.Background(), k)
		}
	})
	b := newBundle(t, st, db, opts...)
	if b.db.CompletesRecords() {
		t.Fatal("a DB beside a Redis store claims to complete records in its transactions")
	}
	return &redisBundle{bundle: b, forget: forget}
}

// On Redis no transaction covers the record and the charge. When Redis loses a
// completed record, the resent request executes again, and the database's unique
// (scope, idempotency_key) answers it with the first charge, the same bytes, without a
// second charge; another body with that key is key_reused.
func TestChargeOnRedisIsNotRepeatedWhenRedisLosesTheRecord(t *testing.T) {
	eachRedisDB(t, func(t *testing.T, b *redisBundle) {
		key, body := newKey(), `{"amount": 100, "currency": "usd", "customer_id": "cust_1"}`
		first := b.postCharge("tok_a", key, body)
		wantStatus(t, first, http.StatusCreated)
		b.forget()

		again := b.postCharge("tok_a", key, body)
		wantStatus(t, again, http.StatusCreated)
		if again.Header().Get("Idempotent-Replayed") != "" {
			t.Fatal("answered from a record that was deleted")
		}
		if !bytes.Equal(first.Body.Bytes(), again.Body.Bytes()) || again.Header().Get("Content-Type") != first.Header().Get("Content-Type") {
			t.Fatalf("the re-executed request answers\n%s\nwant the first answer\n%s", again.Body, first.Body)
		}
		// The re-execution completed a new record: the next retry is a plain replay.
		third := b.postCharge("tok_a", key, body)
		if third.Header().Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.Body.Bytes(), third.Body.Bytes()) {
			t.Fatalf("retry after the re-execution: %d %v %s", third.Code, third.Header(), third.Body)
		}

		b.forget()
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

func TestOrderOnRedisIsNotRepeatedWhenRedisLosesTheRecord(t *testing.T) {
	eachRedisDB(t, func(t *testing.T, b *redisBundle) {
		r := req{method: "POST", path: "/v1/orders", token: "tok_a", key: newKey(), body: `{"amount": 100, "currency": "usd"}`}
		first := b.do(r)
		wantStatus(t, first, http.StatusCreated)
		b.forget()
		again := b.do(r)
		wantStatus(t, again, http.StatusCreated)
		if !bytes.Equal(first.Body.Bytes(), again.Body.Bytes()) || again.Header().Get("Location") != first.Header().Get("Location") {
			t.Fatalf("re-executed order answers\n%s %v\nwant\n%s %v", again.Body, again.Header(), first.Body, first.Header())
		}
		b.forget()
		r.body = `{"amount": 999, "currency": "usd"}`
		w := b.do(r)
		wantStatus(t, w, http.StatusConflict)
		if apiErr(t, w)["code"] != idem.CodeKeyReused {
			t.Fatalf("body %s", w.Body)
		}
	})
}

// A keyed PUT re-executed after Redis lost its record answers what it answered the
// first time: 201 + Location when it created the order, 200 when it replaced it, even
// in the second the order was created (created = updated).
func TestPutOrderOnRedisAnswersItsFirstStatusWhenRedisLosesTheRecord(t *testing.T) {
	sameSecond := func() time.Time { return time.Unix(1_700_000_000, 0) }
	eachRedisDB(t, func(t *testing.T, b *redisBundle) {
		create := req{method: "PUT", path: "/v1/orders/ord_made", token: "tok_a", key: newKey(), body: `{"amount": 100, "currency": "usd"}`}
		created := b.do(create)
		wantStatus(t, created, http.StatusCreated)
		wantStatus(t, b.do(req{method: "PUT", path: "/v1/orders/ord_replaced", token: "tok_a", body: `{"amount": 1, "currency": "usd"}`}), http.StatusCreated)
		replace := req{method: "PUT", path: "/v1/orders/ord_replaced", token: "tok_a", key: newKey(), body: `{"amount": 200, "currency": "usd"}`}
		replaced := b.do(replace)
		wantStatus(t, replaced, http.StatusOK)

		b.forget()
		for _, first := range []struct {
			r req
			w *httptest.ResponseRecorder
		}{{create, created}, {replace, replaced}} {
			again := b.do(first.r)
			if again.Code != first.w.Code || again.Header().Get("Location") != first.w.Header().Get("Location") || !bytes.Equal(again.Body.Bytes(), first.w.Body.Bytes()) {
				t.Fatalf("re-executed %s answers %d Location %q\n%s\nwant %d Location %q\n%s", first.r.path, again.Code, again.Header().Get("Location"), again.Body,
					first.w.Code, first.w.Header().Get("Location"), first.w.Body)
			}
		}
	}, withClock(sameSecond))
}

// The key that created an order stays recorded however the order changes after: a PUT
// without a key (which writes no key on the order) or a DELETE. When Redis then loses
// the key's record, the retried POST is answered its first response and creates no
// second order; the same holds for a keyed PUT, whose retry does not replace the order
// again (issue 9, item 5).
func TestOrderKeysOutliveAPutOrDeleteOfTheirOrderWhenRedisLosesTheRecord(t *testing.T) {
	eachRedisDB(t, func(t *testing.T, b *redisBundle) {
		post := req{method: "POST", path: "/v1/orders", token: "tok_a", key: newKey(), body: `{"amount": 100, "currency": "usd"}`}
		first := b.do(post)
		wantStatus(t, first, http.StatusCreated)
		path := first.Header().Get("Location")
		keyedPut := req{method: "PUT", path: path, token: "tok_a", key: newKey(), body: `{"amount": 200, "currency": "usd"}`}
		putFirst := b.do(keyedPut)
		wantStatus(t, putFirst, http.StatusOK)
		wantStatus(t, b.do(req{method: "PUT", path: path, token: "tok_a", body: `{"amount": 300, "currency": "usd"}`}), http.StatusOK)

		wantFirstAnswer := func(when string, r req, want *httptest.ResponseRecorder) {
			t.Helper()
			b.forget()
			again := b.do(r)
			if again.Code != want.Code || again.Header().Get("Location") != want.Header().Get("Location") || !bytes.Equal(again.Body.Bytes(), want.Body.Bytes()) {
				t.Fatalf("%s, the retried %s %s answers %d Location %q\n%s\nwant its first answer, %d Location %q\n%s", when, r.method, r.path,
					again.Code, again.Header().Get("Location"), again.Body, want.Code, want.Header().Get("Location"), want.Body)
			}
			if n := b.countOrders(); n > 1 {
				t.Fatalf("%s, the retried %s %s made %d orders, want at most 1", when, r.method, r.path, n)
			}
		}
		wantFirstAnswer("after a PUT without a key", post, first)
		wantFirstAnswer("after a PUT without a key", keyedPut, putFirst)
		if got := decode(t, b.do(req{method: "GET", path: path, token: "tok_a"})); got["amount"] != 300.0 {
			t.Fatalf("the retried keyed PUT executed again: the order is now %v", got)
		}

		wantStatus(t, b.do(req{method: "DELETE", path: path, token: "tok_a"}), http.StatusNoContent)
		wantFirstAnswer("after a DELETE", post, first)
		wantFirstAnswer("after a DELETE", keyedPut, putFirst)
		if n := b.countOrders(); n != 0 {
			t.Fatalf("%d orders after the DELETE and the retries, want none", n)
		}
	})
}

// countOrders counts every order in the bundle's database.
func (b *bundle) countOrders() int {
	b.t.Helper()
	var n int
	var err error
	if b.db.dialect == dialectPostgres {
		err = b.db.pool.QueryRow(testenv.Context(b.t), "SELECT count(*) FROM orders").Scan(&n)
	} else {
		err = b.db.sqlDB.QueryRowContext(testenv.Context(b.t), "SELECT count(*) FROM orders").Scan(&n)
	}
	if err != nil {
		b.t.Fatal(err)
	}
	return n
}
