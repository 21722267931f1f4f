package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/store/mysql"
)

const charge = `{"amount": 2000, "currency": "usd"}`

// serve serves the example on a loopback port with a database of its own until t ends,
// and returns its URL and store.
func serve(t *testing.T) (string, *mysql.Store) {
	store, err := open(t.Context(), testDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	srv := httptest.NewServer(newHandler(store))
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

// The quick start on MySQL: a duplicate POST is replayed (the same status and body, Idempotent-Replayed: true)
// and charges once; the key is required, refused with other parameters (409
// key_reused), and released by a 400 (SPEC §6).
func TestADuplicateChargeIsReplayed(t *testing.T) {
	base, store := serve(t)
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
}

// testDatabase returns the DSN of a new database on the test server
// (IDEM_TEST_MYSQL_URL, by default MariaDB or MySQL on 127.0.0.1:3306 as root),
// dropped when t ends. Without a server the test is skipped, or fails under CI=true.
func testDatabase(t *testing.T) string {
	dsn := os.Getenv("IDEM_TEST_MYSQL_URL")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		if os.Getenv("CI") == "true" { // CI must never pass by skipping
			t.Fatalf("no MySQL (set IDEM_TEST_MYSQL_URL): %v", err)
		}
		t.Skipf("no MySQL (set IDEM_TEST_MYSQL_URL): %v", err)
	}
	name := "example_" + strings.ToLower(rand.Text())
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.ExecContext(context.Background(), "DROP DATABASE "+name); err != nil {
			t.Errorf("dropping the test's database: %v", err)
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}
