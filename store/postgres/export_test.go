package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
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
