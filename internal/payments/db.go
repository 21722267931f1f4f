package payments

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

//go:embed sql migrations
var sqlFiles embed.FS

type dialect string

const (
	dialectSQLite   dialect = "sqlite"
	dialectPostgres dialect = "postgres"
)

// SQLiteTxFunc runs fn in one SQLite transaction: store/sqlite's (*Store).InTx, the
// SPEC §7 helper that also completes the idempotency record in that transaction.
type SQLiteTxFunc func(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error

// PostgresTxFunc runs fn in one PostgreSQL transaction: store/postgres's
// (*Store).InTx, the SPEC §7 helper that also completes the idempotency record in that
// transaction.
type PostgresTxFunc func(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error

// DB is where the payments API keeps charges and orders: an SQLite or a PostgreSQL
// database. Build it with [NewSQLiteDB] or [NewPostgresDB], then call [DB.Migrate].
type DB struct {
	dialect dialect
	queries map[string]string

	sqlDB   *sql.DB
	sqlInTx SQLiteTxFunc
	pool    *pgxpool.Pool
	pgInTx  PostgresTxFunc

	// sqliteStore or pgStore is the idempotency store whose database this is, when
	// the DB was built on it: steps then commit with the record's recovery point
	// (SPEC §13).
	sqliteStore *sqlite.Store
	pgStore     *postgres.Store

	// completes is true when the transaction helper is the idempotency store's own,
	// so that committing the application's writes also completes the record (§7).
	completes bool
}

// NewSQLiteDB returns a DB on the SQLite database db. inTx is the idempotency store's
// SPEC §7 helper when the store is this same database (pass store/sqlite's
// (*Store).InTx, with db = (*Store).DB()); every mutation then commits its rows and the
// idempotency record together. With inTx nil, mutations run in plain transactions
// (BEGIN IMMEDIATE) and the middleware completes the record after the handler returns.
func NewSQLiteDB(db *sql.DB, inTx SQLiteTxFunc) *DB {
	d := &DB{dialect: dialectSQLite, queries: loadQueries(dialectSQLite), sqlDB: db, sqlInTx: inTx, completes: inTx != nil}
	if inTx == nil {
		d.sqlInTx = d.sqliteTx
	}
	return d
}

// NewSQLiteStoreDB returns a DB on the SQLite idempotency store's own database:
// NewSQLiteDB(st.DB(), st.InTx), which can also run the steps of a charge through a
// card processor, each committing with the record's recovery point (SPEC §13,
// store/sqlite's Step).
func NewSQLiteStoreDB(st *sqlite.Store) *DB {
	d := NewSQLiteDB(st.DB(), st.InTx)
	d.sqliteStore = st
	return d
}

// NewPostgresStoreDB returns a DB on the PostgreSQL idempotency store's own database:
// NewPostgresDB(st.Pool(), st.InTx), which can also run the steps of a charge through
// a card processor (SPEC §13, store/postgres's Step).
func NewPostgresStoreDB(st *postgres.Store) *DB {
	d := NewPostgresDB(st.Pool(), st.InTx)
	d.pgStore = st
	return d
}

// NewPostgresDB returns a DB on the PostgreSQL pool. inTx is the idempotency store's
// SPEC §7 helper when the store is this same database (pass store/postgres's
// (*Store).InTx, with pool = (*Store).Pool()). With inTx nil, mutations run in plain
// READ COMMITTED transactions.
func NewPostgresDB(pool *pgxpool.Pool, inTx PostgresTxFunc) *DB {
	d := &DB{dialect: dialectPostgres, queries: loadQueries(dialectPostgres), pool: pool, pgInTx: inTx, completes: inTx != nil}
	if inTx == nil {
		d.pgInTx = d.postgresTx
	}
	return d
}

// withoutRecords returns a copy of d whose transactions are plain ones, completing no
// record: the DB of a server without idempotency.
func (d *DB) withoutRecords() *DB {
	c := *d
	c.completes, c.sqliteStore, c.pgStore = false, nil, nil
	c.sqlInTx, c.pgInTx = c.sqliteTx, c.postgresTx
	return &c
}

// Ping reports whether the database answers.
func (d *DB) Ping(ctx context.Context) error {
	if d.dialect == dialectPostgres {
		return d.pool.Ping(ctx)
	}
	return d.sqlDB.PingContext(ctx)
}

// DeleteExpiredOrderKeys deletes at most limit rows of order_keys whose key expired
// by now, oldest first, and returns how many it deleted: a retry of such a key starts
// a new operation (SPEC §8), so the row answers nothing any more. The API calls it as
// it writes orders; call it from a job of your own to catch up after a burst.
func (d *DB) DeleteExpiredOrderKeys(ctx context.Context, now time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("payments: DeleteExpiredOrderKeys: limit must be positive, got %d", limit)
	}
	n, err := d.reader().exec(ctx, "order_key_delete_expired", now.UnixMilli(), limit)
	return int(n), err
}

// CompletesRecords reports whether a mutation's transaction also completes the
// idempotency record (the DB shares the idempotency store's database, SPEC §7).
func (d *DB) CompletesRecords() bool { return d.completes }

// RunsSteps reports whether the DB runs steps that commit with the idempotency
// record's recovery point (built with NewSQLiteStoreDB or NewPostgresStoreDB), as a
// charge through a card processor needs (SPEC §13).
func (d *DB) RunsSteps() bool { return d.sqliteStore != nil || d.pgStore != nil }

// step runs fn as the step name of the operation whose handle ctx carries: fn's writes,
// the record's new recovery point and fn's result commit in one transaction, and a step
// that committed already returns its saved result without running (store/sqlite's and
// store/postgres's Step). On a DB that does not run steps (RunsSteps false), which is
// only used without idempotency, it is a plain transaction.
func step[T any](ctx context.Context, d *DB, name string, fn func(ctx context.Context, q querier) (T, error)) (T, error) {
	switch {
	case d.sqliteStore != nil:
		return sqlite.Step(ctx, d.sqliteStore, name, func(ctx context.Context, tx *sql.Tx) (T, error) {
			return fn(ctx, sqlQuerier{db: tx, queries: d.queries})
		})
	case d.pgStore != nil:
		return postgres.Step(ctx, d.pgStore, name, func(ctx context.Context, tx pgx.Tx) (T, error) {
			return fn(ctx, pgxQuerier{db: tx, queries: d.queries})
		})
	}
	var v T
	err := d.inTx(ctx, func(ctx context.Context, q querier) (err error) {
		v, err = fn(ctx, q)
		return err
	})
	return v, err
}

// inTx runs fn in one transaction through the configured helper.
func (d *DB) inTx(ctx context.Context, fn func(ctx context.Context, q querier) error) error {
	if d.dialect == dialectPostgres {
		return d.pgInTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return fn(ctx, pgxQuerier{db: tx, queries: d.queries})
		})
	}
	return d.sqlInTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return fn(ctx, sqlQuerier{db: tx, queries: d.queries})
	})
}

