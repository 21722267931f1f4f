package e2e

import (
	"context"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
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

// The e2e tests' share of the shared PostgreSQL server. The README's test command must
// pass against a stock server (max_connections = 100) with other clients on it (say
// 40 connections), whatever -parallel is: each `idem payments` process pools at most
// pgPoolSize connections (pool_max_conns in its URL), a test runs at most three
// processes, and at most pgTestSlots tests use the server at once, so that the e2e
// tests hold at most pgTestSlots × (3 × pgPoolSize + 2) = 42 connections.
const (
	pgPoolSize  = 4
	pgTestSlots = 3
)

var (
	pgSlots   = make(chan struct{}, pgTestSlots)
	pgHolders sync.Map // testing.TB → struct{}: the tests that hold a slot
)

// holdPostgresSlot waits for one of the pgTestSlots and holds it until t ends; a test
// that holds one already keeps it.
func holdPostgresSlot(t testing.TB) {
	if _, held := pgHolders.LoadOrStore(t, struct{}{}); held {
		return
	}
	pgSlots <- struct{}{}
	t.Cleanup(func() {
		pgHolders.Delete(t)
		<-pgSlots
	})
}

// postgresStore creates a database of its own on the shared PostgreSQL server and
// returns its URL, with pool_max_conns=pgPoolSize; the database is dropped at cleanup.
// A separate process can't be handed a transaction or a search_path as simply as a
// fresh database. The test holds one of the pgTestSlots until it ends.
func postgresStore(t testing.TB) string {
	t.Helper()
	base := testenv.PostgresURL(t)
	holdPostgresSlot(t)
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
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(pgPoolSize))
	u.RawQuery = q.Encode()
	return u.String()
}
