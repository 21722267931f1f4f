package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin/admintest"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/mysqltest"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/storetest"
)

// isolationLevels are the levels the suites run at: MySQL's default and the one many
// MySQL deployments choose.
var isolationLevels = []string{"REPEATABLE-READ", "READ-COMMITTED"}

// openStore opens a migrated store with cfg in a fresh database of its own, whose
// connections start at the given isolation level ("" for the server's default), with
// the tiny application table of the §7 cases; closed and dropped when t ends.
func openStore(t testing.TB, cfg mysql.Config, isolation string) *mysql.Store {
	t.Helper()
	var params map[string]string
	if isolation != "" {
		params = map[string]string{mysqltest.IsolationParam(t, mysqltest.DSN(t)): "'" + isolation + "'"}
	}
	dsn := mysqltest.Database(t, params)
	if cfg.MaxOpenConns == 0 {
		cfg.MaxOpenConns = 4 // the server is shared with other tests
	}
	s, err := mysql.Open(context.Background(), dsn, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := s.DB().Exec(`CREATE TABLE app_marker (name VARCHAR(255) PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if isolation != "" {
		var got string
		if err := s.DB().QueryRow(`SELECT @@tx_isolation`).Scan(&got); err != nil || got != isolation {
			if err2 := s.DB().QueryRow(`SELECT @@transaction_isolation`).Scan(&got); err2 != nil || got != isolation {
				t.Fatalf("the store's connections run at %q (%v), want %q", got, err, isolation)
			}
		}
	}
	return s
}

// TestConformance runs the store conformance suite at REPEATABLE READ and at READ
// COMMITTED.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, level := range isolationLevels {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, storetest.Harness{
				NewStore: func(t *testing.T) idemstore.Store {
					return openStore(t, mysql.Config{DisableCleaner: true}, level)
				},
				Tx: appTable{},
				NewStoreWithCleaner: func(t *testing.T, cfg idem.CleanerConfig) (idemstore.Store, *idem.Cleaner) {
					s := openStore(t, mysql.Config{Cleaner: cfg}, level)
					return s, s.Cleaner()
				},
				Raw:          rawRows,
				CopyResponse: copyResponse,
			})
		})
	}
}

// TestAdminConformance runs the admin conformance suite as TestConformance runs the
// store's.
func TestAdminConformance(t *testing.T) {
	t.Parallel()
	for _, level := range isolationLevels {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			admintest.Run(t, admintest.Harness{
				NewStore: func(t *testing.T) admintest.Store {
					return openStore(t, mysql.Config{DisableCleaner: true}, level)
				},
			})
		})
	}
}

// copyResponse copies the response of (scope, from) onto (scope, onto), behind the
// store's back.
func copyResponse(t *testing.T, st idemstore.Store, scope, from, onto string) {
	_, err := st.(*mysql.Store).DB().Exec(`UPDATE idem_records r JOIN idem_records f ON f.scope = r.scope AND f.key = ?
		SET r.response_status = f.response_status, r.response_headers = f.response_headers, r.response_body = f.response_body
		WHERE r.scope = ? AND r.key = ?`, from, scope, onto)
	if err != nil {
		t.Fatal(err)
	}
}

// rawRows returns what the store holds: every row of its records' table, each column
// as the server sends it.
func rawRows(t *testing.T, st idemstore.Store) []byte {
	t.Helper()
	rows, err := st.(*mysql.Store).DB().Query(`SELECT * FROM idem_records`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var raw []byte
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

// appTable is the conformance suite's §7 harness: an application table next to the
// records, written in the same transaction as the fenced completion.
type appTable struct{}

func insertMarker(ctx context.Context, tx *sql.Tx, marker string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO app_marker (name) VALUES (?)`, marker)
	return err
}

func (appTable) WriteAndComplete(ctx context.Context, s idemstore.Store, p *idemstore.CompleteParams, marker string) error {
	st := s.(*mysql.Store)
	// A transaction of the application's own that completes p by hand: no Handle.
	return st.InTx(idem.WithoutKey(ctx), func(ctx context.Context, tx *sql.Tx) error {
		if err := insertMarker(ctx, tx, marker); err != nil {
			return err
		}
		return st.CompleteTx(ctx, tx, p)
	})
}

func (appTable) MarkerCommitted(ctx context.Context, s idemstore.Store, marker string) (bool, error) {
	var n int
	err := s.(*mysql.Store).DB().QueryRowContext(ctx, `SELECT count(*) FROM app_marker WHERE name = ?`, marker).Scan(&n)
	return n == 1, err
}

func (appTable) InTx(ctx context.Context, s idemstore.Store, fn func(ctx context.Context, write func(marker string) error) error) error {
	return s.(*mysql.Store).InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return fn(ctx, func(marker string) error { return insertMarker(ctx, tx, marker) })
	})
}

func (appTable) Step(ctx context.Context, s idemstore.Store, step string, fn func(ctx context.Context, write func(marker string) error) (string, error)) (string, error) {
	return mysql.Step(ctx, s.(*mysql.Store), step, func(ctx context.Context, tx *sql.Tx) (string, error) {
		return fn(ctx, func(marker string) error { return insertMarker(ctx, tx, marker) })
	})
}
