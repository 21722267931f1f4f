package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrations lists the embedded migrations in version order.
func migrations() ([]sqlstore.Migration, error) {
	return sqlstore.Migrations(migrationFS, "migrations", "sqlite")
}

// Migrate brings the store's tables up to date: it applies, in order, each embedded
// migration not yet recorded in idem_migrations. All of them run in one BEGIN
// IMMEDIATE transaction, so processes that migrate one file at the same time take
// turns, and each later one finds nothing left to do. Migrate is safe to call on
// every start.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	var applied []string
	var created bool
	err = s.writeTx(ctx, "migrate", func(tx *sql.Tx) error {
		applied = applied[:0]
		done, err := sqlstore.AppliedVersions(ctx, tx, queryMigrationsCreate, queryMigrationsApplied)
		if err != nil {
			return err
		}
		created = !done[ms[0].Version]
		for _, m := range ms {
			if done[m.Version] {
				continue
			}
			if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if _, err := tx.ExecContext(ctx, queryMigrationsInsert,
				sql.Named("version", m.Version), sql.Named("name", m.Name),
				sql.Named("applied_at", time.Now().UnixNano())); err != nil {
				return err
			}
			applied = append(applied, m.Name)
		}
		return nil
	})
	if err != nil {
		return interpretError(err)
	}
	for _, name := range applied {
		s.logger.InfoContext(ctx, "sqlite: applied migration", "migration", name)
	}
	if created {
		// No earlier release can have served a store that had no table: it starts at
		// this release's format level (SPEC §20).
		if err := idem.InitStoreState(ctx, s); err != nil {
			return fmt.Errorf("sqlite: migrate: %w", err)
		}
	}
	return nil
}

// UnknownMigrations returns the migrations the database records that this release
// does not embed ("0004_name"), applied by a later release: empty when the schema is
// as this release knows it or older. Migrate leaves them alone (a rollback to this
// release runs on them when the later release followed the rule of SPEC §20); `idem
// migrate` names them and fails.
func (s *Store) UnknownMigrations(ctx context.Context) ([]string, error) {
	ms, err := migrations()
	if err != nil {
		return nil, err
	}
	names, err := sqlstore.UnknownMigrations(ctx, s.db, queryMigrationsUnknown, sql.Named("version", ms[len(ms)-1].Version))
	if err != nil {
		return nil, fmt.Errorf("sqlite: reading the schema's migrations: %w", interpretError(err))
	}
	return names, nil
}

// LastMigration names the last migration this release embeds ("0003_outcome_unknown").
func LastMigration() string { return sqlstore.Last(migrations()) }
