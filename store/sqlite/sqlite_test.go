package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin/admintest"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/sqlite"
	"github.com/idem-go/idem/store/storetest"
)

// openStore opens a migrated store on a fresh file in t's temporary directory, closed
// at cleanup, and returns it with the file's path.
func openStore(t testing.TB, cfg sqlite.Config) (*sqlite.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := sqlite.Open(context.Background(), path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, path
}

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{
		NewStore: func(t *testing.T) idemstore.Store {
			// The suite's cleanup cases delete expired records themselves.
			s, _ := openStore(t, sqlite.Config{DisableCleaner: true})
			createMarkerTable(t, s)
			return s
		},
		Tx: txHarness{},
		NewStoreWithCleaner: func(t *testing.T, cfg idem.CleanerConfig) (idemstore.Store, *idem.Cleaner) {
			s, _ := openStore(t, sqlite.Config{Cleaner: cfg})
			return s, s.Cleaner()
		},
	})
}

func TestAdminConformance(t *testing.T) {
	t.Parallel()
	admintest.Run(t, admintest.Harness{
		NewStore: func(t *testing.T) admintest.Store {
			s, _ := openStore(t, sqlite.Config{DisableCleaner: true})
			return s
		},
	})
}

// createMarkerTable creates the tiny application table of the §7 cases.
func createMarkerTable(t testing.TB, s *sqlite.Store) {
	t.Helper()
	if _, err := s.DB().Exec(`CREATE TABLE app_marker (name TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
}

// txHarness writes an application row and completes the record in one InTx
// transaction, as a handler would.
type txHarness struct{}

func (txHarness) WriteAndComplete(ctx context.Context, s idemstore.Store, p *idemstore.CompleteParams, marker string) error {
	st := s.(*sqlite.Store)
	// A transaction of the application's own that completes p by hand: no Handle.
	return st.InTx(idem.WithoutKey(ctx), func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO app_marker (name) VALUES (?)`, marker); err != nil {
			return err
		}
		return st.CompleteTx(ctx, tx, p)
	})
}

func (txHarness) MarkerCommitted(ctx context.Context, s idemstore.Store, marker string) (bool, error) {
	var n int
	err := s.(*sqlite.Store).DB().QueryRowContext(ctx, `SELECT count(*) FROM app_marker WHERE name = ?`, marker).Scan(&n)
	return n == 1, err
}

func (txHarness) InTx(ctx context.Context, s idemstore.Store, fn func(ctx context.Context, write func(marker string) error) error) error {
	return s.(*sqlite.Store).InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return fn(ctx, func(marker string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO app_marker (name) VALUES (?)`, marker)
			return err
		})
	})
}

func (txHarness) Step(ctx context.Context, s idemstore.Store, step string, fn func(ctx context.Context, write func(marker string) error) (string, error)) (string, error) {
	return sqlite.Step(ctx, s.(*sqlite.Store), step, func(ctx context.Context, tx *sql.Tx) (string, error) {
		return fn(ctx, func(marker string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO app_marker (name) VALUES (?)`, marker)
			return err
		})
	})
}
