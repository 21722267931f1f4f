// Package exampleapp is what the framework examples under examples/ share, so that
// each of them shows only how its framework wires idem in: the SQLite database with
// idem's records and a charges table, bearer-token authentication, the charge
// parameters, a net/http handler that creates a charge, and serving until SIGINT or
// SIGTERM. The examples are modules of their own; this package belongs to the root
// module (it imports the standard library, idem and its SQLite store only).
package exampleapp

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idem-go/idem/store/sqlite"
)

// Open opens (creating it) the SQLite database at path, migrates idem's schema, and
// creates the charges table: the application's table lives beside idem's records,
// so that a charge and its idempotency record commit together (SPEC §7).
func Open(ctx context.Context, path string) (*sqlite.Store, error) {
	store, err := sqlite.Open(ctx, path, sqlite.Config{})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		store.Close()
		return nil, err
	}
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS charges (
		id TEXT PRIMARY KEY, amount INTEGER NOT NULL, currency TEXT NOT NULL, created INTEGER NOT NULL)`); err != nil {
		store.Close()
		return nil, fmt.Errorf("creating the charges table: %w", err)
	}
	return store, nil
}

type scopeKey struct{}

// Authenticate is the authentication middleware: it accepts "Authorization: Bearer
// <token>" and answers anything else with 401. Every distinct token is a principal
// (demo mode, as the payments API of SPEC §11). idem's middleware goes inside it.
func Authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			WriteJSON(w, http.StatusUnauthorized, ErrorBody("api_key_invalid", "Provide 'Authorization: Bearer <token>'."))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), scopeKey{}, scopeOfToken(token))))
	})
}

// Scope is idem's Config.Scope: the principal Authenticate found, the hex SHA-256 of
// its token, so that no store holds a token.
func Scope(r *http.Request) (string, error) {
	if s, ok := r.Context().Value(scopeKey{}).(string); ok {
		return s, nil
	}
	return "", errors.New("unauthenticated")
}

// scopeOfToken is the principal of a bearer token: its hex SHA-256, as the payments
// API's (payments.ScopeOfToken).
func scopeOfToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// ChargeParams are the parameters of POST /v1/charges.
type ChargeParams struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// Validate says what is wrong with p, or nil.
func (p ChargeParams) Validate() error {
	switch {
	case p.Amount <= 0 || p.Amount > 99999999:
		return errors.New("amount must be a positive integer of at most 99999999")
	case len(p.Currency) != 3:
		return errors.New("currency must be three letters")
	}
	return nil
}

// Charge is a charge, in Stripe's shape.
type Charge struct {
	ID       string `json:"id"`
	Object   string `json:"object"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Created  int64  `json:"created"`
}

// InsertCharge creates a charge in tx and returns it.
func InsertCharge(ctx context.Context, tx *sql.Tx, p ChargeParams) (*Charge, error) {
	c := &Charge{ID: "ch_" + rand.Text(), Object: "charge", Amount: p.Amount,
		Currency: strings.ToLower(p.Currency), Created: time.Now().Unix()}
	_, err := tx.ExecContext(ctx, `INSERT INTO charges (id, amount, currency, created) VALUES (?, ?, ?, ?)`,
		c.ID, c.Amount, c.Currency, c.Created)
	return c, err
}

// CreateCharge is POST /v1/charges as a net/http handler behind idem's middleware:
// the charge's insert and the response, written inside store.InTx, commit together
// with the idempotency record (SPEC §7). A retry gets the stored response; a charge
// is never made without it, nor the other way round.
func CreateCharge(store *sqlite.Store) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p ChargeParams
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			WriteJSON(w, http.StatusBadRequest, ErrorBody("parameter_invalid", "The body is not a JSON object of charge parameters."))
			return
		}
		if err := p.Validate(); err != nil {
			WriteJSON(w, http.StatusBadRequest, ErrorBody("parameter_invalid", err.Error())) // 400: not stored
			return
		}
		err := store.InTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			c, err := InsertCharge(ctx, tx, p)
			if err != nil {
				return err
			}
			WriteJSON(w, http.StatusCreated, c) // the response the record stores
			return nil
		})
		if err != nil {
			// Nothing committed (had the completion failed, idem answers 503 instead).
			WriteJSON(w, http.StatusInternalServerError, ErrorBody("api_error", "The charge could not be created."))
		}
	})
}

// ErrorBody is an error in Stripe's shape, as idem's own errors are in its seed
// profile.
func ErrorBody(code, message string) any {
	return map[string]any{"error": map[string]string{"type": "invalid_request_error", "code": code, "message": message}}
}

// WriteJSON writes v as a JSON response with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Flags parses the examples' command line: -addr (default 127.0.0.1:8080) and -db
// (default payments.db).
func Flags() (addr, db string) {
	flag.StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on")
	flag.StringVar(&db, "db", "payments.db", "SQLite database file (idem's records and the charges)")
	flag.Parse()
	return addr, db
}

// Main is the main function of the examples whose framework is a net/http handler:
// it parses the flags, opens the database, and serves newHandler's handler until
// SIGINT or SIGTERM, then shuts down gracefully.
func Main(newHandler func(store *sqlite.Store) http.Handler) {
	addr, db := Flags()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	store, err := Open(ctx, db)
	if err != nil {
		Fatal(err)
	}
	defer store.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		Fatal(err)
	}
	slog.Info("serving POST /v1/charges", "addr", ln.Addr().String(), "db", db)
	srv := &http.Server{Handler: newHandler(store), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		Fatal(err)
	}
}

// Fatal logs err and exits with status 1.
func Fatal(err error) {
	slog.Error(err.Error())
	os.Exit(1)
}
