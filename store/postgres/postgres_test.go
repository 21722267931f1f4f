package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin/admintest"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/storetest"
)

// schemaStore is a store and the private schema it lives in.
type schemaStore struct {
	*postgres.Store
	schema string
	dbURL  string
}

// table returns the quoted name of table in the store's schema.
func (s schemaStore) table(name string) string { return pgx.Identifier{s.schema, name}.Sanitize() }

// newStore opens a migrated store in a fresh schema private to t, without a cleaner
// (the conformance suite's cleanup cases delete expired records themselves).
func newStore(t testing.TB) schemaStore {
	return newStoreWith(t, postgres.Config{MaxConns: 4, DisableCleaner: true})
}

// newStoreWith is newStore with cfg (its Schema is set to the fresh one).
func newStoreWith(t testing.TB, cfg postgres.Config) schemaStore {
	return newStoreVia(t, cfg, nil)
}

// newStoreVia is newStoreWith through the URL that via makes of the database's (a
// pgx exec mode, a pooler in between); nil is the database's own.
func newStoreVia(t testing.TB, cfg postgres.Config, via func(dbURL string) string) schemaStore {
	t.Helper()
	dbURL, schema := pgtest.Schema(t)
	return openIn(t, cfg, dbURL, schema, via, true)
}

// openIn opens a store in schema of the database at dbURL, through the URL via makes
// of it, closed when t ends; fresh: the schema is empty, to migrate and to give the
// application's table.
func openIn(t testing.TB, cfg postgres.Config, dbURL, schema string, via func(dbURL string) string, fresh bool) schemaStore {
	t.Helper()
	cfg.Schema = schema
	storeURL := dbURL
	if via != nil {
		storeURL = via(dbURL)
	}
	s, err := postgres.Open(context.Background(), storeURL, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(s.Close)
	st := schemaStore{Store: s, schema: schema, dbURL: dbURL}
	if !fresh {
		return st
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := s.Pool().Exec(context.Background(), `CREATE TABLE `+st.table("app_marker")+` (name text PRIMARY KEY)`); err != nil {
		t.Fatalf("creating the application table: %v", err)
	}
	return st
}

// schemaPool hands the cases of a conformance suite migrated schemas, emptied between
// cases: a schema of its own and every migration cost more than most cases do, and
// the suites run once per connection kind (eachConnection). A case gets a schema no
// other case uses while it runs, with no record and no application row in it.
type schemaPool struct {
	owner *testing.T
	dbURL string
	mu    sync.Mutex
	free  []string
}

// newSchemaPool returns a pool whose schemas are dropped when t ends.
func newSchemaPool(t *testing.T) *schemaPool {
	return &schemaPool{owner: t, dbURL: pgtest.SchemaOwner(t)}
}

// store opens a store in a schema of the pool for t, through via; the schema is
// emptied and handed back once t ends and the store is closed.
func (p *schemaPool) store(t *testing.T, cfg postgres.Config, via func(string) string) schemaStore {
	t.Helper()
	p.mu.Lock()
	var schema string
	fresh := len(p.free) == 0
	if fresh {
		schema = pgtest.CreateSchema(t, p.dbURL, p.owner)
	} else {
		schema, p.free = p.free[len(p.free)-1], p.free[:len(p.free)-1]
	}
	p.mu.Unlock()
	t.Cleanup(func() { // after the store's Close, registered below
		for _, table := range []string{"idem_records", "app_marker"} {
			pgtest.Exec(t, p.dbURL, `DELETE FROM `+pgx.Identifier{schema, table}.Sanitize())
		}
		p.mu.Lock()
		p.free = append(p.free, schema)
		p.mu.Unlock()
	})
	return openIn(t, cfg, p.dbURL, schema, via, fresh)
}

// TestConformance runs the store conformance suite in each of pgx's exec modes, and
// behind a transaction pooler (PgBouncer) in each mode that works there.
func TestConformance(t *testing.T) {
	t.Parallel()
	eachConnection(t, func(t *testing.T, via func(string) string) {
		schemas := newSchemaPool(t)
		storetest.Run(t, storetest.Harness{
			NewStore: func(t *testing.T) idemstore.Store {
				return schemas.store(t, postgres.Config{MaxConns: 4, DisableCleaner: true}, via)
			},
			Tx: appTable{},
			NewStoreWithCleaner: func(t *testing.T, cfg idem.CleanerConfig) (idemstore.Store, *idem.Cleaner) {
				s := schemas.store(t, postgres.Config{MaxConns: 4, Cleaner: cfg}, via)
				return s, s.Cleaner()
			},
			Raw:          rawRows,
			CopyResponse: copyResponse,
		})
	})
}

// copyResponse copies the response of (scope, from) onto (scope, onto), behind the
// store's back.
func copyResponse(t *testing.T, st idemstore.Store, scope, from, onto string) {
	s := st.(schemaStore)
	_, err := s.Pool().Exec(context.Background(), `UPDATE `+s.table("idem_records")+` r SET (response_status, response_headers, response_body) =
		(SELECT f.response_status, f.response_headers, f.response_body FROM `+s.table("idem_records")+` f WHERE f.scope = $1 AND f.key = $2)
		WHERE r.scope = $1 AND r.key = $3`, []byte(scope), []byte(from), []byte(onto))
	if err != nil {
		t.Fatal(err)
	}
}

// rawRows returns what the store holds: every row of its records' table, each column
// as PostgreSQL sends it (binary values byte for byte) and as text.
func rawRows(t *testing.T, st idemstore.Store) []byte {
	t.Helper()
	s := st.(schemaStore)
	rows, err := s.Pool().Query(context.Background(), `SELECT t::text, t.* FROM `+s.table("idem_records")+` t`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var raw []byte
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
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
// records, in the store's private schema (created by newStore), written in the same transaction as the
// fenced completion.
type appTable struct{}

func (a appTable) WriteAndComplete(ctx context.Context, st idemstore.Store, p *idemstore.CompleteParams, marker string) error {
	s := st.(schemaStore)
	tx, err := s.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.table("app_marker")+` (name) VALUES ($1)`, marker); err != nil {
		return err
	}
	if err := s.CompleteTx(ctx, tx, p); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func (a appTable) MarkerCommitted(ctx context.Context, st idemstore.Store, marker string) (bool, error) {
	s := st.(schemaStore)
	var n int
	err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM `+s.table("app_marker")+` WHERE name = $1`, marker).Scan(&n)
	return n > 0, err
}

// TestAdminConformance runs the admin conformance suite as TestConformance runs the
// store's.
func TestAdminConformance(t *testing.T) {
	t.Parallel()
	eachConnection(t, func(t *testing.T, via func(string) string) {
		schemas := newSchemaPool(t)
		admintest.Run(t, admintest.Harness{
			NewStore: func(t *testing.T) admintest.Store {
				return schemas.store(t, postgres.Config{MaxConns: 4, DisableCleaner: true}, via)
			},
		})
	})
}

func (a appTable) InTx(ctx context.Context, st idemstore.Store, fn func(ctx context.Context, write func(marker string) error) error) error {
	s := st.(schemaStore)
	return s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		return fn(ctx, func(marker string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+s.table("app_marker")+` (name) VALUES ($1)`, marker)
			return err
		})
	})
}

func (a appTable) Step(ctx context.Context, st idemstore.Store, step string, fn func(ctx context.Context, write func(marker string) error) (string, error)) (string, error) {
	s := st.(schemaStore)
	return postgres.Step(ctx, s.Store, step, func(ctx context.Context, tx pgx.Tx) (string, error) {
		return fn(ctx, func(marker string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+s.table("app_marker")+` (name) VALUES ($1)`, marker)
			return err
		})
	})
}
