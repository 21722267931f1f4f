package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/sqlite"
)

// A handler whose writes all go to the store's file returns its response, and Respond
// commits the writes, the key's claim and the record completed with that response in
// one transaction (one fsync for the whole request on a ClaimInHandler route); a retry
// is replayed and never writes twice.
func ExampleStore_Respond() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := store.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error) {
			res, err := tx.ExecContext(ctx, `INSERT INTO orders (amount) VALUES (2000)`)
			if err != nil {
				return nil, err
			}
			id, err := res.LastInsertId()
			if err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, map[string]any{"id": fmt.Sprintf("ord_%d", id), "amount": 2000})
		})
		if err != nil { // the insert failed: nothing committed, nothing was sent
			http.Error(w, "the order could not be created", http.StatusConflict)
		}
	})
	mw := idem.New(idem.Config{Store: store, Scope: func(r *http.Request) (string, error) { return "user-1", nil }})
	handler := mw.Route(idem.RouteOptions{ClaimInHandler: true})(createOrder)

	for range 2 { // the client sends the request, then retries it with the same key
		req := httptest.NewRequest(http.MethodPost, "/v1/orders", strings.NewReader(`{"amount":2000}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "0b6f3a52-0c2e-4f1a-8d7e-3c9b1a2d4e55")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("Idempotent-Replayed"), rec.Body.String())
	}
	var n int
	if err := store.DB().QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", n)
	// Output:
	// 201  {"amount":2000,"id":"ord_1"}
	// 201 true {"amount":2000,"id":"ord_1"}
	// orders: 1
}

// A handler that creates a charge inserts it and writes its response inside
// Store.InTx: the charge and the idempotency record commit together (SPEC §7), so a
// retry is replayed and never charges twice.
func ExampleStore_InTx() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	// The application's tables live in the same file.
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE charges (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	createCharge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := store.InTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, `INSERT INTO charges (amount) VALUES (2000)`)
			if err != nil {
				return err
			}
			id, err := res.LastInsertId()
			if err != nil {
				return err
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"ch_%d","object":"charge","amount":2000}`, id)
			return nil
		})
		if err != nil {
			// Had the completion failed, the middleware would answer 503 instead.
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
	})
	mw := idem.New(idem.Config{
		Store: store,
		Scope: func(r *http.Request) (string, error) { return "user-1", nil }, // the authenticated principal
	})
	handler := mw.Handler(createCharge)

	for range 2 { // the client sends the request, then retries it with the same key
		req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":2000}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("Idempotent-Replayed"), rec.Body.String())
	}

	var n int
	if err := store.DB().QueryRowContext(ctx, `SELECT count(*) FROM charges`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// 201  {"id":"ch_1","object":"charge","amount":2000}
	// 201 true {"id":"ch_1","object":"charge","amount":2000}
	// charges: 1
}

// A job whose writes commit with its record (SPEC §7, §16): DoTx runs fn inside the
// store's InTx, so the invoice and the stored result commit together or not at all,
// and a redelivery gets the stored result without writing a second invoice.
func Example_doTx() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE invoices (id INTEGER PRIMARY KEY, number TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	g := idem.NewGuard(idem.GuardConfig{Store: store})
	call := idem.Call{Scope: "tenant-1", Key: "job-8c1f2e4a", Fingerprint: idem.FingerprintInput("invoice.send", []byte("inv_42"))}
	for range 2 { // the job, then its redelivery
		id, replayed, err := idem.DoTx(ctx, g, call, store.InTx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
			res, err := tx.ExecContext(ctx, `INSERT INTO invoices (number) VALUES ('inv_42')`)
			if err != nil {
				return 0, err
			}
			return res.LastInsertId()
		})
		fmt.Println(id, replayed, err)
	}
	// Output:
	// 1 false <nil>
	// 1 true <nil>
}
