// Package pgtest gives each test its own PostgreSQL schema, so that tests run in
// parallel against one shared server and never see each other's rows.
package pgtest

import (
	"context"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/internal/testenv"
)

// Schema creates a fresh, empty schema named t_<random> in the test database (see
// [testenv.PostgresURL]; the test skips when PostgreSQL is absent, fails under CI=true)
// and drops it, with everything in it, when the test ends. It returns the database URL
// and the schema's name.
func Schema(t testing.TB) (dbURL, schema string) {
	t.Helper()
	dbURL = testenv.PostgresURL(t)
	return dbURL, NewSchema(t, dbURL)
}

// SchemaOwner returns the test database's URL (as [Schema] finds it), for schemas that
// [NewSchema] creates.
func SchemaOwner(t testing.TB) string {
	t.Helper()
	return testenv.PostgresURL(t)
}

// NewSchema creates a fresh, empty schema named t_<random> in the database at dbURL,
// dropped with everything in it when the test ends, and returns its name.
func NewSchema(t testing.TB, dbURL string) string {
	t.Helper()
	return CreateSchema(t, dbURL, t)
}

// CreateSchema is NewSchema for a schema that outlives t: it is dropped when owner (t
// or a test that t runs under) ends.
func CreateSchema(t testing.TB, dbURL string, owner testing.TB) string {
	t.Helper()
	schema := testenv.Name("t_")
	Exec(t, dbURL, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	owner.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(ctx, dbURL, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			owner.Errorf("pgtest: dropping schema %s: %v", schema, err)
		}
	})
	return schema
}

// SearchPathURL returns dbURL with its search_path set to schema, for code that uses
// unqualified table names (an application's own tables in a test's schema).
func SearchPathURL(t testing.TB, dbURL, schema string) string {
	t.Helper()
	return WithParam(t, dbURL, "search_path", schema)
}

// WithParam returns dbURL with the connection parameter name set to value (pgx sends
// parameters it does not know itself, such as default_transaction_isolation, to the
// server as run-time settings).
func WithParam(t testing.TB, dbURL, name, value string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgtest: parsing %q: %v", dbURL, err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// Exec runs one statement on a connection of its own, failing the test on an error.
func Exec(t testing.TB, dbURL, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := exec(ctx, dbURL, sql, args...); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

func exec(ctx context.Context, dbURL, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// Pool opens a pool of at most maxConns connections to dbURL, closed when the test
// ends; configure, when given, adjusts its configuration first (a notice hook, say).
// Tests share one server with a stock max_connections: keep maxConns small.
func Pool(t testing.TB, dbURL string, maxConns int32, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("pgtest: parsing %q: %v", dbURL, err)
	}
	cfg.MaxConns = maxConns
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: opening a pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Notices collects the notices (warnings and the like) that the server sends on the
// connections of a pool whose configuration Hook adjusted.
type Notices struct {
	mu   sync.Mutex
	list []string
}

// Hook makes the pool's connections record their notices in n: a configure function
// of Pool.
func (n *Notices) Hook(cfg *pgxpool.Config) {
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, notice *pgconn.Notice) {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.list = append(n.list, notice.Severity+": "+notice.Message)
	}
}

// Take returns the notices recorded since the last Take.
func (n *Notices) Take() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.list
	n.list = nil
	return l
}
