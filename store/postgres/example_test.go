package postgres_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/postgres"
)

// A handler that creates a charge inserts it and writes its response inside
// Store.InTx: the charge and the idempotency record commit together (SPEC §7), so a
// retry is replayed and never charges twice, and a request whose key was taken over
// or whose COMMIT failed answers 503 instead of a response whose charge never
// committed. (Needs a database, so the example is compiled, not run.)
func ExampleStore_InTx() {
	ctx := context.Background()
	store, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"), postgres.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	createCharge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := store.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO charges (amount) VALUES (2000) RETURNING id`).Scan(&id)
			if err != nil {
				return err
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"ch_%d","object":"charge","amount":2000}`, id)
			return nil
		})
		if err != nil {
			// Had the completion failed, the middleware answers 503 instead of this.
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
	})
	mw := idem.New(idem.Config{
		Store: store,
		Scope: func(r *http.Request) (string, error) { return "user-1", nil }, // the authenticated principal
	})
	srv := &http.Server{Addr: "127.0.0.1:8080", Handler: mw.Handler(createCharge)}
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// A handler whose writes all go to the store's database returns its response, and
// Respond commits the writes, the record completed with that response and the key's
// claim in one transaction: on a ClaimInHandler route one pipelined round trip for
// the whole request (and for a replay). (Compiled, not run: it needs a database.)
func ExampleStore_Respond() {
	var store *postgres.Store // opened and migrated as in the InTx example
	mw := idem.New(idem.Config{Store: store, Scope: func(r *http.Request) (string, error) { return "user-1", nil }})
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		order := struct {
			ID     string `json:"id"`
			Amount int64  `json:"amount"`
		}{ID: "ord_" + rand.Text(), Amount: 2000} // made here: the response is known before the insert runs
		err := store.Respond(w, r, func(b *pgx.Batch) (*idemstore.Response, error) {
			b.Queue(`INSERT INTO orders (id, amount) VALUES ($1, $2)`, order.ID, order.Amount)
			return idem.JSONResponse(http.StatusCreated, order)
		})
		if err != nil { // the insert failed: nothing committed, nothing was sent
			http.Error(w, "the order could not be created", http.StatusConflict)
		}
	})
	http.Handle("POST /v1/orders", mw.Route(idem.RouteOptions{ClaimInHandler: true})(createOrder))
}

// Applications that manage their own transactions complete the record with
// CompleteTx, in the transaction that holds their writes, and report the outcome to
// the request's handle.
func ExampleStore_CompleteTx() {
	var store *postgres.Store // opened and migrated as in the InTx example
	handler := func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx, err := store.Pool().Begin(ctx)
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ('ord_1')`); err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)

		h, err := idem.TxHandle(ctx)
		switch {
		case err != nil: // not the request's context, or not behind the middleware
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		case h == nil: // no idempotency key on this request (idem.WithoutKey)
			_ = tx.Commit(ctx)
			return
		}
		p, err := h.PrepareCompletion() // after the response was written
		if err != nil {
			return // idem.ErrNoResponse: the middleware answers 500
		}
		if p != nil {
			if err := store.CompleteTx(ctx, tx, p); err != nil {
				h.CompletionFailed(err) // ErrLeaseLost: the key was taken over; roll back
				return
			}
		}
		if err := tx.Commit(ctx); err != nil {
			h.CompletionFailed(err)
			return
		}
		if p != nil {
			h.Completed()
		}
	}
	_ = handler
}

// An application written against database/sql gets the same guarantee through
// Store.DB (pgx's database/sql driver on the store's pool) and Store.InSQLTx, which
// hands fn a *sql.Tx. (Needs a database, so the example is compiled, not run.)
func ExampleStore_InSQLTx() {
	var store *postgres.Store // opened and migrated as in the InTx example
	createCharge := func(w http.ResponseWriter, r *http.Request) {
		err := store.InSQLTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			var id int64
			err := tx.QueryRowContext(ctx, `INSERT INTO charges (amount) VALUES (2000) RETURNING id`).Scan(&id)
			if err != nil {
				return err
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":"ch_%d","object":"charge","amount":2000}`, id)
			return nil
		})
		if err != nil {
			// Had the completion failed, the middleware answers 503 instead of this.
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
	}
	_ = createCharge
}

// An application written against database/sql takes the Respond path through
// Store.RespondSQL: its function runs the statements on a *sql.Tx of Store.DB and
// returns the response, which commits with the charge and the key's record. (Needs a
// database, so the example is compiled, not run.)
func ExampleStore_RespondSQL() {
	var store *postgres.Store // opened and migrated as in the InTx example
	createCharge := func(w http.ResponseWriter, r *http.Request) {
		err := store.RespondSQL(w, r, func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error) {
			var id int64
			err := tx.QueryRowContext(ctx, `INSERT INTO charges (amount) VALUES (2000) RETURNING id`).Scan(&id)
			if err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, map[string]any{"id": fmt.Sprintf("ch_%d", id), "object": "charge", "amount": 2000})
		})
		if err != nil { // the insert failed: nothing committed, nothing was sent
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
	}
	_ = createCharge
}
