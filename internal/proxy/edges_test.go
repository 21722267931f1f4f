package proxy_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/proxy"
)

// A WebSocket upgrade bypasses the middleware only where it can happen: on a route
// that requires a key, the offer is ignored and the request wants its key, so that a
// keyless GET with Upgrade: websocket does not sidestep --require-key on an upstream
// without a WebSocket endpoint there.
func TestAWebSocketOfferOnARouteThatRequiresAKeyIsRefusedWithoutOne(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.RequireKey = []string{"/v1/echo"} })
	offer := http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Authorization": {"Bearer tok_a"}}
	if got := b.sendHeader("GET", "/v1/echo", "", offer); got.status != http.StatusBadRequest || got.code() != idem.CodeKeyRequired {
		t.Fatalf("a keyless WebSocket GET on a --require-key route: %d %s, want 400 key_required", got.status, got.body)
	}
	if n := b.up.count("/v1/echo"); n != 0 {
		t.Fatalf("the upstream received it %d times", n)
	}
	offer.Set("Idempotency-Key", key1)
	first := b.sendHeader("GET", "/v1/echo", "", offer)
	retry := b.sendHeader("GET", "/v1/echo", "", offer)
	if first.status != http.StatusCreated || !retry.replayed() || b.up.count("/v1/echo") != 1 {
		t.Fatalf("a keyed one: %d, its retry replayed=%v, %d deliveries; want it protected as any other", first.status, retry.replayed(), b.up.count("/v1/echo"))
	}
	if h, _ := b.up.last(); h.Get("Upgrade") != "" {
		t.Fatalf("the upstream was offered the upgrade: %v", h)
	}
	// Elsewhere a WebSocket upgrade still passes (TestAProtocolUpgradeIsForwardedWithoutAClaim).
}

// Rails, Django REST framework and others route /v1/charges.json to the action of
// /v1/charges: a format suffix is one more spelling that --require-key matches.
func TestAFormatSuffixDoesNotSidestepRequireKey(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.RequireKey = []string{"POST /v1/charges", "POST /v1/orders/{id}/pay"} })
	for _, path := range []string{"/v1/charges.json", "/v1/charges.XML", "/V1/Charges.json/", "/v1/orders/ord_1/pay.json"} {
		if got := b.send("POST", path, "", "tok_a", `{}`); got.status != http.StatusBadRequest || got.code() != idem.CodeKeyRequired {
			t.Errorf("POST %s without a key: %d %s, want 400 key_required", path, got.status, got.body)
		}
	}
	if got := b.send("POST", "/v1/charges.backup-2026", "", "tok_a", `{}`); got.status != http.StatusOK {
		t.Errorf("POST /v1/charges.backup-2026 is not a format suffix: %d %s", got.status, got.body)
	}
}

// A 1xx response (103 Early Hints) goes to the client as it comes, with its own
// headers, which never reach the final response nor its replay.
func TestEarlyHintsHeadersNeverReachTheFinalResponseNorItsReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.send("POST", "/v1/early", key1, "tok_a", `{}`)
	retry := b.send("POST", "/v1/early", key1, "tok_a", `{}`)
	if first.status != http.StatusCreated || !retry.replayed() || retry.body != first.body {
		t.Fatalf("first %d %s, retry %d replayed=%v: want 201 and its replay", first.status, first.body, retry.status, retry.replayed())
	}
	if first.header.Get("Link") != "" || retry.header.Get("Link") != "" {
		t.Fatalf("the 103's Link reached the final response (%q) or its replay (%q)", first.header.Get("Link"), retry.header.Get("Link"))
	}
}

// A client that sends a key expects it honoured: a keyed PUT or DELETE, which the
// default --methods do not protect, is forwarded without idempotency and warned of, as a
// keyed WebSocket upgrade is; a keyed GET is not worth a warning.
func TestAKeyedRequestOfAnUnprotectedMethodIsWarnedOf(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, method := range []string{"PUT", "DELETE"} {
		if got := b.send(method, "/v1/echo", key1, "tok_a", `{}`); got.status != http.StatusCreated || got.replayed() {
			t.Fatalf("a keyed %s: %d %s, want it forwarded", method, got.status, got.body)
		}
		if !strings.Contains(b.logs.String(), "a "+method+" request carries an idempotency key, but its method is not protected") {
			t.Fatalf("no warning of the keyed %s:\n%s", method, b.logs)
		}
	}
	b.send("GET", "/v1/echo", key1, "tok_a", "")
	if strings.Contains(b.logs.String(), "a GET request carries") {
		t.Fatalf("a keyed GET was warned of:\n%s", b.logs)
	}
}

// A TRACE is never forwarded on a route that requires a key (Go's transport re-sends
// it by itself), and cannot be a protected method.
func TestATraceOnARouteThatRequiresAKeyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.RequireKey = []string{"/v1/echo"} })
	if got := b.send("TRACE", "/v1/echo", key1, "tok_a", ""); got.status != http.StatusMethodNotAllowed || got.code() != proxy.CodeMethodNotAllowed {
		t.Fatalf("TRACE: %d %s, want 405 method_not_allowed", got.status, got.body)
	}
	if n := b.up.count("/v1/echo"); n != 0 {
		t.Fatalf("the upstream received the TRACE %d times", n)
	}
	cfg := proxy.Config{Upstream: b.up.srvURL(), Idem: idem.Config{Store: b.store}, Methods: []string{"POST", "trace"}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Config.Methods") {
		t.Fatalf("Methods with TRACE: %v, want an error naming Config.Methods", err)
	}
}
