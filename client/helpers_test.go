package client

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/payments"
	"github.com/idem-go/idem/internal/payments/paymentstest"
)

var faultSeedFlag = flag.Uint64("faultseed", 0, "seed of the fault-injecting proxy (0 picks one at random and logs it)")

// faultSeed returns the seed of this run's faults and logs how to rerun with it.
func faultSeed(t *testing.T) uint64 {
	seed := *faultSeedFlag
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("fault seed %d (rerun: go test -race ./client/ -run '^%s$' -faultseed=%d)", seed, t.Name(), seed)
	return seed
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// countingHandler is a slog.Handler that counts the records whose message is msg.
type countingHandler struct {
	msg string
	n   *atomic.Int64
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h countingHandler) WithGroup(string) slog.Handler            { return h }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}

// testToken is the bearer token of every test request: one principal.
const testToken = "sk_test_client"

// paymentsAPI is the payments API of SPEC §11 with an SQLite store, mounted
// in-process as `idem payments` wires it (cmd/idem/payments.go).
type paymentsAPI struct {
	url  string // http://127.0.0.1:port
	addr string // 127.0.0.1:port
	// requests counts the requests the server received.
	requests atomic.Int64
}

func newPaymentsAPI(t *testing.T, profile idem.Profile) *paymentsAPI {
	t.Helper()
	h := paymentstest.Handler(t, func(c *payments.Config) { c.Profile = profile })
	api := &paymentsAPI{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api.requests.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	api.url = ts.URL
	api.addr = strings.TrimPrefix(ts.URL, "http://")
	return api
}

// chargeRequest returns POST /v1/charges at base with a JSON body.
func chargeRequest(t *testing.T, base, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	return req
}

// chargeJSON is the part of a charge the tests read.
type chargeJSON struct {
	ID             string  `json:"id"`
	Object         string  `json:"object"`
	Amount         int64   `json:"amount"`
	CustomerID     *string `json:"customer_id"`
	IdempotencyKey *string `json:"idempotency_key"`
}

// listCharges lists the test principal's charges directly at the API (no proxy, no
// retries).
func listCharges(t *testing.T, api *paymentsAPI) []chargeJSON {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, api.url+"/v1/charges?limit=1000", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data    []chargeJSON `json:"data"`
		HasMore bool         `json:"has_more"`
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /v1/charges: %d %s", resp.StatusCode, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if list.HasMore {
		t.Fatalf("GET /v1/charges?limit=1000: has_more, want every charge in one page")
	}
	return list.Data
}

// frozenClock is a clock that only moves when told to.
type frozenClock struct{ now atomic.Int64 }

func newFrozenClock() *frozenClock {
	c := &frozenClock{}
	c.now.Store(time.Unix(1_700_000_000, 0).UnixNano())
	return c
}

func (c *frozenClock) Now() time.Time             { return time.Unix(0, c.now.Load()) }
func (c *frozenClock) Advance(d time.Duration)    { c.now.Add(int64(d)) }
func noBackoff(int, *http.Response) time.Duration { return 0 }
