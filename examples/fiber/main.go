// Command fiber serves a payments-like API with Fiber v3 and idem: POST /v1/charges
// executes at most once per Idempotency-Key, and the charge commits with its
// idempotency record (SPEC §7).
//
// Fiber runs on fasthttp; idem is net/http. Fiber's adaptor (middleware/adaptor)
// offers HTTPMiddleware, HTTPHandler and FiberApp. HTTPMiddleware does not fit idem:
// it runs the net/http middleware to its end and only then the Fiber handlers, so
// idem would store an empty response before the handler ran. So the route's handler
// is a net/http handler, wrapped in authentication and idem, and mounted with
// adaptor.HTTPHandler: idem captures what it writes, and it reaches the claim through
// r.Context() (store.Respond does).
//
// The adaptor's request has no route pattern, so the route is named
// (RouteOptions.Name) for the label of idem's Observer events (metrics, spans).
//
// go.mod requires a fasthttp newer than Fiber v3.1.0 asks for (v1.69.0): before
// v1.72.0 the adaptor handed the handler only the last of repeated header fields, so a
// request with two Idempotency-Key fields ran with the second key instead of being
// refused with 400 key_invalid (SPEC §3); in a Fiber application of your own, `go get
// github.com/valyala/fasthttp@latest`. (Later versions also end a data race between
// the server's shutdown and a request's context.)
//
//	go run . -addr 127.0.0.1:8080 -db payments.db
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
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/adaptor"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/store/sqlite"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	path := flag.String("db", "payments.db", "SQLite file of the charges and of idem's records")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	store, err := open(ctx, *path)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // also stops the store's cleaner of expired records
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	app := newApp(store, logClaims)
	go func() {
		<-ctx.Done()
		_ = app.ShutdownWithTimeout(30 * time.Second) // lets requests in flight finish
	}()
	log.Printf("listening on %s", *addr)
	if err := app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}); err != nil {
		log.Fatal(err)
	}
}

// logClaims logs the route and outcome of every claim: the labels a metrics adapter
// (idemprom) counts them by.
var logClaims = &observe.Observer{Claimed: func(e observe.ClaimEvent) {
	slog.Info("idem claim", "route", e.Route, "outcome", e.Outcome)
}}

// open opens the SQLite file with idem's tables and the application's.
func open(ctx context.Context, path string) (*sqlite.Store, error) {
	store, err := sqlite.Open(ctx, path, sqlite.Config{})
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
		id TEXT PRIMARY KEY, amount INTEGER NOT NULL, currency TEXT NOT NULL)`)
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	return store, nil
}

// newApp is the API: a Fiber app whose POST /v1/charges is the net/http handler
// behind authentication and idem.
func newApp(store *sqlite.Store, observer *observe.Observer) *fiber.App {
	mw := idem.New(idem.Config{Store: store, Scope: principal, Observer: observer})
	// The route writes only to the store's database, so it claims its key in the
	// transaction of its writes (ClaimInHandler, with store.Respond).
	charges := mw.Route(idem.RouteOptions{Name: "charges.create", ClaimInHandler: true})(createCharge(store))
	app := fiber.New()
	app.Post("/v1/charges", adaptor.HTTPHandler(authenticate(charges)))
	return app
}

type chargeParams struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// createCharge inserts a charge and returns its response to store.Respond: the charge,
// the response and the key's record commit together, or none of them does.
func createCharge(store *sqlite.Store) http.HandlerFunc {
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
