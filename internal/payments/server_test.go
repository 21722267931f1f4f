package payments

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/memory"
)

func TestHealthzAnswers200WhenStoreAndDBAnswer(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		w := newBundle().do(req{method: "GET", path: "/healthz"})
		wantStatus(t, w, http.StatusOK)
	})
}

func TestHealthzAnswers503WhenTheDBIsDown(t *testing.T) {
	b := sqliteBundle(t)
	ctx := testenv.Context(t)
	// A DB on a database that is closed: the store still answers, the DB does not.
	sdb, err := OpenSQLite(filepath.Join(t.TempDir(), "other.db"), 1)
	if err != nil {
		t.Fatal(err)
	}
	db := NewSQLiteDB(sdb, nil)
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	_ = sdb.Close()
	srv := New(Config{Store: b.store, DB: db, Logger: quietLogger()})
	b.handler = srv.Handler()
	w := b.do(req{method: "GET", path: "/healthz"})
	wantStatus(t, w, http.StatusServiceUnavailable)
}

func TestUnknownRoutesAnswer404InStripeShape(t *testing.T) {
	b := sqliteBundle(t)
	for _, r := range []req{{method: "GET", path: "/nope"}, {method: "GET", path: "/v1/refunds", token: "tok_a"}} {
		w := b.do(r)
		wantStatus(t, w, http.StatusNotFound)
		if apiErr(t, w)["code"] != "resource_missing" {
			t.Fatalf("%s: body %s", r.path, w.Body)
		}
	}
}

func TestPatternNamesTheRoute(t *testing.T) {
	b := sqliteBundle(t)
	for path, want := range map[string]string{
		"/v1/charges/ch_1": "GET /v1/charges/{id}",
		"/healthz":         "GET /healthz",
		"/v1/orders/ord_1": "GET /v1/orders/{id}",
	} {
		r, _ := http.NewRequest("GET", path, nil)
		if got := b.srv.Pattern(r); got != want {
			t.Errorf("Pattern(%s) = %q, want %q", path, got, want)
		}
	}
}

func TestConcurrentRetriesOfOneChargeCreateOneCharge(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		key := newKey()
		var wg sync.WaitGroup
		codes := make([]int, 16)
		for i := range codes {
			wg.Go(func() {
				codes[i] = b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`).Code
			})
		}
		wg.Wait()
		created := 0
		for _, c := range codes {
			switch c {
			case http.StatusCreated:
				created++
			case http.StatusConflict: // request_in_progress
			default:
				t.Fatalf("status %d among %v", c, codes)
			}
		}
		list := decode(t, b.do(req{method: "GET", path: "/v1/charges", token: "tok_a"}))
		if n := len(list["data"].([]any)); n != 1 || created == 0 {
			t.Fatalf("%d charges from %d answers 201, want exactly 1", n, created)
		}
	})
}

// Several processes start at once: each migrates, none fails, the schema is made once.
func TestMigrateIsSafeWhenRunConcurrently(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "pay.db")
		migrateConcurrently(t, func() *DB {
			sdb, err := OpenSQLite(path, 2)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sdb.Close() })
			return NewSQLiteDB(sdb, nil)
		})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		dbURL, schema := pgtest.Schema(t)
		u := pgtest.SearchPathURL(t, dbURL, schema)
		migrateConcurrently(t, func() *DB {
			pool, err := pgxpool.New(testenv.Context(t), u)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return NewPostgresDB(pool, nil)
		})
	})
}

func migrateConcurrently(t *testing.T, open func() *DB) {
	ctx := testenv.Context(t)
	dbs := make([]*DB, 6)
	for i := range dbs {
		dbs[i] = open()
	}
	applied := make([][]string, len(dbs))
	errs := make([]error, len(dbs))
	var wg sync.WaitGroup
	for i, db := range dbs {
		wg.Go(func() { applied[i], errs[i] = db.Migrate(ctx) })
	}
	wg.Wait()
	total := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
		total += len(applied[i])
	}
	all, err := migrations(dbs[0].dialect)
	if err != nil {
		t.Fatal(err)
	}
	if total != len(all) {
		t.Fatalf("migrations applied %d times in all, want each of the %d once: %v", total, len(all), applied)
	}
	if again, err := dbs[0].Migrate(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second Migrate applied %v, %v; want nothing", again, err)
	}
	// The migrated schema serves.
	err = dbs[0].inTx(ctx, func(ctx context.Context, q querier) error {
		_, err := q.exec(ctx, "order_delete", "scope", "ord_x")
		return err
	})
	if err != nil {
		t.Fatal(fmt.Errorf("using the migrated schema: %w", err))
	}
}

// With a store that is not the payments database (Redis, say; here the in-memory
// store), mutations run in plain transactions and the reply is written after COMMIT;
// the middleware completes the record afterwards.
func TestAStoreOfItsOwnUsesPlainTransactions(t *testing.T) {
	t.Parallel()
	sdb, err := OpenSQLite(filepath.Join(t.TempDir(), "pay.db"), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sdb.Close() })
	b := newBundle(t, memory.New(), NewSQLiteDB(sdb, nil))
	if b.db.CompletesRecords() {
		t.Fatal("a DB without the store's InTx claims to complete records")
	}
	key := newKey()
	first := b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`)
	wantStatus(t, first, http.StatusCreated)
	again := b.postCharge("tok_a", key, `{"amount": 100, "currency": "usd"}`)
	if again.Header().Get("Idempotent-Replayed") != "true" || !bytes.Equal(first.Body.Bytes(), again.Body.Bytes()) {
		t.Fatalf("not replayed: %d %s", again.Code, again.Body)
	}
	wantStatus(t, b.do(req{method: "PUT", path: "/v1/orders/ord_plain", token: "tok_a", key: newKey(), body: `{"amount": 1, "currency": "usd"}`}), http.StatusCreated)
}

// The payments migrations after 004 only add, so that a process of the previous
// version keeps working beside a database that the next one migrated during a rolling
// upgrade (docs/operations.md).
func TestMigrationsAfter004OnlyAdd(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"postgres", "sqlite"} {
		testkit.MigrationsOnlyAdd(t, filepath.Join("migrations", dialect), 4)
	}
}
