// Package mysqltest finds the MySQL or MariaDB server that tests talk to and hands each
// test a database of its own. The server is at IDEM_TEST_MYSQL_URL (a mysql:// URL or
// the driver's DSN) or DefaultDSN; when it is absent a test skips with a clear message,
// except under CI=true, where it fails.
package mysqltest

import (
	"context"
	"database/sql"
	"net"
	"os"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql" // also registers the driver "mysql"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/mysql"
)

// DefaultDSN is the test server's address when IDEM_TEST_MYSQL_URL is unset: the
// MariaDB of every machine here and of CI (.ci/run starts it).
const DefaultDSN = "root@tcp(127.0.0.1:3306)/test"

// DSN returns the test server's DSN (IDEM_TEST_MYSQL_URL or DefaultDSN) after checking
// that it accepts TCP connections.
func DSN(t testing.TB) string {
	t.Helper()
	raw := os.Getenv("IDEM_TEST_MYSQL_URL")
	if raw == "" {
		raw = DefaultDSN
	}
	dc, err := mysql.ParseDSN(raw)
	if err != nil {
		t.Fatalf("IDEM_TEST_MYSQL_URL: %v", err)
	}
	conn, err := net.DialTimeout(dc.Net, dc.Addr, 2*time.Second)
	if err != nil {
		testenv.Unavailable(t, "MySQL is not reachable at %s (set IDEM_TEST_MYSQL_URL): %v", dc.Addr, err)
		return ""
	}
	conn.Close()
	return raw
}

// Database creates a fresh database on the test server, dropped when t ends, and
// returns the DSN (in the driver's form) that names it, with params set on top of the
// server's DSN (a session variable such as transaction_isolation, say).
func Database(t testing.TB, params map[string]string) string {
	t.Helper()
	dc, err := mysql.ParseDSN(DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.Name("idem_test_")
	Exec(t, dc.FormatDSN(), "CREATE DATABASE "+name)
	t.Cleanup(func() { Exec(t, dc.FormatDSN(), "DROP DATABASE IF EXISTS "+name) })
	dc.DBName = name
	if len(params) > 0 && dc.Params == nil {
		dc.Params = map[string]string{}
	}
	for k, v := range params {
		dc.Params[k] = v
	}
	return dc.FormatDSN()
}

// Exec runs statements on a connection of its own to the server of dsn.
func Exec(t testing.TB, dsn string, statements ...string) {
	t.Helper()
	db := Open(t, dsn)
	defer db.Close()
	for _, s := range statements {
		if _, err := db.ExecContext(context.Background(), s); err != nil {
			t.Fatalf("mysqltest: %s: %v", s, err)
		}
	}
}

// Open opens a plain pool of one connection to dsn, as the store would (its
// parameters set), for a test's own statements behind the store's back.
func Open(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	dc, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	connector, err := gomysql.NewConnector(dc)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(1)
	return db
}

// IsolationParam is the session variable that sets a connection's isolation level on
// the server of dsn: tx_isolation on MariaDB before 11.1, transaction_isolation on
// MySQL and later MariaDB. Its value is quoted for the DSN, as 'READ-COMMITTED'.
func IsolationParam(t testing.TB, dsn string) string {
	t.Helper()
	db := Open(t, dsn)
	defer db.Close()
	var v string
	if err := db.QueryRow(`SELECT @@transaction_isolation`).Scan(&v); err != nil {
		return "tx_isolation"
	}
	return "transaction_isolation"
}
