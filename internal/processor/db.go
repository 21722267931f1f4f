package processor

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"hash/fnv"
	"path"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

//go:embed sql
var sqlFiles embed.FS

// DB is where the processor keeps its charges: the idempotency store's own SQL
// database, so that a charge and the completion of its idempotency record commit in
// one transaction (SPEC §7). Build it with [SQLite] or [Postgres], then call
// [DB.Migrate].
type DB struct {
	queries map[string]string
	sqlite  *sqlite.Store
	pg      *postgres.Store
}

// SQLite returns a DB on the SQLite store st.
func SQLite(st *sqlite.Store) *DB { return &DB{queries: loadQueries("sqlite"), sqlite: st} }

// Postgres returns a DB on the PostgreSQL store st.
func Postgres(st *postgres.Store) *DB { return &DB{queries: loadQueries("postgres"), pg: st} }

// Store returns the idempotency store the DB lives in.
func (d *DB) Store() idemstore.Store {
	if d.pg != nil {
		return d.pg
	}
	return d.sqlite
}

// Migrate creates the processor's table when it does not exist. It is safe when
// several processes start at once: PostgreSQL serialises them with a transaction-scoped
// advisory lock, SQLite with its write lock.
func (d *DB) Migrate(ctx context.Context) error {
	schema := d.queries["schema"]
	if d.pg != nil {
		return pgx.BeginTxFunc(ctx, d.pg.Pool(), pgx.TxOptions{}, func(tx pgx.Tx) error {
			h := fnv.New64a()
			h.Write([]byte("idem processor migrations"))
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(h.Sum64())); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, schema)
			return err
		})
	}
	return d.sqlite.InTx(idem.WithoutKey(ctx), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, schema)
		return err
	})
}

// insert records c and, when ctx carries the request's idempotency handle, completes
// its record with what write writes into the response, in one transaction (SPEC §7).
func (d *DB) insert(ctx context.Context, c *charge, write func()) error {
	args := []any{c.ID, c.Amount, c.Currency, c.IdempotencyKey, c.Created}
	if d.pg != nil {
		return d.pg.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, d.queries["charge_insert"], args...); err != nil {
				return err
			}
			write()
			return nil
		})
	}
	return d.sqlite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, d.queries["charge_insert"], args...); err != nil {
			return err
		}
		write()
		return nil
	})
}

// errNoCharge is the list cursor of a charge that does not exist.
var errNoCharge = errors.New("processor: no such charge")

// list returns up to limit charges, newest first, after the charge after ("" : from the
// newest).
func (d *DB) list(ctx context.Context, after string, limit int) ([]charge, error) {
	var seq int64
	if after != "" {
		err := d.row(ctx, "charge_seq", after).Scan(&seq)
		switch {
		case errors.Is(err, sql.ErrNoRows), errors.Is(err, pgx.ErrNoRows):
			return nil, errNoCharge
		case err != nil:
			return nil, err
		}
	}
	var out []charge
	scan := func(s interface{ Scan(...any) error }) error {
		var c charge
		if err := s.Scan(&c.ID, &c.Amount, &c.Currency, &c.IdempotencyKey, &c.Created); err != nil {
			return err
		}
		out = append(out, c)
		return nil
	}
	var rows interface {
		Next() bool
		Scan(...any) error
		Err() error
	}
	if d.pg != nil {
		r, err := d.pg.Pool().Query(ctx, d.queries["charge_list"], seq, limit)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		rows = r
	} else {
		r, err := d.sqlite.DB().QueryContext(ctx, d.queries["charge_list"], seq, limit)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		rows = r
	}
	for rows.Next() {
		if err := scan(rows); err != nil {
			return nil, err
		}
	}
	return out, rows.Err()
}

// row runs a query of one row.
func (d *DB) row(ctx context.Context, name string, args ...any) interface{ Scan(...any) error } {
	if d.pg != nil {
		return d.pg.Pool().QueryRow(ctx, d.queries[name], args...)
	}
	return d.sqlite.DB().QueryRowContext(ctx, d.queries[name], args...)
}

func loadQueries(dialect string) map[string]string {
	dir := path.Join("sql", dialect)
	entries, err := sqlFiles.ReadDir(dir)
	if err != nil {
		panic("processor: " + err.Error())
	}
	q := make(map[string]string, len(entries))
	for _, e := range entries {
		b, err := sqlFiles.ReadFile(path.Join(dir, e.Name()))
		if err != nil {
			panic("processor: " + err.Error())
		}
		q[e.Name()[:len(e.Name())-len(".sql")]] = string(b)
	}
	return q
}
