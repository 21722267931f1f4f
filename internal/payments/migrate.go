package payments

import (
	"context"
	"database/sql"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite" // the database/sql driver "sqlite"

	"github.com/idem-go/idem/store/sqlite"
)

// migrationsTable records which of the payments migrations ran.
const migrationsTable = "payments_migrations"

// Migrate creates or upgrades the payments tables and returns the names of the
// migrations it applied (none when the schema is current). It is safe when several
// processes migrate at once: PostgreSQL serialises them with a transaction-scoped
// advisory lock, SQLite with BEGIN IMMEDIATE; each applies what the others have not.
func (d *DB) Migrate(ctx context.Context) ([]string, error) {
	all, err := migrations(d.dialect)
	if err != nil {
		return nil, err
	}
	if d.dialect == dialectPostgres {
		return d.migratePostgres(ctx, all)
	}
	return d.migrateSQLite(ctx, all)
}

func (d *DB) migratePostgres(ctx context.Context, all [][2]string) ([]string, error) {
	var applied []string
	err := pgx.BeginTxFunc(ctx, d.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", advisoryLockID()); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+migrationsTable+" (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"); err != nil {
			return err
		}
		for _, m := range all {
			var n int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+migrationsTable+" WHERE version = $1", m[0]).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				continue
			}
			if _, err := tx.Exec(ctx, m[1]); err != nil {
				return fmt.Errorf("migration %s: %w", m[0], err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+migrationsTable+" (version) VALUES ($1)", m[0]); err != nil {
				return err
			}
			applied = append(applied, m[0])
		}
		return nil
	})
	return applied, err
}

func (d *DB) migrateSQLite(ctx context.Context, all [][2]string) (applied []string, err error) {
	// Processes starting at once on a fresh file can be told "busy" without waiting
	// (the first one is switching the file to WAL): the whole migration is retried.
	err = sqlite.RetryBusy(ctx, func() error {
		applied, err = d.migrateSQLiteOnce(ctx, all)
		return err
	})
	return applied, err
}

func (d *DB) migrateSQLiteOnce(ctx context.Context, all [][2]string) (applied []string, err error) {
	conn, err := d.sqlDB.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// BEGIN IMMEDIATE on a dedicated connection takes the write lock first, so that
	// concurrent migrators queue (busy_timeout) instead of racing.
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
			applied = nil
		}
	}()
	if _, err := conn.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+migrationsTable+" (version TEXT PRIMARY KEY, applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"); err != nil {
		return nil, err
	}
	for _, m := range all {
		var n int
		if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM "+migrationsTable+" WHERE version = ?", m[0]).Scan(&n); err != nil {
			return nil, err
		}
		if n > 0 {
			continue
		}
		if _, err := conn.ExecContext(ctx, m[1]); err != nil {
			return nil, fmt.Errorf("migration %s: %w", m[0], err)
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO "+migrationsTable+" (version) VALUES (?)", m[0]); err != nil {
			return nil, err
		}
		applied = append(applied, m[0])
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return nil, err
	}
	return applied, nil
}

// advisoryLockID is the PostgreSQL advisory lock that serialises payments migrations.
func advisoryLockID() int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("idem/internal/payments migrations"))
	return int64(h.Sum64())
}

// OpenSQLite opens the SQLite database at path (a file path or a file: URI) for a DB
// that is not shared with the idempotency store (with a Redis store, say): WAL journal,
// a 10 s busy timeout, synchronous=FULL, and BEGIN IMMEDIATE transactions. maxConns
// bounds the pool.
func OpenSQLite(path string, maxConns int) (*sql.DB, error) {
	const params = "_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)"
	dsn := "file:" + path + "?" + params
	if strings.HasPrefix(path, "file:") {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		dsn = path + sep + params
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	return db, nil
}
