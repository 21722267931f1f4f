// Command chi serves a payments-like API with the chi router and idem: POST
// /v1/charges executes at most once per Idempotency-Key, and the charge commits with
// its idempotency record (SPEC §7). chi routes are net/http handlers, so idem's
// middleware goes in as it is, for the whole router or, with Middleware.Route, per
// route.
//
//	go run . -addr 127.0.0.1:8080 -db payments.db
//	curl -i localhost:8080/v1/charges -H 'Authorization: Bearer sk_test_1' \
//	    -H 'Idempotency-Key: 5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01' \
//	    -H 'Content-Type: application/json' -d '{"amount": 2000, "currency": "usd"}'
package main

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/examples/internal/exampleapp"
	"github.com/idem-go/idem/store/sqlite"
)

func main() { exampleapp.Main(newHandler) }

// newHandler is the API: chi's router, authentication, then idem.
func newHandler(store *sqlite.Store) http.Handler {
	mw := idem.New(idem.Config{Store: store, Scope: exampleapp.Scope})
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Use(exampleapp.Authenticate) // idem's Scope reads the principal it found
	r.Route("/v1", func(r chi.Router) {
		// Keys required for this route whatever the method (SPEC §2's table requires
		// them for POST and PATCH already); r.Use(mw.Handler) would cover every route.
		r.With(mw.Route(idem.RouteOptions{Requirement: idem.KeyRequired})).
			Post("/charges", exampleapp.CreateCharge(store).ServeHTTP)
	})
	return r
}
