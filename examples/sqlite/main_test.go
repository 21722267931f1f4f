package main

import (
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/examples/internal/exampletest"
)

// The quick start, served on a loopback port, replays a duplicate POST (same status and
// body, Idempotent-Replayed: true) and charges once.
func TestADuplicateChargeIsReplayed(t *testing.T) {
	store, err := open(t.Context(), filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	srv := httptest.NewServer(newHandler(store))
	defer srv.Close()
	exampletest.CheckCharges(t, srv.URL, exampletest.CountRows(store.DB(), "charges"))
}
