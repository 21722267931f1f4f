package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
)

//go:embed migrations/*.up.sql
var migrationFiles embed.FS

// migration is one numbered file of migrations/, NNNN_name.up.sql.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations lists the embedded migrations in version order.
var migrations = mustLoadMigrations()

func mustLoadMigrations() []migration {
	names, err := fs.Glob(migrationFiles, "migrations/*.up.sql")
	if err != nil {
		panic(err)
	}
	var out []migration
	for _, path := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(path, "migrations/"), ".up.sql")
		num, name, ok := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version <= 0 {
			panic("postgres: migration file " + path + " is not named NNNN_name.up.sql")
		}
		b, err := migrationFiles.ReadFile(path)
		if err != nil {
			panic(err)
		}
		out = append(out, migration{version: version, name: name, sql: string(b)})
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i := 1; i < len(out); i++ {
		if out[i].version == out[i-1].version {
			panic(fmt.Sprintf("postgres: two migrations numbered %d", out[i].version))
		}
	}
	return out
}

// Migrate creates the configured schema when it is missing and applies every embedded
// migration not yet recorded in its idem_migrations table, all in one transaction under
// an advisory lock: any number of processes may migrate the same schema at the same
// moment; one applies the migrations and the others then find nothing to do. The lock
// is the transaction's (pg_advisory_xact_lock), so that a transaction pooler in
// between is no matter. Behind a pooler it refuses the pool's default_query_exec_mode
// describe_exec ([ErrModeUnsafeBehindPooler]). Once migrated, it logs (Config.Logger)
// what a failover of the database may lose ([Store.Replication]): one INFO line, and a
// WARN when standbys replicate asynchronously.
func (s *Store) Migrate(ctx context.Context) error {
	var created bool
	err := s.retryLockTimeout(ctx, "a migration", func(tx pgx.Tx) error {
		var err error
		created, err = s.migrateTx(ctx, tx, 0)
		return err
	})
	switch {
	case errors.Is(err, ErrModeUnsafeBehindPooler):
		return err
	case err != nil:
		return fmt.Errorf("postgres: migrate: %w", interpretError(err))
	}
	if created {
		// No earlier release can have served a store that had no table: it starts at
		// this release's format level (SPEC §20).
		if err := idem.InitStoreState(ctx, s); err != nil {
			return fmt.Errorf("postgres: migrate: %w", err)
		}
	}
	if err := s.migrateFinalized(ctx); err != nil {
		return fmt.Errorf("postgres: migrate: %w", interpretError(err))
	}
	s.logReplication(ctx)
	return nil
}

// migrateFinalized makes the schema changes that wait for the store's format level
// (SPEC §20): a rollback to the previous release may cross every migration, but not
// these. At level 2 (idem.GateNoExpiryIndex) it drops the index of expiry (0010 says
// why it waits).
func (s *Store) migrateFinalized(ctx context.Context) error {
	st, err := idem.ReadStoreState(ctx, s)
	if err != nil || !st.Allows(idem.GateNoExpiryIndex) {
		return err
	}
	return s.retryLockTimeout(ctx, "dropping the index of expiry", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.q.migrateDropIndex)
		return err
	})
}

// retryLockTimeout runs fn in a transaction, again (up to migrateAttempts times, a
// second longer apart each time) when it waited for a table's lock past its
// lock_timeout behind a long statement: then nothing was changed. A statement that met
// a prepared statement lost behind a pooler is sent again once, at once: nothing was
// applied, and a pool that ConfigurePool configured has switched to a mode that works
// there since.
func (s *Store) retryLockTimeout(ctx context.Context, what string, fn func(pgx.Tx) error) error {
	var err error
	lost := false // a lost statement was met, and the transaction sent again once
	for attempt := 0; attempt < migrateAttempts; attempt++ {
		err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
		if isLostStatement(err) && !lost {
			lost = true
			attempt--
			s.logger.InfoContext(ctx, "postgres: "+what+"'s statement met a prepared statement lost behind a connection pooler; retrying", "error", err)
			continue
		}
		if !isLockNotAvailable(err) || attempt == migrateAttempts-1 {
			return err
		}
		s.logger.InfoContext(ctx, "postgres: "+what+" waited too long for a lock; retrying", "attempt", attempt+1, "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * time.Second):
		}
	}
	return err
}

