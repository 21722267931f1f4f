// A charges API in Fiber v2 with Fiber v2's idempotency middleware, mounted as its
// documentation says (app.Use(idempotency.New(…))), its records on Redis through
// gofiber/storage/redis (Config.Storage), for the tests of `idem check` against
// third-party libraries (internal/check, thirdparty_test.go). Two processes on one
// Redis are two replicas of one API. Its own module, so that idem's go.mod does not
// require Fiber; the test builds it with the go command (the module proxy, or the
// module cache).
//
//	go run . [-addr 127.0.0.1:0] [-redis redis://127.0.0.1:6379/0] [-work 200ms]
//
// It prints "listening on 127.0.0.1:PORT" once it accepts connections, and
// "handling KEY" when the handler of a charge with that X-Idempotency-Key starts.
//
// POST /v1/charges {"amount": N, "currency": "usd"} with Authorization: Bearer <token>
// creates a charge, taking -work (a card processor): 201 with Location; a body that
// is not a charge is 400. GET /v1/charges lists the token's charges.
package main

import (
	"crypto/rand"
	"flag"
	"fmt"
	"log"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/idempotency"
	"github.com/gofiber/storage/redis/v3"
)

type charge struct {
	ID       string `json:"id"`
	Object   string `json:"object"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	redisURL := flag.String("redis", "redis://127.0.0.1:6379/0", "the Redis of the middleware's storage")
	work := flag.Duration("work", 200*time.Millisecond, "how long a charge takes")
	flag.Parse()

	var mu sync.Mutex
	charges := map[string][]charge{}
	principal := func(c *fiber.Ctx) string {
		tok, _ := strings.CutPrefix(c.Get("Authorization"), "Bearer ")
		return tok
	}

	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(idempotency.New(idempotency.Config{Storage: redis.New(redis.Config{URL: *redisURL})}))
	app.Post("/v1/charges", func(c *fiber.Ctx) error {
		fmt.Println("handling", c.Get("X-Idempotency-Key"))
		who := principal(c)
		if who == "" {
			return c.Status(fiber.StatusUnauthorized).JSON(fiber.Map{"error": fiber.Map{"code": "unauthenticated"}})
		}
		var p struct {
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}
		if err := c.BodyParser(&p); err != nil || p.Amount <= 0 || len(p.Currency) != 3 {
			return c.Status(fiber.StatusBadRequest).JSON(fiber.Map{"error": fiber.Map{"code": "parameter_invalid"}})
		}
		time.Sleep(*work)
		ch := charge{ID: "ch_" + rand.Text()[:16], Object: "charge", Amount: p.Amount, Currency: p.Currency}
		mu.Lock()
		charges[who] = append(charges[who], ch)
		mu.Unlock()
		c.Location("/v1/charges/" + ch.ID)
		return c.Status(fiber.StatusCreated).JSON(ch)
	})
	app.Get("/v1/charges", func(c *fiber.Ctx) error {
		mu.Lock()
		defer mu.Unlock()
		return c.JSON(fiber.Map{"object": "list", "data": append([]charge{}, charges[principal(c)]...)})
	})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listening on", ln.Addr())
	log.Fatal(app.Listener(ln))
}