// reader returns a querier outside any transaction, for reads.
func (d *DB) reader() querier {
	if d.dialect == dialectPostgres {
		return pgxQuerier{db: d.pool, queries: d.queries}
	}
	return sqlQuerier{db: d.sqlDB, queries: d.queries}
}

// sqliteTx is the plain transaction used when the store is not this database. Open the
// database with [OpenSQLite], whose _txlock=immediate makes BeginTx take the write lock
// at BEGIN, so that two writers never deadlock upgrading read locks.
func (d *DB) sqliteTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	tx, err := d.sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(ctx, tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// postgresTx is the plain transaction used when the store is not this database.
func (d *DB) postgresTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, d.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		return fn(ctx, tx)
	})
}

func loadQueries(dl dialect) map[string]string {
	dir := path.Join("sql", string(dl))
	entries, err := fs.ReadDir(sqlFiles, dir)
	if err != nil {
		panic("payments: " + err.Error())
	}
	q := make(map[string]string, len(entries))
	for _, e := range entries {
		b, err := fs.ReadFile(sqlFiles, path.Join(dir, e.Name()))
		if err != nil {
			panic("payments: " + err.Error())
		}
		q[strings.TrimSuffix(e.Name(), ".sql")] = string(b)
	}
	return q
}

// migrations returns the dialect's migrations in order, as (version name, SQL).
func migrations(dl dialect) ([][2]string, error) {
	dir := path.Join("migrations", string(dl))
	entries, err := fs.ReadDir(sqlFiles, dir)
	if err != nil {
		return nil, err
	}
	var out [][2]string
	for _, e := range entries {
		b, err := fs.ReadFile(sqlFiles, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, [2]string{strings.TrimSuffix(e.Name(), ".sql"), string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out, nil
}

// errNoRows is what queriers return for a query that found no row, whatever the driver.
var errNoRows = errors.New("payments: no rows")

// errKeyConflict is a unique violation on (scope, idempotency_key) that slipped past
// the pre-check (two executions of one key racing, only possible when the idempotency
// record was lost).
var errKeyConflict = errors.New("payments: idempotency key used concurrently")

// interpretError normalises driver errors once, at the edge.
func interpretError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows), errors.Is(err, pgx.ErrNoRows):
		return errNoRows
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return fmt.Errorf("%w: %s", errKeyConflict, pgErr.ConstraintName)
	}
	if strings.Contains(err.Error(), "UNIQUE constraint failed") {
		return fmt.Errorf("%w: %v", errKeyConflict, err)
	}
	return err
}

