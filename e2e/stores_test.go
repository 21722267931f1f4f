package e2e

import (
	"context"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/internal/testenv"
)

// storeKind names a store the tests run the command against.
type storeKind string

const (
	storeSQLite   storeKind = "sqlite"
	storePostgres storeKind = "postgres"
	storeRedis    storeKind = "redis"
)

// sqlStores are the stores that keep both the idempotency records and the payments data.
var sqlStores = []storeKind{storeSQLite, storePostgres}

// allStores adds Redis, which keeps the records only (the charges go to PostgreSQL):
// it has no SPEC §7 transaction, so exactly-once rests on the payments API's own
// backstop there.
var allStores = []storeKind{storeSQLite, storePostgres, storeRedis}

// storeFlags returns the flags that point a server at a fresh store of kind: --store,
// and --db where the store is not SQL. Redis needs no prefix of its own: records are
// scoped by each test's random tokens and keys.
func storeFlags(t testing.TB, kind storeKind) []string {
	t.Helper()
	if kind == storeRedis {
		return []string{"--store", testenv.RedisURL(t), "--db", postgresStore(t)}
	}
	return []string{"--store", newStore(t, kind)}
}

// newStore returns the --store URL of a fresh, empty store of kind for this test.
func newStore(t testing.TB, kind storeKind) string {
	t.Helper()
	switch kind {
	case storeSQLite:
		return sqliteStore(t)
	case storePostgres:
		return postgresStore(t)
	}
	t.Fatalf("unknown store kind %q", kind)
	return ""
}

// sqliteStore returns a sqlite: URL of a file in the test's temporary directory.
func sqliteStore(t testing.TB) string {
	return "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
}

// postgresStore creates a database of its own on the shared PostgreSQL server and
// returns its URL; the database is dropped at cleanup. A separate process can't be handed
// a transaction or a search_path as simply as a fresh database.
func postgresStore(t testing.TB) string {
	t.Helper()
	base := testenv.PostgresURL(t)
	name := testenv.Name("e2e_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		testenv.Unavailable(t, "connecting to PostgreSQL at %s: %v", base, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("CREATE DATABASE %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("dropping %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("DROP DATABASE %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}
