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
// r.Context() (store.InTx does).
//
//	go run . -addr 127.0.0.1:8080 -db payments.db
//	curl -i localhost:8080/v1/charges -H 'Authorization: Bearer sk_test_1' \
//	    -H 'Idempotency-Key: 5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01' \
//	    -H 'Content-Type: application/json' -d '{"amount": 2000, "currency": "usd"}'
package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/adaptor"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/examples/internal/exampleapp"
	"github.com/idem-go/idem/store/sqlite"
)

func main() {
	addr, db := exampleapp.Flags()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	store, err := exampleapp.Open(ctx, db)
	if err != nil {
		exampleapp.Fatal(err)
	}
	defer store.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		exampleapp.Fatal(err)
	}
	slog.Info("serving POST /v1/charges", "addr", ln.Addr().String(), "db", db)
	app := newApp(store)
	go func() {
		<-ctx.Done()
		_ = app.ShutdownWithTimeout(30 * time.Second)
	}()
	if err := app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}); err != nil {
		exampleapp.Fatal(err)
	}
}

// newApp is the API: a Fiber app whose POST /v1/charges is the net/http handler
// behind authentication and idem.
func newApp(store *sqlite.Store) *fiber.App {
	mw := idem.New(idem.Config{Store: store, Scope: exampleapp.Scope})
	app := fiber.New()
	app.Post("/v1/charges", adaptor.HTTPHandler(exampleapp.Authenticate(mw.Handler(exampleapp.CreateCharge(store)))))
	return app
}
