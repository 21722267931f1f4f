// Command mysql is the quick start of idem's README on MySQL or MariaDB
// (docs/library.md): an API whose POST /v1/charges runs at most once per
// Idempotency-Key, from any number of processes on any hosts. The charges and idem's
// records share one database, and each charge commits together with the response it
// answered (SPEC §7): a retry gets that response again, never a second charge.
//
//	go run . -addr 127.0.0.1:8080 -db 'mysql://root@127.0.0.1:3306/test'
//	curl -i localhost:8080/v1/charges -H 'Authorization: Bearer sk_test_1' \
//	    -H 'Idempotency-Key: 5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01' \
//	    -H 'Content-Type: application/json' -d '{"amount": 2000, "currency": "usd"}'
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/mysql"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	dsn := flag.String("db", "mysql://root@127.0.0.1:3306/test", "MySQL URL (or DSN) of the charges and of idem's records")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	store, err := open(ctx, *dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // also stops the store's cleaner of expired records
	srv := &http.Server{Addr: *addr, Handler: newHandler(store), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.Background()) // lets requests in flight finish
	}()
	log.Printf("listening on %s", *addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// open connects to the database and creates idem's tables and the application's.
func open(ctx context.Context, dsn string) (*mysql.Store, error) {
	store, err := mysql.Open(ctx, dsn, mysql.Config{})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, errors.Join(err, store.Close())
	}
	// The start sequence (SPEC §20): never serve a store a newer release finalized.
	if _, err := idem.CheckStore(ctx, store); err != nil {
		return nil, errors.Join(err, store.Close())
	}
	_, err = store.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS charges (
		id VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL, currency CHAR(3) NOT NULL)`)
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	return store, nil
}

// newHandler is the API: authentication first, then the routes, each behind idem.
// POST /v1/charges writes only to the store's database, so it claims its key in the
// transaction of its writes (RouteOptions.ClaimInHandler, with store.Respond).
func newHandler(store *mysql.Store) http.Handler {
	mw := idem.New(idem.Config{Store: store, Scope: principal})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", mw.Route(idem.RouteOptions{ClaimInHandler: true})(createCharge(store)))
	return authenticate(mux)
}

type chargeParams struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// createCharge inserts a charge and returns its response to store.Respond: the charge,
// the response and the key's record commit together, or none of them does.
func createCharge(store *mysql.Store) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var p chargeParams
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Amount <= 0 || len(p.Currency) != 3 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "amount and currency required"}) // a 400 frees the key
			return
		}
		err := store.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			id := "ch_" + rand.Text()
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (id, amount, currency) VALUES (?, ?, ?)`, id, p.Amount, p.Currency)
			if err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, map[string]any{"id": id, "object": "charge", "amount": p.Amount, "currency": p.Currency})
		})
		if err != nil { // the insert failed: nothing committed, nothing was sent
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "internal error"})
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type principalKey struct{}

// authenticate stands in for your authentication: every bearer token is a principal,
// known by its SHA-256 so that no token is stored.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Authorization: Bearer <token> required"})
			return
		}
		sum := sha256.Sum256([]byte(token))
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, hex.EncodeToString(sum[:]))))
	})
}

// principal is idem's Scope: the key of one principal is never replayed to another.
func principal(r *http.Request) (string, error) {
	p, _ := r.Context().Value(principalKey{}).(string)
	if p == "" {
		return "", errors.New("unauthenticated")
	}
	return p, nil
}
