// Package paymentstest serves the payments API (SPEC §11) in-process on a SQLite file of
// the test's own, wired as `idem payments` wires it, for the tests of packages that talk
// to the API: the client, the load tool and the command.
package paymentstest

import (
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/internal/payments"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/sqlite"
)

// Handler returns the payments API over a fresh, migrated SQLite store in t's temporary
// directory, closed at t's cleanup. mod, when not nil, adjusts the Config before the
// server is built (Store, DB and a discarding Logger are already set).
func Handler(t testing.TB, mod func(*payments.Config)) http.Handler {
	t.Helper()
	ctx := testenv.Context(t)
	quiet := slog.New(slog.DiscardHandler)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	db := payments.NewSQLiteStoreDB(st)
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := payments.Config{Store: st, DB: db, Logger: quiet}
	if mod != nil {
		mod(&cfg)
	}
	return payments.New(cfg).Handler()
}
