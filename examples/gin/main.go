// Command gin serves a payments-like API with gin and idem: POST /v1/charges executes
// at most once per Idempotency-Key, and the charge commits with its idempotency
// record (SPEC §7).
//
// idem's middleware captures the response its handler writes, to store it before
// sending it. Gin handlers write to gin's own ResponseWriter, which a gin middleware
// cannot point at idem's capture, so idem wraps the gin engine itself, as a net/http
// handler, inside the authentication middleware: every route is covered, each method
// as SPEC §2's table says (Config.Methods changes it), and gin handlers reach the
// claim through c.Request.Context() (store.InTx does).
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

	"github.com/gin-gonic/gin"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/examples/internal/exampleapp"
	"github.com/idem-go/idem/store/sqlite"
)

func main() { exampleapp.Main(newHandler) }

// newHandler is the API: authentication, idem, then gin's engine.
func newHandler(store *sqlite.Store) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	engine := gin.New()
	engine.Use(gin.Recovery())
	engine.POST("/v1/charges", func(c *gin.Context) {
		var p exampleapp.ChargeParams
		if err := c.ShouldBindJSON(&p); err != nil || p.Validate() != nil {
			c.JSON(http.StatusBadRequest, exampleapp.ErrorBody("parameter_invalid", "Send a positive amount and a three-letter currency.")) // 400: not stored
			return
		}
		err := store.InTx(c.Request.Context(), func(ctx context.Context, tx *sql.Tx) error {
			charge, err := exampleapp.InsertCharge(ctx, tx, p)
			if err != nil {
				return err
			}
			c.JSON(http.StatusCreated, charge) // inside the transaction: the response the record stores
			return nil
		})
		if err != nil {
			// Nothing committed (had the completion failed, idem answers 503 instead).
			c.JSON(http.StatusInternalServerError, exampleapp.ErrorBody("api_error", "The charge could not be created."))
		}
	})
	mw := idem.New(idem.Config{Store: store, Scope: exampleapp.Scope})
	return exampleapp.Authenticate(mw.Handler(engine))
}
