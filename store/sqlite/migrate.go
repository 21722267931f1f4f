package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migration is one numbered file of migrations/, such as 0001_records.sql.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations lists the embedded migrations in version order.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".sql")
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("sqlite: migration file %q is not named NNNN_name.sql", e.Name())
		}
		b, err := migrationFS.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: name, sql: string(b)})
	}
	slices.SortFunc(ms, func(a, b migration) int { return a.version - b.version })
	return ms, nil
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
		done, err := appliedVersions(ctx, tx)
		if err != nil {
			return err
		}
		created = !done[ms[0].version]
		for _, m := range ms {
			if done[m.version] {
				continue
			}
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			if _, err := tx.ExecContext(ctx, queryMigrationsInsert,
				sql.Named("version", m.version), sql.Named("name", m.name),
				sql.Named("applied_at", time.Now().UnixNano())); err != nil {
				return err
			}
			applied = append(applied, m.name)
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
	rows, err := s.db.QueryContext(ctx, queryMigrationsUnknown, sql.Named("version", ms[len(ms)-1].version))
	if err != nil {
		return nil, fmt.Errorf("sqlite: reading the schema's migrations: %w", interpretError(err))
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v int
		var name string
		if err := rows.Scan(&v, &name); err != nil {
			return nil, interpretError(err)
		}
		if !strings.HasPrefix(name, fmt.Sprintf("%04d_", v)) {
			name = fmt.Sprintf("%04d_%s", v, name)
		}
		out = append(out, name)
	}
	return out, interpretError(rows.Err())
}

// LastMigration names the last migration this release embeds ("0003_outcome_unknown").
func LastMigration() string {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		return ""
	}
	return ms[len(ms)-1].name
}

// appliedVersions creates idem_migrations when missing and returns the versions it
// records.
func appliedVersions(ctx context.Context, tx *sql.Tx) (map[int]bool, error) {
	if _, err := tx.ExecContext(ctx, queryMigrationsCreate); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, queryMigrationsApplied)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		done[v] = true
	}
	return done, rows.Err()
}
