package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrUnavailable wraps errors that mean the database could not be reached or could not
// serve the statement (connection refused or lost, the server shutting down or out of
// connections). The middleware answers such failures with 503 store_unavailable; the
// pool reconnects by itself once the database returns.
var ErrUnavailable = errors.New("postgres: store unavailable")

// interpretError normalises every error at the store's edge: pgx.ErrNoRows becomes
// idem.ErrNotFound, connection-level failures wrap ErrUnavailable, and everything else
// is returned with the package's prefix. idem's own sentinels and context errors pass
// through unchanged.
func interpretError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return idemstore.ErrNotFound
	case errors.Is(err, idemstore.ErrNotFound), errors.Is(err, idemstore.ErrLeaseLost), errors.Is(err, ErrUnavailable):
		return err
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == sqlstateLeaseLost {
			return idemstore.ErrLeaseLost
		}
		if lostStatement(pgErr) {
			return fmt.Errorf("%w: %w (%s)", ErrUnavailable, err, poolerHint)
		}
		if unavailableCode(pgErr.Code) {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return fmt.Errorf("postgres: %w", err)
	}
	// Not an answer from the server: the connection could not be made or was lost.
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// poolerHint says what to do when the server lost a prepared statement of the
// connection's: a transaction pooler gave the connection's next transaction another
// server connection (see "Poolers" in the package doc).
const poolerHint = "a connection pooler in transaction mode between idem and PostgreSQL keeps no prepared statement " +
	"from one transaction to the next: set default_query_exec_mode=cache_describe (or exec) in the database URL, " +
	"or let the pooler keep them (PgBouncer 1.21 or later with max_prepared_statements > 0); a pool that " +
	"postgres.ConfigurePool configured, with no mode in its URL, switches by itself"

// lostStatement reports the server's errors about a prepared statement that the
// connection's earlier round trips made and this one does not find as it was: one that
// does not exist (26000), one prepared already under that name (42P05), or an unnamed
// one whose parameters differ (08P01: the Bind of describe_exec met another client's).
// Between idem and PostgreSQL that only happens behind a transaction pooler.
func lostStatement(e *pgconn.PgError) bool {
	switch e.Code {
	case "26000", "42P05":
		return true
	case "08P01":
		return strings.Contains(e.Message, "prepared statement")
	}
	return false
}

// sqlstateLeaseLost is raised by idem_fence (migration 0002) when the fenced completion
// inside an application's transaction found the record no longer held.
const sqlstateLeaseLost = "IDL01"

// unavailableCode reports SQLSTATEs that mean "the server cannot serve you now" rather
// than "your statement is wrong": connection exceptions (08), insufficient resources
// (53), operator intervention (57: shutdown, cannot connect now).
func unavailableCode(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "08", "53":
		return true
	case "57":
		return code != "57014" // query_canceled is the caller's own timeout
	}
	return false
}

// retryable reports errors after which a single autocommit statement may safely run
// again: the statement certainly did not take effect. A serialization failure (40001) or
// deadlock (40P01) rolled it back; a lost prepared statement (lostStatement: its Parse
// or its Bind refused, behind a pooler) never ran, and the pool that saw it has
// switched to a mode that works there (ConfigurePool), so the next attempt takes a
// connection in that mode; SafeToRetry means nothing reached the server. A connection
// lost mid-statement is not retryable: its outcome is unknown.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40001" || pgErr.Code == "40P01" || lostStatement(pgErr)
	}
	return pgconn.SafeToRetry(err)
}

// isLostStatement reports whether err is a lost prepared statement (lostStatement):
// the statement that met it did not run.
func isLostStatement(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && lostStatement(pgErr)
}

// Statement retries: a few quick attempts with jittered exponential backoff, within the
// request's context. Enough for a deadlock victim; short enough that a database that is
// down turns into 503 quickly.
const (
	maxStatementAttempts = 3
	retryBaseDelay       = 5 * time.Millisecond
)

// withRetry runs one autocommit statement, retrying it while retryable says so.
func (s *Store) withRetry(ctx context.Context, op string, fn func() error) error {
	var err error
	for attempt := range maxStatementAttempts {
		if err = fn(); err != nil && errors.Is(interpretError(err), ErrUnavailable) {
			s.durability.forget()
		}
		if err == nil || !retryable(err) {
			return err
		}
		if attempt == maxStatementAttempts-1 {
			break
		}
		s.logger.DebugContext(ctx, "postgres: retrying statement", "op", op, "attempt", attempt+1, "err", err)
		delay := retryBaseDelay << attempt
		delay = delay/2 + rand.N(delay/2+1)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
	return err
}
