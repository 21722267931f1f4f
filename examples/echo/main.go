// Command echo serves a payments-like API with Echo and idem: POST /v1/charges
// executes at most once per Idempotency-Key, and the charge commits with its
// idempotency record (SPEC §7).
//
// idem's middleware captures the response its handler writes, to store it before
// sending it; idemMiddleware adapts it to Echo per route or group. It is
// echo.WrapMiddleware with one change: a handler's returned error is written (by
// Echo's HTTPErrorHandler) inside idem's middleware, into its capture, so that the
// error response is stored or releases the key by its status like any other. With
// echo.WrapMiddleware the error would be written after idem's middleware returned,
// into a capture that is no longer in use.
//
//	go run . -addr 127.0.0.1:8080 -db payments.db
//	curl -i localhost:8080/v1/charges -H 'Authorization: Bearer sk_test_1' \
//	    -H 'Idempotency-Key: 5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01' \
//	    -H 'Content-Type: application/json' -d '{"amount": 2000, "currency": "usd"}'
package main

import (
	"context"
	"database/sql"
	"net/http"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/examples/internal/exampleapp"
	"github.com/idem-go/idem/store/sqlite"
)

func main() { exampleapp.Main(newHandler) }

// newHandler is the API: Echo with authentication, then idem on the /v1 group.
func newHandler(store *sqlite.Store) http.Handler {
	mw := idem.New(idem.Config{Store: store, Scope: exampleapp.Scope})
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(middleware.Recover())
	e.Use(echo.WrapMiddleware(exampleapp.Authenticate)) // writes nothing on success: the plain wrapper is fine
	v1 := e.Group("/v1", idemMiddleware(mw.Handler))
	v1.POST("/charges", func(c echo.Context) error {
		var p exampleapp.ChargeParams
		if err := c.Bind(&p); err != nil || p.Validate() != nil {
			return echo.NewHTTPError(http.StatusBadRequest, "Send a positive amount and a three-letter currency.") // 400: not stored
		}
		return store.InTx(c.Request().Context(), func(ctx context.Context, tx *sql.Tx) error {
			charge, err := exampleapp.InsertCharge(ctx, tx, p)
			if err != nil {
				return err
			}
			return c.JSON(http.StatusCreated, charge) // inside the transaction: the response the record stores
		})
	})
	return e
}

// idemMiddleware adapts idem's net/http middleware to Echo: the rest of the chain runs
// inside it, writing to its capture, and a returned error is written there too.
func idemMiddleware(mw func(http.Handler) http.Handler) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			outer := c.Response()
			mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.SetRequest(r)
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				if err := next(c); err != nil {
					c.Error(err)
				}
			})).ServeHTTP(outer, c.Request())
			c.SetResponse(outer) // what idem sent, through the outer response
			return nil
		}
	}
}
