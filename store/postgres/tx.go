package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

// InTx runs fn in a READ COMMITTED transaction and, when ctx carries the request's
// [idem.Handle], completes the idempotency record in that same transaction (SPEC §7):
// the application's writes and the stored response commit together or not at all.
//
// The handler writes its response inside fn. When fn returns an error the transaction
// rolls back and InTx returns that error. Otherwise InTx asks the handle for the
// completion (none when the response releases the key, SPEC §6), runs it fenced by the
// lock token, and commits. When the fence finds the key taken over (ErrLeaseLost) or
// COMMIT fails, the handle learns it and the middleware answers 503 store_unavailable
// instead of the handler's response. Without a handle InTx is a plain transaction.
//
// InTx never retries: a failed COMMIT's outcome may be unknown, and fn has written a
// response. A panic in fn rolls back and is re-raised.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	h := idem.FromContext(ctx)
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return interpretError(err)
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			panic(p)
		}
	}()
	if err := fn(ctx, tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	completing := false
	if h != nil {
		p, ok := h.PrepareCompletion()
		if ok {
			if err := s.CompleteTx(ctx, tx, p); err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				h.CompletionFailed(err)
				return err
			}
			completing = true
		}
	}
	if err := tx.Commit(ctx); err != nil {
		err = interpretError(err)
		if h != nil {
			h.CompletionFailed(err)
		}
		return err
	}
	if completing {
		h.Completed()
	}
	return nil
}

// CompleteTx runs the fenced completion of the record described by p inside the
// application's transaction tx, for applications that manage their own transactions
// (InTx does this for you). It returns [idem.ErrLeaseLost] when the record is no longer
// in flight under p.Token; the caller must then roll back, and tell the handle with
// [idem.Handle.CompletionFailed]. After a successful COMMIT the caller calls
// [idem.Handle.Completed].
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, p *idem.RecordCompleteParams) error {
	if tx == nil {
		return errors.New("postgres: CompleteTx: tx is nil")
	}
	if p == nil {
		return errors.New("postgres: CompleteTx: params are nil")
	}
	return interpretError(complete(ctx, tx, s.q, p))
}
