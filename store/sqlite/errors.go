package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/idem-go/idem/idemstore"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Backoff between retries of a transaction that found the database locked, after
// SQLite's own busy handler gave up (or was not consulted, as for
// SQLITE_BUSY_SNAPSHOT): full jitter up to a ceiling doubling from retryBase.
const (
	retryBase = time.Millisecond
	retryMax  = 50 * time.Millisecond
)

// interpretError translates driver errors into the package's and idem's own, once,
// at the store's edge.
func interpretError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows):
		return idemstore.ErrNotFound
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		return fmt.Errorf("sqlite: %w", err)
	}
	return err
}

// isBusy reports whether err is lock contention: SQLITE_BUSY or SQLITE_LOCKED, with
// any extended code (the driver turns extended result codes on, so SQLITE_BUSY
// arrives as SQLITE_BUSY_SNAPSHOT, SQLITE_BUSY_RECOVERY, ... too).
func isBusy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return true
	}
	return false
}

// retryBusy runs op until it returns something other than lock contention, waiting a
// jittered backoff between attempts, for as long as ctx lives. When ctx ends during
// contention it returns the context's error wrapping the last busy error.
func (s *Store) retryBusy(ctx context.Context, what string, op func() error) error {
	return retryBusy(ctx, s.logger, what, op)
}

// RetryBusy runs op again, after a jittered backoff, for as long as it fails with
// SQLite's lock contention (SQLITE_BUSY or SQLITE_LOCKED, which SQLite's own busy
// handler does not always wait out: a database switching to WAL, or recovering one,
// answers busy at once) and ctx lives. It is for the application's own transactions on
// [Store.DB] or on another SQLite database; op must be safe to run again (a whole
// transaction, rolled back on error). The Store retries its own operations itself.
func RetryBusy(ctx context.Context, op func() error) error {
	return retryBusy(ctx, discardLogger, "application", op)
}

var discardLogger = slog.New(slog.DiscardHandler)

func retryBusy(ctx context.Context, logger *slog.Logger, what string, op func() error) error {
	for attempt := 0; ; attempt++ {
		err := op()
		if !isBusy(err) {
			return err
		}
		ceiling := min(retryMax, retryBase<<min(attempt, 10))
		wait := rand.N(ceiling) + time.Microsecond
		logger.DebugContext(ctx, "sqlite: database locked, retrying", "op", what, "attempt", attempt+1, "wait", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (database locked: %w)", context.Cause(ctx), err)
		case <-t.C:
		}
	}
}

// lockWrites takes this process's write turn, or fails when ctx ends first.
func (s *Store) lockWrites(ctx context.Context, what string) error {
	select {
	case s.writeSem <- struct{}{}:
		return nil
	default:
	}
	s.logger.DebugContext(ctx, "sqlite: waiting for this process's write turn", "op", what)
	select {
	case s.writeSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (s *Store) unlockWrites() { <-s.writeSem }

// writeTx runs fn in one BEGIN IMMEDIATE transaction and commits it, retrying the
// whole transaction while the database is locked. fn must be safe to run again.
func (s *Store) writeTx(ctx context.Context, what string, fn func(tx *sql.Tx) error) error {
	return s.writeTxOn(ctx, s.db, what, fn)
}

// writeTxOn is writeTx on the pool db (the claims' own, say).
func (s *Store) writeTxOn(ctx context.Context, db *sql.DB, what string, fn func(tx *sql.Tx) error) error {
	return s.retryBusy(ctx, what, func() error {
		if err := s.lockWrites(ctx, what); err != nil {
			return err
		}
		defer s.unlockWrites()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})
}
