package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/storetest"
)

// multiProcess describes the store to the suite's multi-process runs, which re-execute
// this test binary. The DSN names the test's schema through search_path, so these runs
// also cover Config.Schema "" (the connection's search_path).
func multiProcess() storetest.MultiProcess {
	return storetest.MultiProcess{
		NewDSN: func(t testing.TB) string {
			dbURL, schema := pgtest.Schema(t)
			return pgtest.SearchPathURL(t, dbURL, schema)
		},
		Open: func(t testing.TB, dsn string) idemstore.Store {
			// Few connections per process: the server is shared with other tests.
			s, err := postgres.Open(context.Background(), dsn, postgres.Config{MaxConns: 4})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(s.Close)
			return s
		},
		Migrate: func(dsn string) error {
			s, err := postgres.Open(context.Background(), dsn, postgres.Config{MaxConns: 2})
			if err != nil {
				return err
			}
			defer s.Close()
			return s.Migrate(context.Background())
		},
		CheckSchema: func(t testing.TB, dsn string) {
			conn, err := pgx.Connect(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			var n, distinct int
			err = conn.QueryRow(context.Background(),
				`SELECT count(*), count(DISTINCT version) FROM idem_migrations`).Scan(&n, &distinct)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 || n != distinct {
				t.Errorf("idem_migrations holds %d rows for %d versions, want each version once", n, distinct)
			}
		},
	}
}

func TestClaimIsExclusiveAcrossProcesses(t *testing.T) {
	if !storetest.IsChild() {
		t.Parallel()
	}
	storetest.RunMultiProcess(t, multiProcess())
}

func TestCompletersInManyProcessesResumeEachRecordOnce(t *testing.T) {
	if !storetest.IsChild() {
		t.Parallel()
	}
	storetest.RunCompleterMultiProcess(t, multiProcess())
}

func TestMigrateConcurrentlyAcrossProcesses(t *testing.T) {
	if !storetest.IsChild() {
		t.Parallel()
	}
	storetest.RunMigrateConcurrently(t, multiProcess())
}

// TestMigrateCreatesSchemaConcurrently has several processes migrate a configured
// schema that does not exist yet: they race to create it, under the advisory lock.
func TestMigrateCreatesSchemaConcurrently(t *testing.T) {
	if !storetest.IsChild() {
		t.Parallel()
	}
	const sep = "#schema="
	open := func(dsn string) (*postgres.Store, error) {
		i := strings.LastIndex(dsn, sep)
		dbURL, schema := dsn[:i], dsn[i+len(sep):]
		return postgres.Open(context.Background(), dbURL, postgres.Config{Schema: schema, MaxConns: 2})
	}
	storetest.RunMigrateConcurrently(t, storetest.MultiProcess{
		NewDSN: func(t testing.TB) string {
			dbURL, parent := pgtest.Schema(t)
			schema := parent + "_fresh"
			t.Cleanup(func() { pgtest.Exec(t, dbURL, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") })
			return dbURL + sep + schema
		},
		Open: func(t testing.TB, dsn string) idemstore.Store {
			s, err := open(dsn)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(s.Close)
			return s
		},
		Migrate: func(dsn string) error {
			s, err := open(dsn)
			if err != nil {
				return err
			}
			defer s.Close()
			return s.Migrate(context.Background())
		},
	})
}
