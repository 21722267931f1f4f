package postgres

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// MigrateTo applies the migrations up to version only: a schema as a previous version
// left it, for the upgrade tests.
func (s *Store) MigrateTo(ctx context.Context, version int) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		_, err := s.migrateTx(ctx, tx, version) // as that release left it: no state record
		return err
	})
}

// KeyLock is the advisory lock (pg_advisory_xact_lock(class, id)) that a ClaimInHandler
// claim of (scope, key) holds until its transaction ends, for tests that stand in for
// a concurrent claim.
func KeyLock(scope, key string) (class, id int32) { return keyLockClass, keyLockID(scope, key) }

// ConfigurePoolWithoutProbe is ConfigurePool without the probe of each new
// connection: only a lost statement switches the pool, as behind a pooler that hands
// its clients the server process's own id (which the tests stand in for).
func ConfigurePoolWithoutProbe(cfg *pgxpool.Config, logger *slog.Logger) {
	configurePool(cfg, logger, false)
}

// ExecModeName is execModeName.
var ExecModeName = execModeName

// ExecModeNamed is execModeNamed.
var ExecModeNamed = execModeNamed

// SwitchWarning is the WARN of a pool that switched its exec mode.
const SwitchWarning = switchWarning

// UnconfiguredPoolWarning is Migrate's WARN about a pool left in pgx's default mode
// behind a pooler without ConfigurePool.
const UnconfiguredPoolWarning = unconfiguredPoolWarning

// ReadDurability reads the sessions' synchronous_commit now, as the store does in the
// background when it first writes a record, and reports whether the store now sends
// the statements that do not raise it (queries.kept).
func (s *Store) ReadDurability() bool {
	s.readDurability()
	return s.durability.kept.Load()
}

// FailAWrite runs a write that fails with err through the store's retry loop, as a
// statement whose connection was lost does, and reports whether the store still sends
// the statements that do not raise synchronous_commit.
func (s *Store) FailAWrite(ctx context.Context, err error) bool {
	_ = s.withRetry(ctx, "test", func() error { return err })
	return s.durability.kept.Load()
}