// UnknownMigrations returns the migrations the schema records that this release does
// not embed ("0011_name"), applied by a later release: empty when the schema is as
// this release knows it or older. Migrate leaves them alone (a rollback to this
// release runs on them when the later release followed the rule of SPEC §20: its
// migrations leave what this release reads as it was); `idem migrate` names them and
// fails.
func (s *Store) UnknownMigrations(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, s.q.migrateUnknown, migrations[len(migrations)-1].version)
	if err != nil {
		return nil, fmt.Errorf("postgres: reading the schema's migrations: %w", interpretError(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var v int
		var name string
		err := row.Scan(&v, &name)
		return fmt.Sprintf("%04d_%s", v, name), err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: reading the schema's migrations: %w", interpretError(err))
	}
	return out, nil
}

// LastMigration names the last migration this release embeds ("0011_state_unchecked").
func LastMigration() string {
	m := migrations[len(migrations)-1]
	return fmt.Sprintf("%04d_%s", m.version, m.name)
}

// migrateAttempts bounds how often Migrate runs again after a migration's lock_timeout.
const migrateAttempts = 5

// isLockNotAvailable reports whether err is PostgreSQL's lock_not_available (55P03):
// a lock_timeout ran out.
func isLockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// migrateTx applies the migrations not yet applied, up to version upTo (0: all), and
// says whether it created the store (applied the first migration).
func (s *Store) migrateTx(ctx context.Context, tx pgx.Tx, upTo int) (created bool, err error) {
	var pid uint32
	if err := tx.QueryRow(ctx, s.q.migrateLock, s.schema).Scan(&pid); err != nil {
		return false, err
	}
	if err := s.refuseUnsafeMode(pid != tx.Conn().PgConn().PID()); err != nil {
		return false, err
	}
	if err := s.createSchema(ctx, tx); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, s.q.migrateCreateTable); err != nil {
		return false, err
	}
	rows, err := tx.Query(ctx, s.q.migrateApplied)
	if err != nil {
		return false, err
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return false, err
	}
	created = !slices.Contains(applied, int32(migrations[0].version))
	for _, m := range migrations {
		if slices.Contains(applied, int32(m.version)) || (upTo > 0 && m.version > upTo) {
			continue
		}
		if _, err := tx.Exec(ctx, strings.ReplaceAll(m.sql, "{{schema}}", s.q.schemaPrefix)); err != nil {
			return false, fmt.Errorf("migration %04d_%s: %w", m.version, m.name, err)
		}
		if _, err := tx.Exec(ctx, s.q.migrateRecord, m.version, m.name); err != nil {
			return false, err
		}
		s.logger.InfoContext(ctx, "postgres: applied migration", "version", m.version, "name", m.name, "schema", s.schema)
	}
	return created, nil
}

// ErrModeUnsafeBehindPooler is what [Store.Migrate] returns when the pool's
// default_query_exec_mode is describe_exec and a connection pooler stands between
// the store and PostgreSQL. describe_exec prepares the unnamed statement in one round
// trip and binds it in the next; a transaction pooler may give the unnamed statement's
// server connection to another client in between, and the Bind then fails, or runs the
// other client's statement with these parameters. cache_describe has the same
// safety against schema changes in one round trip; exec and simple_protocol need no
// description at all.
var ErrModeUnsafeBehindPooler = errors.New("postgres: default_query_exec_mode=describe_exec is unsafe behind a connection pooler " +
	"(it binds a statement prepared in an earlier round trip, which the pooler may have given another client): " +
	"use cache_describe, exec or simple_protocol")

// refuseUnsafeMode refuses the pool's exec mode when it cannot work behind a pooler
// and one stands in between (pooled: the server process that answered is not the one
// the connection was opened with).
func (s *Store) refuseUnsafeMode(pooled bool) error {
	if pooled && s.pool.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeDescribeExec {
		return ErrModeUnsafeBehindPooler
	}
	return nil
}

// createSchema creates the configured schema unless it exists. Checking first means a
// role without CREATE on the database can still migrate a schema made for it.
func (s *Store) createSchema(ctx context.Context, tx pgx.Tx) error {
	if s.schema == "" {
		return nil
	}
	var exists bool
	if err := tx.QueryRow(ctx, s.q.migrateSchemaExists, s.schema).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err := tx.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s.schema}.Sanitize())
	return err
}
