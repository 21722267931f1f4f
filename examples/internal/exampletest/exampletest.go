// Package exampletest checks a running framework example (examples/…): the
// behaviour of SPEC §5 through its routes, over a real connection.
package exampletest

import (
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/examples/internal/exampleapp"
	"github.com/idem-go/idem/store/sqlite"
)

// Store opens a fresh example database in t's temporary directory, closed when t
// ends.
func Store(t testing.TB) *sqlite.Store {
	t.Helper()
	store, err := exampleapp.Open(t.Context(), filepath.Join(t.TempDir(), "payments.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	return store
}

// CheckHandler serves the handler newHandler makes for a fresh database on a loopback
// port and runs CheckDuplicate against it.
func CheckHandler(t testing.TB, newHandler func(store *sqlite.Store) http.Handler) {
	t.Helper()
	store := Store(t)
	srv := httptest.NewServer(newHandler(store))
	defer srv.Close()
	CheckDuplicate(t, srv.URL, store)
}

// post sends POST /v1/charges with body, a bearer token and key ("" sends none), and
// returns the status, the Idempotent-Replayed header and the body.
func post(t testing.TB, baseURL, key, body string) (status int, replayed string, respBody string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, baseURL+"/v1/charges", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+Token)
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

// CheckDuplicate is CheckCharges for an example whose charges live in store's SQLite
// database, in the table charges.
func CheckDuplicate(t testing.TB, baseURL string, store *sqlite.Store) {
	t.Helper()
	CheckCharges(t, baseURL, CountRows(store.DB(), "charges"))
}

// CountRows returns a function that counts the rows of table in db, for CheckCharges.
func CountRows(db *sql.DB, table string) func(t testing.TB) int {
	return func(t testing.TB) int {
		t.Helper()
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM ` + table).Scan(&n); err != nil {
			t.Fatalf("counting the %s: %v", table, err)
		}
		return n
	}
}

// Token is the bearer token of every request the checks send.
const Token = "sk_test_example"

// FirstKey is the key of CheckCharges' first, duplicated POST.
const FirstKey = "5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01"

// CheckCharges sends POST /v1/charges to the example at baseURL twice with one key
// (FirstKey) and checks that the second answer is the first one replayed — the same
// status and body, with Idempotent-Replayed: true — and that charges counts one charge.
// It also checks that the key is required, that the key reused with other parameters
// is refused with 409 key_reused, and that a 400 (invalid parameters) releases its key:
// the corrected request with the same key executes (SPEC §6). It returns the first
// answer's body.
func CheckCharges(t testing.TB, baseURL string, charges func(t testing.TB) int) string {
	t.Helper()
	const key, body = FirstKey, `{"amount": 2000, "currency": "usd"}`
	status, replayed, first := post(t, baseURL, key, body)
	if status != http.StatusCreated || replayed != "" || !strings.Contains(first, `"object":"charge"`) {
		t.Fatalf("first POST: %d (Idempotent-Replayed %q) %s; want 201 and a charge", status, replayed, first)
	}
	status, replayed, again := post(t, baseURL, key, body)
	if status != http.StatusCreated || replayed != "true" || again != first {
		t.Fatalf("duplicate POST: %d (Idempotent-Replayed %q) %s; want the replay of 201 %s", status, replayed, again, first)
	}
	if n := charges(t); n != 1 {
		t.Fatalf("%d charges in the database, want 1", n)
	}
	if status, _, b := post(t, baseURL, key, `{"amount": 3000, "currency": "usd"}`); status != http.StatusConflict || !strings.Contains(b, "key_reused") {
		t.Errorf("the key with other parameters: %d %s, want 409 key_reused", status, b)
	}
	if status, _, b := post(t, baseURL, "", body); status != http.StatusBadRequest || !strings.Contains(b, "key_required") {
		t.Errorf("a POST without a key: %d %s, want 400 key_required", status, b)
	}
	const other = "0b7e8c5a-4a1f-4d2e-8f3b-9c6d5e4f3a21"
	if status, _, b := post(t, baseURL, other, `{"amount": -1, "currency": "usd"}`); status != http.StatusBadRequest {
		t.Errorf("invalid parameters: %d %s, want 400", status, b)
	}
	if status, replayed, b := post(t, baseURL, other, body); status != http.StatusCreated || replayed != "" {
		t.Errorf("the corrected request with the 400's key: %d (Idempotent-Replayed %q) %s; want a new 201", status, replayed, b)
	}
	return first
}

// Post sends POST /v1/charges with body and key as CheckCharges does, and returns the
// status, the Idempotent-Replayed header and the body.
func Post(t testing.TB, baseURL, key, body string) (status int, replayed string, respBody string) {
	t.Helper()
	return post(t, baseURL, key, body)
}
