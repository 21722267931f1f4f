package postgres

import (
	"cmp"
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// InTx runs fn in a READ COMMITTED transaction and completes the idempotency record of
// the request's [idem.Handle] (in ctx) in that same transaction (SPEC §7): the
// application's writes and the stored response commit together or not at all. It is
// the lease path's helper, for a handler that calls something outside the database
// (a card processor) before its writes, or whose writes depend on what it reads; a
// handler whose statements are known before they run is faster with [Store.Respond].
//
// The handler writes its response inside fn: InTx refuses to commit a response the
// handler has not written yet ([idem.ErrNoResponse]: nothing commits, the client gets
// 500 internal_error, nothing is stored, and the mistake is logged), and a write after
// the completion fails (the client gets the stored response). When fn returns an
// error the transaction rolls back and InTx returns that error. Otherwise InTx asks the
// handle for the completion (none when the response releases the key, SPEC §6) and
// sends it, fenced by the lock token, together with COMMIT in one round trip. The
// transaction's BEGIN is not a round trip of its own: it goes with fn's first
// statement (or with the completion when fn runs none), and a method of tx that could
// run a statement outside the transaction (Conn, CopyFrom, …) begins it first. When the
// fence finds the key taken over ([idem.ErrLeaseLost]: the transaction rolls back) or
// COMMIT fails, the handle learns it and the middleware answers 503 store_unavailable
// instead of the handler's response.
//
// A ctx without a Handle is refused with [idem.ErrNoHandle] (a context other than the
// request's would silently lose the guarantee), unless marked by [idem.WithoutKey]: a
// plain transaction. On an idem.RouteOptions.ClaimInHandler route InTx claims the key
// first, the usual way, and returns [idem.ErrAnswered] without running fn when the
// middleware answers instead (a replay, a duplicate).
//
// InTx never retries: a failed COMMIT's outcome may be unknown, and fn has written a
// response. A panic in fn rolls back and is re-raised.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	h, err := s.txHandle(ctx, "InTx")
	if err != nil {
		return err
	}
	conn, tx, err := s.beginApp(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // a connection left inside a transaction is closed, not reused
	defer rollbackOnPanic(ctx, tx)
	if err := fn(ctx, tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	var params *idemstore.CompleteParams
	if h != nil {
		if params, err = h.PrepareCompletion(); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return err
		}
	}
	if params == nil {
		return s.commit(ctx, tx, h)
	}
	return s.completeAndCommit(ctx, conn, tx, h, params)
}

// txHandle is the Handle a SPEC §7 helper (what, for the log) completes, claimed
// under a lease: none for a context marked idem.WithoutKey, idem.ErrNoHandle (logged)
// for one without a Handle, idem.ErrAnswered when a ClaimInHandler route's claim did
// not acquire the key.
func (s *Store) txHandle(ctx context.Context, what string) (*idem.Handle, error) {
	h, err := idem.TxHandle(ctx)
	if err != nil {
		s.logger.ErrorContext(ctx, "postgres: "+what+" refused a context without the request's idem.Handle", "error", err)
		return nil, err
	}
	if h != nil {
		if err := h.AcquireForTx(ctx); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// beginApp acquires a connection of its own for an application's function (InTx,
// Step) and returns its READ COMMITTED transaction, whose BEGIN goes with the first
// statement ([lazyTx]) rather than in a round trip of its own. A connection of its own
// rather than pool.BeginTx: after a pipelined COMMIT the transaction is over on the
// server, and the connection goes back to the pool without another round trip. The
// caller releases conn.
func (s *Store) beginApp(ctx context.Context) (*pgxpool.Conn, pgx.Tx, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, interpretError(err)
	}
	return conn, &lazyTx{ctx: ctx, conn: conn}, nil
}

// rollbackOnPanic rolls tx back when the application's function panicked, and raises
// the panic again.
func rollbackOnPanic(ctx context.Context, tx pgx.Tx) {
	if p := recover(); p != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		panic(p)
	}
}

// commit commits a transaction that holds no completion.
func (s *Store) commit(ctx context.Context, tx pgx.Tx, h *idem.Handle) error {
	if err := tx.Commit(ctx); err != nil {
		err = interpretError(err)
		if h != nil {
			h.CompletionFailed(err)
		}
		return err
	}
	return nil
}

// completeAndCommit sends the fenced completion and COMMIT in one batch. A lost lease
// raises in the first statement, and the server then skips the COMMIT.
func (s *Store) completeAndCommit(ctx context.Context, conn *pgxpool.Conn, tx pgx.Tx, h *idem.Handle, p *idemstore.CompleteParams) error {
	args, err := completeArgs(p)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		h.CompletionFailed(err)
		return err
	}
	if err := fenceAndCommit(ctx, conn, tx, s.writes().recordCompleteTx, args); err != nil {
		h.CompletionFailed(err)
		return err
	}
	h.Completed()
	return nil
}

// fenceAndCommit sends a fenced statement (one that raises through idem_fence when
// the lease is lost) and COMMIT in one batch, and rolls tx back when they fail. After
// a failed fence the server skips the COMMIT: nothing commits.
func fenceAndCommit(ctx context.Context, conn *pgxpool.Conn, tx pgx.Tx, fenced string, args []any) error {
	batch := &pgx.Batch{}
	batch.Queue(fenced, args...)
	batch.Queue("COMMIT")
	br := tx.SendBatch(ctx, batch)
	_, fenceErr := br.Exec()
	tag, commitErr := br.Exec()
	closeErr := br.Close()
	// The first error is the cause: after a failed fence the server skipped the COMMIT,
	// and Close repeats the error of the statement that failed.
	err := cmp.Or(fenceErr, commitErr, closeErr)
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback // the transaction had failed before: nothing committed
	}
	if err != nil {
		err = interpretError(err)
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}
	return err
}

// CompleteTx runs the fenced completion of the record described by p inside the
// application's transaction tx, for applications that manage their own transactions
// (InTx does this for you, saving a round trip). It returns [idem.ErrLeaseLost] when the
// record is no longer in flight under p.Token; the statement then has raised, so the
// transaction is aborted: roll it back and tell the handle with
// [idem.Handle.CompletionFailed]. After a successful COMMIT call [idem.Handle.Completed].
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, p *idemstore.CompleteParams) error {
	if tx == nil {
		return errors.New("postgres: CompleteTx: tx is nil")
	}
	if p == nil {
		return errors.New("postgres: CompleteTx: params are nil")
	}
	args, err := completeArgs(p)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, s.writes().recordCompleteTx, args...)
	return interpretError(err)
}
