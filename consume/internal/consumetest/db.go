package consumetest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

// The effects table: one row per run of an effect, and no unique constraint, so that
// a second run of one message's effect shows.
const (
	createEffects        = `CREATE TABLE killtest_effects (id TEXT NOT NULL, pid INTEGER NOT NULL)`
	insertEffect         = `INSERT INTO killtest_effects (id, pid) VALUES (?, ?)`
	insertEffectPostgres = `INSERT INTO killtest_effects (id, pid) VALUES ($1, $2)`
	countEffects         = `SELECT count(*), count(DISTINCT id) FROM killtest_effects`
)

// database is a run's database, seen from the parent.
type database struct {
	// env tells the consumers where it is.
	env []string
	// count returns how many effects ran, and for how many distinct messages.
	count func(t *testing.T) (rows, distinct int)
}

// newDatabase creates a fresh database of kind ("sqlite" or "postgres") private to t,
// with the idempotency store migrated and the effects table created.
func newDatabase(t *testing.T, kind string) *database {
	t.Helper()
	ctx := context.Background()
	switch kind {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "consumetest.db")
		st, err := sqlite.Open(ctx, path, sqlite.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := st.DB().ExecContext(ctx, createEffects); err != nil {
			t.Fatal(err)
		}
		return &database{
			env: []string{envDB + "=sqlite", envDSN + "=" + path},
			count: func(t *testing.T) (rows, distinct int) {
				if err := st.DB().QueryRowContext(ctx, countEffects).Scan(&rows, &distinct); err != nil {
					t.Fatalf("counting the effects: %v", err)
				}
				return rows, distinct
			},
		}
	case "postgres":
		dbURL, schema := pgtest.Schema(t)
		dsn := pgtest.SearchPathURL(t, dbURL, schema)
		st, err := postgres.Open(ctx, dsn, postgres.Config{Schema: schema, MaxConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Pool().Exec(ctx, createEffects); err != nil {
			t.Fatal(err)
		}
		return &database{
			env: []string{envDB + "=postgres", envDSN + "=" + dsn, envSchema + "=" + schema},
			count: func(t *testing.T) (rows, distinct int) {
				if err := st.Pool().QueryRow(ctx, countEffects).Scan(&rows, &distinct); err != nil {
					t.Fatalf("counting the effects: %v", err)
				}
				return rows, distinct
			},
		}
	}
	t.Fatalf("consumetest: unknown database %q", kind)
	return nil
}
