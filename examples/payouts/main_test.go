package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/postgres"
)

// payoutsAPI is the example served in process on a schema of its own, its bank (a fake
// one) in process too, until the test ends.
type payoutsAPI struct {
	url   string
	store *postgres.Store
	mw    *idem.Middleware
}

func serve(t *testing.T, bank http.Handler) *payoutsAPI {
	t.Helper()
	store, err := open(t.Context(), testDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	bankSrv := httptest.NewServer(bank)
	t.Cleanup(bankSrv.Close)
	a := &app{store: store, bank: newBankClient(bankSrv.URL)}
	handler, mw := a.routes(idem.DefaultLease)
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return &payoutsAPI{url: srv.URL, store: store, mw: mw}
}

// account creates an account with balance.
func (api *payoutsAPI) account(t *testing.T, id string, balance int64) {
	t.Helper()
	if _, err := api.store.Pool().Exec(t.Context(), `INSERT INTO accounts (id, balance) VALUES ($1, $2)`, id, balance); err != nil {
		t.Fatal(err)
	}
}

func (api *payoutsAPI) balance(t *testing.T, id string) int64 {
	t.Helper()
	var b int64
	if err := api.store.Pool().QueryRow(t.Context(), `SELECT balance FROM accounts WHERE id = $1`, id).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

// post sends POST /v1/payouts once, without retrying, and returns the status, the
// Idempotent-Replayed header and the body.
func (api *payoutsAPI) post(t *testing.T, key, body string) (status int, replayed, respBody string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, api.url+"/v1/payouts", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk_test_example")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)
}

func payoutBody(account string, amount int64, destination, reference string) string {
	b, _ := json.Marshal(payoutRequest{Account: account, Amount: amount, Currency: "eur", Destination: destination, Reference: reference})
	return string(b)
}

// A payout reserves the funds, transfers them once and answers 201; its retry is the
// replay. Insufficient funds reserve nothing and free the key (422). A bank that
// declines ends the payout with a stored 402 and the funds back.
func TestAPayoutTransfersOnceAndIsReplayed(t *testing.T) {
	bank := newFakeBank(0, 0)
	api := serve(t, bank)
	api.account(t, "acc_1", 10_000)

	const key = "7a1f4c2e-5b6d-4e8f-9a0b-1c2d3e4f5a60"
	body := payoutBody("acc_1", 4000, "DE89370400440532013000", "invoice-1")
	status, replayed, first := api.post(t, key, body)
	if status != http.StatusCreated || replayed != "" || !strings.Contains(first, `"status":"paid"`) || !strings.Contains(first, `"transfer_id":"tr_`) {
		t.Fatalf("first POST: %d (replayed %q) %s; want 201 and a paid payout", status, replayed, first)
	}
	status, replayed, again := api.post(t, key, body)
	if status != http.StatusCreated || replayed != "true" || again != first {
		t.Fatalf("retry: %d (replayed %q) %s; want the replay of %s", status, replayed, again, first)
	}
	if n := len(bank.madeTransfers()); n != 1 || api.balance(t, "acc_1") != 6000 {
		t.Fatalf("%d transfers, balance %d; want 1 and 6000", n, api.balance(t, "acc_1"))
	}

	const poor = "0c9d8e7f-6a5b-4c3d-8e1f-2a3b4c5d6e7f"
	if status, _, b := api.post(t, poor, payoutBody("acc_1", 50_000, "DE89370400440532013000", "invoice-2")); status != http.StatusUnprocessableEntity || !strings.Contains(b, "insufficient_funds") {
		t.Fatalf("a payout over the balance: %d %s, want 422 insufficient_funds", status, b)
	}
	if status, _, b := api.post(t, poor, payoutBody("acc_1", 500, "DE89370400440532013000", "invoice-2")); status != http.StatusCreated {
		t.Fatalf("the key of the 422 with a payout the balance covers: %d %s, want 201 (the 422 freed it)", status, b)
	}

	const declined = "3e4f5a6b-7c8d-4e9f-8a0b-1c2d3e4f5a6b"
	before := api.balance(t, "acc_1")
	status, _, b := api.post(t, declined, payoutBody("acc_1", 1000, "XX00", "invoice-3"))
	if status != http.StatusPaymentRequired || !strings.Contains(b, "transfer_declined") || api.balance(t, "acc_1") != before {
		t.Fatalf("a declined transfer: %d %s, balance %d; want 402 transfer_declined and the funds back (%d)", status, b, api.balance(t, "acc_1"), before)
	}
	requests := bank.requests.Load()
	if status, replayed, again := api.post(t, declined, payoutBody("acc_1", 1000, "XX00", "invoice-3")); status != http.StatusPaymentRequired || replayed != "true" || again != b ||
		bank.requests.Load() != requests {
		t.Fatalf("the declined payout's retry: %d (replayed %q) %s; want the 402 replayed without asking the bank", status, replayed, again)
	}
}

// downBank is a fake bank that answers 503 while down is set.
type downBank struct {
	*fakeBank
	down atomic.Bool
}

func (b *downBank) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if b.down.Load() {
		bankReply(w, http.StatusServiceUnavailable, `{"error":"down"}`)
		return
	}
	b.fakeBank.ServeHTTP(w, r)
}

// With the bank down the payout answers 503 after reserving the funds; the client gives
// up, and the completer finishes the payout once the bank is back: one reservation, one
// transfer, and the client's late retry gets the 201.
func TestTheCompleterFinishesAPayoutWhoseClientGaveUp(t *testing.T) {
	bank := &downBank{fakeBank: newFakeBank(0, 0)}
	bank.down.Store(true)
	api := serve(t, bank)
	api.account(t, "acc_1", 10_000)

	const key = "5d6e7f80-91a2-4b3c-8d4e-5f6a7b8c9d0e"
	body := payoutBody("acc_1", 2500, "DE89370400440532013000", "invoice-9")
	if status, _, b := api.post(t, key, body); status != http.StatusServiceUnavailable || !strings.Contains(b, "bank_unavailable") {
		t.Fatalf("with the bank down: %d %s, want 503 bank_unavailable", status, b)
	}
	if api.balance(t, "acc_1") != 7500 {
		t.Fatalf("balance %d after the 503, want the funds reserved (7500)", api.balance(t, "acc_1"))
	}
	bank.down.Store(false)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if p := idem.NewCompleter(api.mw.Guard(), idem.CompleterConfig{}).Pass(ctx); p.Resumed != 1 || p.Err != nil {
		t.Fatalf("completer pass %+v, want the payout resumed", p)
	}
	status, replayed, b := api.post(t, key, body)
	if status != http.StatusCreated || replayed != "true" || !strings.Contains(b, `"status":"paid"`) {
		t.Fatalf("the late retry: %d (replayed %q) %s, want the completed payout replayed", status, replayed, b)
	}
	if n := len(bank.madeTransfers()); n != 1 || api.balance(t, "acc_1") != 7500 {
		t.Fatalf("%d transfers, balance %d; want 1 and 7500", n, api.balance(t, "acc_1"))
	}
}

// testDatabase returns the URL of a new schema in the test database
// (IDEM_TEST_POSTGRES_URL, by default PostgreSQL on 127.0.0.1:5432), dropped when t
// ends, with a pool of at most 4 connections. Without a server the test is skipped, or
// fails under CI=true.
func testDatabase(t *testing.T) string {
	dbURL := os.Getenv("IDEM_TEST_POSTGRES_URL")
	if dbURL == "" {
		dbURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		if os.Getenv("CI") == "true" { // CI must never pass by skipping
			t.Fatalf("no PostgreSQL (set IDEM_TEST_POSTGRES_URL): %v", err)
		}
		t.Skipf("no PostgreSQL (set IDEM_TEST_POSTGRES_URL): %v", err)
	}
	schema := pgx.Identifier{"example_" + strings.ToLower(rand.Text())}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping the test's schema: %v", err)
		}
		_ = conn.Close(ctx)
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("pool_max_conns", "4")
	u.RawQuery = q.Encode()
	return u.String()
}
