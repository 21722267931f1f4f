package main

import (
	"net/http/httptest"
	"testing"

	"github.com/idem-go/idem/examples/internal/exampletest"
	"github.com/idem-go/idem/internal/pgtest"
)

// The quick start on PostgreSQL through database/sql, served on a loopback port in a schema of its own,
// replays a duplicate POST (same status and body, Idempotent-Replayed: true) and
// charges once.
func TestADuplicateChargeIsReplayed(t *testing.T) {
	dbURL, schema := pgtest.Schema(t)
	store, err := open(t.Context(), pgtest.SearchPathURL(t, dbURL, schema))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	srv := httptest.NewServer(newHandler(store))
	defer srv.Close()
	exampletest.CheckCharges(t, srv.URL, exampletest.CountRows(store.DB(), "charges"))
}
