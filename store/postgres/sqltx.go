package postgres

import (
	"context"
	"database/sql"
	"errors"
	"net/http"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// The database/sql route to SPEC §7, for applications written against database/sql
// (sqlc in its database/sql mode, sqlx, GORM and others over pgx's driver): DB is a
// *sql.DB on the store's own pool, through pgx's database/sql driver
// (github.com/jackc/pgx/v5/stdlib), and RespondSQL, InSQLTx and CompleteSQLTx complete
// the record in its transactions. database/sql sends one statement per round trip: it
// cannot pipeline the fenced completion with COMMIT, nor the claim with the writes.

// DB returns a *sql.DB whose connections come from the store's pool, through pgx's
// database/sql driver: made on first use, shared afterwards, and closed by
// [Store.Close] (the pool itself stays the store's, or the application's after
// [NewFromPool]). It keeps no idle connections of its own, so it never starves the
// pool. Use it for the application's own tables; to commit their writes with a
// record's completion, use [Store.InSQLTx].
func (s *Store) DB() *sql.DB {
	s.sqlOnce.Do(func() { s.sqlDB = stdlib.OpenDBFromPool(s.pool) })
	return s.sqlDB
}

// RespondSQL is [Store.Respond] for database/sql: fn runs the handler's statements on
// a *sql.Tx of [Store.DB] (READ COMMITTED) and returns the response; RespondSQL
// completes the key's record with that response in the same transaction (SPEC §7),
// commits, and sends it, or sends what the key calls for (the stored response, 409,
// key_reused). Its contract is Respond's: return the response, never write it; an
// error comes back only when fn failed (nothing committed, nothing sent: answer it);
// a write after RespondSQL answered is refused; a request neither behind the
// middleware nor marked [idem.WithoutKey] gets [idem.ErrNoHandle].
//
// database/sql cannot pipeline, so on a route with idem.RouteOptions.ClaimInHandler
// RespondSQL has the middleware claim the key the usual way first, then runs fn's
// transaction with the record's fenced completion: a new key costs the claim, BEGIN,
// fn's statements, the completion and COMMIT, as on the lease path. When the fence finds
// the key taken over, or COMMIT fails, the middleware answers 503 store_unavailable.
// fn runs at most once. RespondSQL never retries a transaction that may have committed.
func (s *Store) RespondSQL(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error)) error {
	if _, err := idem.TxHandle(r.Context()); err != nil {
		s.logger.ErrorContext(r.Context(), "postgres: RespondSQL refused a request without an idem.Handle", "error", err)
		return err
	}
	return idem.ServeTx(w, r, func(ctx context.Context, rec *idem.TxRecord) (*idemstore.Response, error) {
		if rec.Claim() != nil {
			// No claim inside the transaction: the middleware claims the key first,
			// then ServeTx runs this once more, fenced by the claim's token.
			return nil, &idem.KeyTakenError{}
		}
		return s.respondSQLOnce(ctx, rec, fn)
	})
}

// respondSQLOnce runs RespondSQL's transaction: fn, then the record's fenced
// completion with fn's response, then COMMIT.
func (s *Store) respondSQLOnce(ctx context.Context, rec *idem.TxRecord, fn func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error)) (*idemstore.Response, error) {
	tx, err := s.DB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, &idem.StoreError{Op: "begin", Err: interpretError(err)}
	}
	defer func() { _ = tx.Rollback() }() // after COMMIT it does nothing
	resp, err := fn(ctx, tx)
	if err != nil {
		return nil, err
	}
	p, err := rec.Complete(resp)
	if err != nil {
		return nil, err
	}
	if p != nil {
		if err := s.CompleteSQLTx(ctx, tx, p); err != nil {
			if errors.Is(err, idemstore.ErrLeaseLost) {
				return nil, err
			}
			return nil, &idem.StoreError{Op: "complete", Err: err}
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, &idem.StoreError{Op: "commit", Err: interpretError(err)}
	}
	return resp, nil
}

// InSQLTx is [Store.InTx] for database/sql: it runs fn in a READ COMMITTED transaction
// of [Store.DB] and completes the idempotency record of the request's [idem.Handle]
// (in ctx) in that same transaction (SPEC §7): the application's writes and the stored
// response commit together or not at all.
//
// The handler writes its response inside fn: as InTx, InSQLTx refuses to commit a
// response not written yet ([idem.ErrNoResponse]). When fn returns an error the
// transaction rolls back and InSQLTx returns that error. Otherwise InSQLTx asks the
// handle for the completion (none when the response releases the key, SPEC §6), runs it
// fenced by the lock token, and commits. When the fence finds the key taken over
// ([idem.ErrLeaseLost]: the transaction rolls back) or COMMIT fails, the handle learns
// it and the middleware answers 503 store_unavailable instead of the handler's
// response. A ctx without a Handle is refused with [idem.ErrNoHandle], unless marked
// by [idem.WithoutKey]: a plain transaction.
//
// InSQLTx never retries: a failed COMMIT's outcome may be unknown, and fn has written a
// response. A panic in fn rolls back and is re-raised.
func (s *Store) InSQLTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	h, err := s.txHandle(ctx, "InSQLTx")
	if err != nil {
		return err
	}
	tx, err := s.DB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return interpretError(err)
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback()
			panic(p)
		}
	}()
	if err := fn(ctx, tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if h == nil {
		return interpretError(tx.Commit())
	}
	params, err := h.PrepareCompletion()
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	if params != nil {
		if err := s.CompleteSQLTx(ctx, tx, params); err != nil {
			_ = tx.Rollback()
			h.CompletionFailed(err)
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		err = interpretError(err)
		h.CompletionFailed(err)
		return err
	}
	if params != nil {
		h.Completed()
	}
	return nil
}

// CompleteSQLTx is [Store.CompleteTx] for database/sql: it runs the fenced completion
// of the record described by p inside tx, a transaction the application began on
// [Store.DB] (or on another *sql.DB opened with pgx's database/sql driver on the
// store's database), for applications that manage their own transactions (InSQLTx does
// this for you). It returns [idem.ErrLeaseLost] when the record is no longer in flight
// under p.Token; the statement then has raised, so the transaction is aborted: roll it
// back and tell the handle with [idem.Handle.CompletionFailed]. After a successful
// COMMIT call [idem.Handle.Completed].
func (s *Store) CompleteSQLTx(ctx context.Context, tx *sql.Tx, p *idemstore.CompleteParams) error {
	if tx == nil {
		return errors.New("postgres: CompleteSQLTx: tx is nil")
	}
	if p == nil {
		return errors.New("postgres: CompleteSQLTx: params are nil")
	}
	args, err := completeArgs(p)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, s.writes().recordCompleteTx, args...)
	return interpretError(err)
}
