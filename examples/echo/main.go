// Command echo serves a payments-like API with Echo and idem: POST /v1/charges
// executes at most once per Idempotency-Key, and the charge commits with its
// idempotency record (SPEC §7).
//
// idem's middleware captures the response its handler writes, to store it before
// sending it; idemMiddleware adapts it to Echo per route or group. It is
// echo.WrapMiddleware with two changes. A handler's returned error is written (by
// Echo's HTTPErrorHandler) inside idem's middleware, into its capture, so that the
// error response is stored or releases the key by its status like any other: with
// echo.WrapMiddleware it would be written after idem's middleware returned, into a
// capture that is no longer in use. And it names the route Echo matched in the
// request's Pattern, as net/http's ServeMux does: idem's Observer labels its events
// with it, so that metrics (idemprom) and spans (idemotel) say which route they count
// instead of route="".
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
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

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
	srv := &http.Server{Addr: *addr, Handler: newHandler(store, logClaims), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.Background()) // lets requests in flight finish
	}()
	log.Printf("listening on %s", *addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
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

// newHandler is the API: Echo with authentication, and idem on the routes that take
// keys.
func newHandler(store *sqlite.Store, observer *observe.Observer) http.Handler {
	mw := idem.New(idem.Config{Store: store, Scope: principal, Observer: observer})
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(middleware.Recover())
	e.Use(echo.WrapMiddleware(authenticate)) // writes nothing on success: the plain wrapper is fine
	// The route writes only to the store's database, so it claims its key in the
	// transaction of its writes (ClaimInHandler, with store.Respond). A group of routes
	// on the lease route takes e.Group("/v1", idemMiddleware(mw.Handler)).
	e.POST("/v1/charges", createCharge(store), idemMiddleware(mw.Route(idem.RouteOptions{ClaimInHandler: true})))
	return e
}

type chargeParams struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// createCharge inserts a charge and returns its response to store.Respond: the charge,
// the response and the key's record commit together, or none of them does.
func createCharge(store *sqlite.Store) echo.HandlerFunc {
	return func(c echo.Context) error {
		var p chargeParams
		if err := c.Bind(&p); err != nil || p.Amount <= 0 || len(p.Currency) != 3 {
			return echo.NewHTTPError(http.StatusBadRequest, "amount and currency required") // a 400 frees the key
		}
		// An error (the insert failed: nothing committed, nothing was sent) is Echo's
		// 500.
		return store.Respond(c.Response(), c.Request(), func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			id := "ch_" + rand.Text()
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (id, amount, currency) VALUES (?, ?, ?)`, id, p.Amount, p.Currency)
			if err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, map[string]any{"id": id, "object": "charge", "amount": p.Amount, "currency": p.Currency})
		})
	}
}

// idemMiddleware adapts idem's net/http middleware to Echo: the rest of the chain runs
// inside it, writing to its capture, and a returned error is written there too.
func idemMiddleware(mw func(http.Handler) http.Handler) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			outer := c.Response()
			defer c.SetResponse(outer) // what idem sent, through the outer response
			c.Request().Pattern = c.Request().Method + " " + c.Path()
			mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.SetRequest(r)
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				if err := next(c); err != nil {
					c.Error(err)
				}
			})).ServeHTTP(outer, c.Request())
			return nil
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
