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
	err = s.writeTx(ctx, "migrate", func(tx *sql.Tx) error {
		applied = applied[:0]
		done, err := appliedVersions(ctx, tx)
		if err != nil {
			return err
		}
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
	return nil
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
