package main

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/store/sqlite"
)

const charge = `{"amount": 2000, "currency": "usd"}`

// serve serves the example on a loopback port with a fresh database until t ends, and
// returns its URL and store.
func serve(t *testing.T, observer *observe.Observer) (string, *sqlite.Store) {
	store, err := open(t.Context(), filepath.Join(t.TempDir(), "payments.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	srv := httptest.NewServer(newHandler(store, observer))
	t.Cleanup(srv.Close)
	return srv.URL, store
}

// post sends POST /v1/charges with body and key ("" sends none), and returns the
// status, the Idempotent-Replayed header and the body.
func post(t *testing.T, base, key, body string) (status int, replayed, respBody string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk_test_example")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
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

// A duplicate POST is replayed (the same status and body, Idempotent-Replayed: true)
// and charges once; the key is required, refused with other parameters (409
// key_reused), and released by a 400 (SPEC §6). idem logs no warning or error on the
// way: gin writes the status line once the handler returned, after store.Respond
// answered, and that is no mistake of the handler's.
func TestADuplicateChargeIsReplayed(t *testing.T) {
	var logs syncBuffer
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))) // idem's Logger
	base, store := serve(t, nil)
	const key = "5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01"
	status, replayed, first := post(t, base, key, charge)
	if status != http.StatusCreated || replayed != "" || !strings.Contains(first, `"object":"charge"`) {
		t.Fatalf("first POST: %d (Idempotent-Replayed %q) %s; want 201 and a charge", status, replayed, first)
	}
	status, replayed, again := post(t, base, key, charge)
	if status != http.StatusCreated || replayed != "true" || again != first {
		t.Fatalf("duplicate POST: %d (Idempotent-Replayed %q) %s; want the replay of 201 %s", status, replayed, again, first)
	}
	var n int
	if err := store.DB().QueryRow(`SELECT count(*) FROM charges`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d charges in the database (%v), want 1", n, err)
	}
	if status, _, b := post(t, base, key, `{"amount": 3000, "currency": "usd"}`); status != http.StatusConflict || !strings.Contains(b, "key_reused") {
		t.Errorf("the key with other parameters: %d %s, want 409 key_reused", status, b)
	}
	if status, _, b := post(t, base, "", charge); status != http.StatusBadRequest || !strings.Contains(b, "key_required") {
		t.Errorf("a POST without a key: %d %s, want 400 key_required", status, b)
	}
	const other = "0b7e8c5a-4a1f-4d2e-8f3b-9c6d5e4f3a21"
	if status, _, b := post(t, base, other, `{"amount": -1, "currency": "usd"}`); status != http.StatusBadRequest {
		t.Errorf("invalid parameters: %d %s, want 400", status, b)
	}
	if status, replayed, b := post(t, base, other, charge); status != http.StatusCreated || replayed != "" {
		t.Errorf("the corrected request with the 400's key: %d (Idempotent-Replayed %q) %s; want a new 201", status, replayed, b)
	}
	if s := logs.String(); s != "" {
		t.Errorf("idem logged:\n%s", s)
	}
}

// syncBuffer is a bytes.Buffer for the server's goroutines to write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// idem's Observer sees the claims of the charges route labelled with the route gin
// matched, as idemRoute names it.
func TestClaimsAreLabelledWithGinsRoute(t *testing.T) {
	routes := make(chan string, 10)
	base, _ := serve(t, &observe.Observer{Claimed: func(e observe.ClaimEvent) { routes <- e.Route }})
	if status, _, b := post(t, base, "0d9a7c3e-58b4-4f0e-9b1d-6e2f8a4c7d35", charge); status != http.StatusCreated {
		t.Fatalf("POST: %d %s, want 201", status, b)
	}
	select {
	case route := <-routes:
		if route != "POST /v1/charges" {
			t.Errorf("the claim's route is %q, want %q", route, "POST /v1/charges")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the Observer saw no claim")
	}
}
