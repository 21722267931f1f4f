// Command redis is the quick start of idem on Redis (docs/library.md): an API whose POST
// /v1/charges runs at most once per Idempotency-Key, with idem's records in Redis and
// the charges in an SQL database (SQLite here). Redis cannot join the database's
// transaction, so a backstop does: each charge commits together with a row of its key
// and the response it answered, and a retry that finds the row (Redis lost the record: a
// restart without persistence, an eviction, a failover, a crash between the COMMIT and
// the record's completion) is answered that response instead of charging again.
//
//	go run . -addr 127.0.0.1:8080 -redis redis://127.0.0.1:6379/0 -db app.db
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

	_ "modernc.org/sqlite"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/backstop"
	"github.com/idem-go/idem/store/redis"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	redisURL := flag.String("redis", "redis://127.0.0.1:6379/0", "Redis URL of idem's records")
	path := flag.String("db", "app.db", "SQLite file of the charges and of their keys' backstop")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	a, err := open(ctx, *redisURL, *path)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	srv := &http.Server{Addr: *addr, Handler: newHandler(a), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.Background()) // lets requests in flight finish
	}()
	log.Printf("listening on %s", *addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// app is what the API works with: idem's records in Redis, the charges and the
// backstop of their keys in the database.
type app struct {
	store *redis.Store
	db    *sql.DB
	bs    *backstop.Backstop
}

// open connects to Redis and opens the database with its tables.
func open(ctx context.Context, redisURL, path string) (*app, error) {
	store, err := redis.Open(ctx, redisURL, redis.Config{}) // logs a warning for settings that lose records
	if err != nil {
		return nil, err
	}
	// The start sequence (SPEC §20): never serve a store a newer release finalized.
	if _, err := idem.CheckStore(ctx, store); err != nil {
		return nil, errors.Join(err, store.Close())
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(wal)")
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	a := &app{store: store, db: db}
	a.bs, err = backstop.New(db, backstop.Config{Dialect: backstop.SQLite})
	if err == nil {
		err = a.bs.Migrate(ctx)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS charges (
			id TEXT PRIMARY KEY, amount INTEGER NOT NULL, currency TEXT NOT NULL)`)
	}
	if err != nil {
		return nil, errors.Join(err, a.Close())
	}
	return a, nil
}

// Close closes the database and the connection to Redis.
func (a *app) Close() error { return errors.Join(a.db.Close(), a.store.Close()) }

// newHandler is the API: authentication first, then idem, then the routes.
func newHandler(a *app) http.Handler {
	mw := idem.New(idem.Config{Store: a.store, Scope: principal})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", a.createCharge)
	return authenticate(mw.Handler(mux))
}

type chargeParams struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// createCharge inserts a charge and returns its response to the backstop's Respond: the
// charge, the response and the key's row commit together, or none of them does. A key
// whose row is there already runs nothing: Respond answers with the row's response.
func (a *app) createCharge(w http.ResponseWriter, r *http.Request) {
	var p chargeParams
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Amount <= 0 || len(p.Currency) != 3 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "amount and currency required"}) // a 400 frees the key
		return
	}
	err := a.bs.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
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
