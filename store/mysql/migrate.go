package mysql

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations lists the embedded migrations in version order.
func migrations() ([]sqlstore.Migration, error) {
	return sqlstore.Migrations(migrationFS, "migrations", "mysql")
}

// splitStatements splits a migration into its statements: each ends with a ';' at the
// end of a line. Comment lines are dropped.
func splitStatements(src string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.SplitSeq(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// migrateLockTimeout bounds how long Migrate waits for another process's migration.
const migrateLockTimeout = 60 // seconds

// Migrate brings the store's tables up to date: it applies, in order, each embedded
// migration not yet recorded in idem_migrations. MySQL commits each DDL statement by
// itself, so processes that migrate at once take turns under a named lock
// (GET_LOCK('idem_migrate.<database>'), held by one connection for the length of the
// migration and released with it), and each later one finds nothing left to do; every
// statement of a migration may run again after a crash (IF NOT EXISTS). Migrate is
// safe to call on every start.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("mysql: migrate: %w", interpretError(err))
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(CONCAT('idem_migrate.', DATABASE()), ?)`, migrateLockTimeout).Scan(&got); err != nil {
		return fmt.Errorf("mysql: migrate: taking the migration lock: %w", interpretError(err))
	}
	if got.Int64 != 1 {
		return fmt.Errorf("mysql: migrate: another process held the migration lock for %d s", migrateLockTimeout)
	}
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(CONCAT('idem_migrate.', DATABASE()))`)
	}()

	done, err := sqlstore.AppliedVersions(ctx, conn, queryMigrationsCreate, queryMigrationsApplied)
	if err != nil {
		return fmt.Errorf("mysql: migrate: %w", interpretError(err))
	}
	created := !done[ms[0].Version]
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		// The store's connections run one statement per query.
		for _, stmt := range splitStatements(m.SQL) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("mysql: migration %s: %w", m.Name, interpretError(err))
			}
		}
		if _, err := conn.ExecContext(ctx, queryMigrationsInsert, m.Version, m.Name, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("mysql: migration %s: %w", m.Name, interpretError(err))
		}
		s.logger.InfoContext(ctx, "mysql: applied migration", "migration", m.Name)
	}
	if created {
		// No earlier release can have served a store that had no table: it starts at
		// this release's format level (SPEC §20).
		if err := idem.InitStoreState(ctx, s); err != nil {
			return fmt.Errorf("mysql: migrate: %w", err)
		}
	}
	return nil
}

// UnknownMigrations returns the migrations the database records that this release
// does not embed ("0002_name"), applied by a later release: empty when the schema is as
// this release knows it or older. Migrate leaves them alone; `idem migrate` names them
// and fails.
func (s *Store) UnknownMigrations(ctx context.Context) ([]string, error) {
	ms, err := migrations()
	if err != nil {
		return nil, err
	}
	names, err := sqlstore.UnknownMigrations(ctx, s.db, queryMigrationsUnknown, ms[len(ms)-1].Version)
	if err != nil {
		return nil, fmt.Errorf("mysql: reading the schema's migrations: %w", interpretError(err))
	}
	return names, nil
}

// LastMigration names the last migration this release embeds ("0001_records").
func LastMigration() string { return sqlstore.Last(migrations()) }
