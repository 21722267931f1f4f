package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
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
		Raw: rawSQLite,
		CopyResponse: func(t *testing.T, st idemstore.Store, scope, from, onto string) {
			_, err := st.(*sqlite.Store).DB().Exec(`UPDATE idem_records SET (response_status, response_headers, response_body) =
				(SELECT response_status, response_headers, response_body FROM idem_records WHERE scope = ?1 AND key = ?2)
				WHERE scope = ?1 AND key = ?3`, scope, from, onto)
			if err != nil {
				t.Fatal(err)
			}
		},
	})
}

// rawSQLite returns what the store holds: its database file and write-ahead log, byte
// for byte, and the rows of its records' table.
func rawSQLite(t *testing.T, st idemstore.Store) []byte {
	t.Helper()
	db := st.(*sqlite.Store).DB()
	var path string
	if err := db.QueryRow(`SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&path); err != nil || path == "" {
		t.Fatalf("the database's file: %q, %v", path, err)
	}
	var raw []byte
	for _, f := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		raw = append(raw, b...)
	}
	rows, err := db.Query(`SELECT * FROM idem_records`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			raw = fmt.Append(raw, v, "\n")
			if b, ok := v.([]byte); ok {
				raw = append(raw, b...)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return raw
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
