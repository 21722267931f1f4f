package mysql_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/mysqltest"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/storetest"
)

// multiProcess describes the store to the suite's multi-process runs, which re-execute
// this test binary: every child opens the parent's fresh database.
func multiProcess() storetest.MultiProcess {
	return storetest.MultiProcess{
		NewDSN: func(t testing.TB) string { return mysqltest.Database(t, nil) },
		Open: func(t testing.TB, dsn string) idemstore.Store {
			// Few connections per process: the server is shared with other tests.
			s, err := mysql.Open(context.Background(), dsn, mysql.Config{MaxOpenConns: 4})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Migrate: func(dsn string) error {
			s, err := mysql.Open(context.Background(), dsn, mysql.Config{MaxOpenConns: 2, DisableCleaner: true})
			if err != nil {
				return err
			}
			defer s.Close()
			return s.Migrate(context.Background())
		},
		CheckSchema: func(t testing.TB, dsn string) {
			db := mysqltest.Open(t, dsn)
			defer db.Close()
			var n, distinct int
			if err := db.QueryRow(`SELECT count(*), count(DISTINCT version) FROM idem_migrations`).Scan(&n, &distinct); err != nil {
				t.Fatal(err)
			}
			if want := mysql.MigrationCount(t); n != want || distinct != want {
				t.Errorf("idem_migrations holds %d rows for %d versions, want each of the %d migrations once", n, distinct, want)
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

// TestProcessesMigratingOneFreshDatabaseAtOnceAllSucceed: MySQL's DDL commits by
// itself, so only the named lock (GET_LOCK) keeps concurrent migrations from running
// one statement twice or recording a version twice.
func TestProcessesMigratingOneFreshDatabaseAtOnceAllSucceed(t *testing.T) {
	if !storetest.IsChild() {
		t.Parallel()
	}
	storetest.RunMigrateConcurrently(t, multiProcess())
}
