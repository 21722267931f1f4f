package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/idemstore"
)

// ErrUnavailable wraps errors that mean the server could not be reached or could not
// serve the statement now: a connection refused or lost, the server shutting down or
// out of connections, a Galera node not ready, and lock contention (deadlock 1213,
// lock wait timeout 1205) that outlived the store's retries. The middleware answers
// such failures with 503 store_unavailable and keeps the key as it was.
var ErrUnavailable = errors.New("mysql: store unavailable")

// MySQL's and MariaDB's error numbers the store tells apart.
const (
	errDupEntry        = 1062 // ER_DUP_ENTRY: a duplicate primary key
	errLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	errLockDeadlock    = 1213 // ER_LOCK_DEADLOCK, also Galera's certification failure
)

// interpretError normalises every error at the store's edge: sql.ErrNoRows becomes
// idemstore.ErrNotFound; idem's own sentinels and context errors pass through;
// failures of the connection or the server's availability, and contention that
// retries did not outlast, wrap ErrUnavailable; everything else gets the package's
// prefix.
func interpretError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows):
		return idemstore.ErrNotFound
	case errors.Is(err, idemstore.ErrNotFound), errors.Is(err, idemstore.ErrLeaseLost), errors.Is(err, ErrUnavailable):
		return err
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	var me *gomysql.MySQLError
	if errors.As(err, &me) {
		if unavailableNumber(me.Number) || contention(err) {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return fmt.Errorf("mysql: %w", err)
	}
	var ne net.Error
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, gomysql.ErrInvalidConn) || errors.As(err, &ne) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return fmt.Errorf("mysql: %w", err)
}

// unavailableNumber reports the server's errors that mean "I cannot serve you now"
// rather than "your statement is wrong".
func unavailableNumber(n uint16) bool {
	switch n {
	case 1040, // ER_CON_COUNT_ERROR: too many connections
		1047, // ER_UNKNOWN_COM_ERROR: a Galera node not synced ("WSREP has not yet prepared node")
		1053, // ER_SERVER_SHUTDOWN
		1077, // ER_NORMAL_SHUTDOWN
		1290, // ER_OPTION_PREVENTS_STATEMENT: read only (a replica, a demoted primary)
		1836, // ER_READ_ONLY_MODE
		1927, // ER_CONNECTION_KILLED
		4031: // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+)
		return true
	}
	return false
}

// isNumber reports whether err is the server's error number n.
func isNumber(err error, n uint16) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && me.Number == n
}

// contention reports a deadlock (or Galera certification failure) or a lock wait
// timeout: the server rolled the statement (1205) or the whole transaction (1213)
// back, so a transaction of the store's own may run again from its start.
func contention(err error) bool {
	return isNumber(err, errLockDeadlock) || isNumber(err, errLockWaitTimeout)
}

// Retries of the store's own transactions after contention: a few quick attempts with
// jittered exponential backoff, within the request's context. Enough for a deadlock
// victim or a certification failure; short enough that a hot spot turns into 503
// quickly.
const (
	maxAttempts    = 5
	retryBaseDelay = 2 * time.Millisecond
)

// withRetry runs op, a whole transaction (or one autocommit statement) of the store's
// own that is safe to run again, while it fails with contention.
func (s *Store) withRetry(ctx context.Context, what string, op func() error) error {
	var err error
	for attempt := range maxAttempts {
		if err = op(); err == nil || !contention(err) || attempt == maxAttempts-1 {
			return err
		}
		s.logger.DebugContext(ctx, "mysql: lock contention, retrying", "op", what, "attempt", attempt+1, "err", err)
		if s.pause(ctx, attempt) != nil {
			return err
		}
	}
	return err
}

// pause waits a jittered backoff before the attempt after attempt (0 for the first
// retry), or returns the context's error when it ends first.
func (s *Store) pause(ctx context.Context, attempt int) error {
	delay := retryBaseDelay << min(attempt, 6)
	delay = delay/2 + rand.N(delay/2+1)
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// inTx runs fn in one transaction of the store's own and commits it, running the whole
// transaction again while it meets contention. fn must be safe to run again.
func (s *Store) inTx(ctx context.Context, what string, fn func(tx *sql.Tx) error) error {
	return s.withRetry(ctx, what, func() error {
		tx, err := s.db.BeginTx(ctx, nil)
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
