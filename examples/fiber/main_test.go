package main

import (
	"net"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idem-go/idem/examples/internal/exampletest"
)

// The example, served on a loopback port, replays a duplicate POST (same status and
// body, Idempotent-Replayed: true) and charges once.
func TestADuplicateChargeIsReplayed(t *testing.T) {
	store := exampletest.Store(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := newApp(store)
	served := make(chan error, 1)
	go func() { served <- app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	defer func() {
		if err := app.Shutdown(); err != nil {
			t.Error(err)
		}
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	exampletest.CheckDuplicate(t, "http://"+ln.Addr().String(), store)
}
