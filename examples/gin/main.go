// Command gin serves a payments-like API with gin and idem: POST /v1/charges executes
// at most once per Idempotency-Key, and the charge commits with its idempotency
// record (SPEC §7).
//
// idem's middleware is net/http: idemRoute adapts it to gin, for a route or a group of
// routes. It runs once gin has matched the route, rather than around the whole engine
// (mw.Handler(engine)), for two reasons: idem's Observer labels its events with the
// request's Pattern, which a request has not before routing (gin knows it as
// c.FullPath()), so that metrics (idemprom) and spans (idemotel) say which route they
// count instead of route="" (idem warns once); and it covers the routes it is given,
// each with its own idem.RouteOptions, not every route of the engine.
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

	"github.com/gin-gonic/gin"

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

// newHandler is the API: gin's engine with authentication, and idem on the routes
// that take keys.
func newHandler(store *sqlite.Store, observer *observe.Observer) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	engine := gin.New()
	engine.Use(gin.Recovery(), authenticate) // idem's Scope reads the principal authenticate found
	mw := idem.New(idem.Config{Store: store, Scope: principal, Observer: observer})
	// The route writes only to the store's database, so it claims its key in the
	// transaction of its writes (ClaimInHandler, with store.Respond): one transaction
	// per charge, no lease. A route that calls a service outside the database first
	// would take the lease route (idemRoute(mw.Handler)) and store.InTx after the call.
	engine.POST("/v1/charges", idemRoute(mw.Route(idem.RouteOptions{ClaimInHandler: true})), createCharge(store))
	return engine
}

type chargeParams struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// createCharge inserts a charge and returns its response to store.Respond: the charge,
// the response and the key's record commit together, or none of them does.
func createCharge(store *sqlite.Store) gin.HandlerFunc {
	return func(c *gin.Context) {
		var p chargeParams
		if err := c.ShouldBindJSON(&p); err != nil || p.Amount <= 0 || len(p.Currency) != 3 {
			c.JSON(http.StatusBadRequest, gin.H{"error": "amount and currency required"}) // a 400 frees the key
			return
		}
		err := store.Respond(c.Writer, c.Request, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			id := "ch_" + rand.Text()
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (id, amount, currency) VALUES (?, ?, ?)`, id, p.Amount, p.Currency)
			if err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, gin.H{"id": id, "object": "charge", "amount": p.Amount, "currency": p.Currency})
		})
		if err != nil { // the insert failed: nothing committed, nothing was sent
			c.JSON(http.StatusInternalServerError, gin.H{"error": "internal error"})
		}
	}
}

// idemRoute runs idem's middleware mw in a gin route, with the rest of the route's
// chain (its handler) inside it. It names the route in Request.Pattern as net/http's
// ServeMux does ("POST /v1/charges"), and the handlers write to idem's capture, which
// stores their response before sending it: gin's own writer would send it at once.
func idemRoute(mw func(http.Handler) http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		c.Request.Pattern = c.Request.Method + " " + c.FullPath()
		outer, ran := c.Writer, false
		defer func() { c.Writer = outer }() // idem wrote its answer there; gin.Recovery writes there after a panic
		mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			cw := &captureWriter{ResponseWriter: outer, w: w, status: http.StatusOK, size: -1}
			c.Request, c.Writer = r, cw // r carries idem's claim, which store.Respond finds
			c.Next()
			cw.WriteHeaderNow() // as gin does after its handlers: a bare c.Status(204) is an answer
		})).ServeHTTP(outer, c.Request)
		if !ran {
			c.Abort() // idem answered without the handler: a refusal, a replay
		}
	}
}

// captureWriter is the gin.ResponseWriter of the handlers inside idem: the response
// goes to idem's capture w; the rest (Hijack, CloseNotify, Pusher) is gin's writer of
// the connection. Like gin's own writer, it holds the status until the first write,
// so that headers set after c.Status are sent (c.JSON sets Content-Type then).
type captureWriter struct {
	gin.ResponseWriter
	w      http.ResponseWriter
	status int
	size   int // -1 until the status line is written
}

func (cw *captureWriter) Header() http.Header         { return cw.w.Header() }
func (cw *captureWriter) Unwrap() http.ResponseWriter { return cw.w }
func (cw *captureWriter) Status() int                 { return cw.status }
func (cw *captureWriter) Size() int                   { return cw.size }
func (cw *captureWriter) Written() bool               { return cw.size != -1 }

func (cw *captureWriter) WriteHeader(code int) {
	if code > 0 && !cw.Written() {
		cw.status = code
	}
}

func (cw *captureWriter) WriteHeaderNow() {
	if !cw.Written() {
		cw.size = 0
		cw.w.WriteHeader(cw.status)
	}
}

func (cw *captureWriter) Write(b []byte) (int, error) {
	cw.WriteHeaderNow()
	n, err := cw.w.Write(b)
	cw.size += n
	return n, err
}

func (cw *captureWriter) WriteString(s string) (int, error) { return cw.Write([]byte(s)) }

func (cw *captureWriter) Flush() {
	cw.WriteHeaderNow()
	_ = http.NewResponseController(cw.w).Flush()
}

type principalKey struct{}

// authenticate stands in for your authentication: every bearer token is a principal,
// known by its SHA-256 so that no token is stored.
func authenticate(c *gin.Context) {
	token, ok := strings.CutPrefix(c.GetHeader("Authorization"), "Bearer ")
	if !ok || token == "" {
		c.AbortWithStatusJSON(http.StatusUnauthorized, gin.H{"error": "Authorization: Bearer <token> required"})
		return
	}
	sum := sha256.Sum256([]byte(token))
	c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), principalKey{}, hex.EncodeToString(sum[:])))
	c.Next()
}

// principal is idem's Scope: the key of one principal is never replayed to another.
func principal(r *http.Request) (string, error) {
	p, _ := r.Context().Value(principalKey{}).(string)
	if p == "" {
		return "", errors.New("unauthenticated")
	}
	return p, nil
}
