package main

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/store/redis/redistest"
)

const (
	charge = `{"amount": 2000, "currency": "usd"}`
	token  = "sk_test_example"
)

// serve serves the example on a loopback port with a private Redis and a fresh
// database until t ends, and returns its URL and app.
func serve(t *testing.T) (string, *app) {
	a, err := open(t.Context(), redistest.StartServer(t).URL(), filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	srv := httptest.NewServer(newHandler(a))
	t.Cleanup(srv.Close)
	return srv.URL, a
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
	req.Header.Set("Authorization", "Bearer "+token)
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

// The quick start on Redis: a duplicate POST is replayed (the same status and body,
// Idempotent-Replayed: true) and charges once; the key is required, refused with other
// parameters (409 key_reused), and released by a 400 (SPEC §6). And when Redis loses
// the record, the retry is answered the same response by the backstop, still with one
// charge.
func TestADuplicateChargeIsReplayedEvenAfterRedisLostTheRecord(t *testing.T) {
	base, a := serve(t)
	charges := func() int {
		t.Helper()
		var n int
		if err := a.db.QueryRow(`SELECT count(*) FROM charges`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const key = "5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01"
	status, replayed, first := post(t, base, key, charge)
	if status != http.StatusCreated || replayed != "" || !strings.Contains(first, `"object":"charge"`) {
		t.Fatalf("first POST: %d (Idempotent-Replayed %q) %s; want 201 and a charge", status, replayed, first)
	}
	status, replayed, again := post(t, base, key, charge)
	if status != http.StatusCreated || replayed != "true" || again != first {
		t.Fatalf("duplicate POST: %d (Idempotent-Replayed %q) %s; want the replay of 201 %s", status, replayed, again, first)
	}
	if n := charges(); n != 1 {
		t.Fatalf("%d charges in the database, want 1", n)
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

	sum := sha256.Sum256([]byte(token)) // the principal, as authenticate names it
	record := a.store.RecordKey(hex.EncodeToString(sum[:]), key)
	if n, err := a.store.Client().Del(t.Context(), record).Result(); err != nil || n != 1 {
		t.Fatalf("deleting the record from Redis: %d, %v", n, err)
	}
	before := charges()
	if status, _, again := post(t, base, key, charge); status != http.StatusCreated || again != first {
		t.Fatalf("retry after Redis lost the record: %d %s; want the first response %s", status, again, first)
	}
	if n := charges(); n != before {
		t.Fatalf("%d charges after the retry, want %d: it charged again", n, before)
	}
}
