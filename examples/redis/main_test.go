package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/examples/internal/exampletest"
	"github.com/idem-go/idem/store/redis/redistest"
)

// The quick start on Redis, served on a loopback port with a private Redis, replays a
// duplicate POST (same status and body, Idempotent-Replayed: true) and charges once;
// and when Redis loses the record, the retry is answered the same response by the
// backstop, still with one charge.
func TestADuplicateChargeIsReplayedEvenAfterRedisLostTheRecord(t *testing.T) {
	a, err := open(t.Context(), redistest.StartServer(t).URL(), filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	srv := httptest.NewServer(newHandler(a))
	defer srv.Close()
	charges := exampletest.CountRows(a.db, "charges")
	first := exampletest.CheckCharges(t, srv.URL, charges)

	sum := sha256.Sum256([]byte(exampletest.Token))
	record := a.store.RecordKey(hex.EncodeToString(sum[:]), exampletest.FirstKey)
	if n, err := a.store.Client().Del(t.Context(), record).Result(); err != nil || n != 1 {
		t.Fatalf("deleting the record from Redis: %d, %v", n, err)
	}
	before := charges(t)
	status, _, again := exampletest.Post(t, srv.URL, exampletest.FirstKey, `{"amount": 2000, "currency": "usd"}`)
	if status != http.StatusCreated || again != first {
		t.Fatalf("retry after Redis lost the record: %d %s; want the first response %s", status, again, first)
	}
	if n := charges(t); n != before {
		t.Fatalf("%d charges after the retry, want %d: it charged again", n, before)
	}
}