// scanner is one row to scan.
type scanner interface{ Scan(dest ...any) error }

// querier runs the named queries of one dialect, on a pool or in a transaction.
type querier interface {
	exec(ctx context.Context, name string, args ...any) (int64, error)
	queryRow(ctx context.Context, name string, args ...any) scanner
	query(ctx context.Context, name string, args []any, each func(scanner) error) error
}

type sqlDBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type sqlQuerier struct {
	db      sqlDBTX
	queries map[string]string
}

func (q sqlQuerier) exec(ctx context.Context, name string, args ...any) (int64, error) {
	res, err := q.db.ExecContext(ctx, q.queries[name], args...)
	if err != nil {
		return 0, interpretError(err)
	}
	n, err := res.RowsAffected()
	return n, interpretError(err)
}

func (q sqlQuerier) queryRow(ctx context.Context, name string, args ...any) scanner {
	return errScanner{q.db.QueryRowContext(ctx, q.queries[name], args...)}
}

func (q sqlQuerier) query(ctx context.Context, name string, args []any, each func(scanner) error) error {
	rows, err := q.db.QueryContext(ctx, q.queries[name], args...)
	if err != nil {
		return interpretError(err)
	}
	defer rows.Close()
	return iterate(rows, each)
}

type pgxDBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type pgxQuerier struct {
	db      pgxDBTX
	queries map[string]string
}

func (q pgxQuerier) exec(ctx context.Context, name string, args ...any) (int64, error) {
	tag, err := q.db.Exec(ctx, q.queries[name], args...)
	if err != nil {
		return 0, interpretError(err)
	}
	return tag.RowsAffected(), nil
}

func (q pgxQuerier) queryRow(ctx context.Context, name string, args ...any) scanner {
	return errScanner{q.db.QueryRow(ctx, q.queries[name], args...)}
}

func (q pgxQuerier) query(ctx context.Context, name string, args []any, each func(scanner) error) error {
	rows, err := q.db.Query(ctx, q.queries[name], args...)
	if err != nil {
		return interpretError(err)
	}
	defer rows.Close()
	return iterate(rows, each)
}

// iterate calls each for every row, then reports the rows' error.
func iterate(rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}, each func(scanner) error) error {
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return interpretError(rows.Err())
}

// errScanner normalises the error of a single-row scan.
type errScanner struct{ s scanner }

func (e errScanner) Scan(dest ...any) error { return interpretError(e.s.Scan(dest...)) }
