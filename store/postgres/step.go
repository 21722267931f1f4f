package postgres

import (
	"context"
	"errors"

	"github.com/idem-go/idem/idemstore"
	"github.com/jackc/pgx/v5"
)

// Step runs fn as the step named step of the operation whose context ctx is (SPEC §13):
// fn's writes in tx and the record's new recovery point, with fn's result saved in the
// record, commit together in one READ COMMITTED transaction, fenced by the lock token,
// or none of them does. The fenced step and COMMIT travel in one round trip.
//
// When the step committed already (in an earlier run of the operation, before its
// holder died, or before it released the key after an error) Step returns the saved
// result without running fn: a holder that takes the key over, or the
// [idem.Completer], runs the operation from the top and resumes after its last
// committed step. When the key was taken over (the fence fails) nothing commits, Step
// returns [idem.ErrLeaseLost] and the operation's context is cancelled. When fn
// returns an error (or panics) the transaction rolls back and Step returns it (or
// re-panics). The result must survive a JSON round trip and be small (an id, an
// amount: [idem.MaxStepResultsBytes] bounds all of a record's results).
//
// A charge in Brandur Leach's order: a first step records the charge as pending
// (before the card processor is called, so that a crash during the call leaves a
// trace to resume from); the processor call, with the key
// [idem.Handle.DerivedKey]("processor_charge"); then [idem.Finish] over [Store.InTx],
// which saves the processor's answer, completes the charge and completes the record
// with the response its function returns, in the handler and in the route's resume
// function alike.
//
// step is an identifier, like the route's name ([idem.RouteOptions.Name]) and the
// derived key's step: the record keeps it, and a resumed operation finds its saved
// result by it. Keep step names stable across deploys while operations are
// unfinished: a renamed step runs again on resume.
//
//	pending, err := postgres.Step(ctx, st, "charge_pending", func(ctx context.Context, tx pgx.Tx) (Pending, error) {
//		return insertPendingCharge(ctx, tx, in)
//	})
//
// A ctx without an [idem.Handle] is refused with [idem.ErrNoHandle], unless marked by
// [idem.WithoutKey] (a request without a key): a plain transaction. Step never
// retries: fn has run.
func Step[T any](ctx context.Context, s *Store, step string, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	var v, zero T
	h, err := s.txHandle(ctx, "Step")
	if err != nil {
		return zero, err
	}
	if h != nil {
		if done, err := h.StepResult(step, &v); done || err != nil {
			return v, err
		}
	}
	conn, tx, err := s.beginApp(ctx)
	if err != nil {
		return zero, err
	}
	defer conn.Release()
	defer rollbackOnPanic(ctx, tx)
	if v, err = fn(ctx, tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return zero, err
	}
	if h == nil {
		if err := tx.Commit(ctx); err != nil {
			return zero, interpretError(err)
		}
		return v, nil
	}
	p, err := h.PrepareStep(step, v)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return zero, err
	}
	if err := fenceAndCommit(ctx, conn, tx, s.writes().recordStepTx, stepArgs(p)); err != nil {
		h.StepFailed(err)
		return zero, err
	}
	h.StepCommitted(p)
	return v, nil
}

// StepTx runs the fenced step p (made by [idem.Handle.PrepareStep]) inside the
// application's transaction tx, for applications that manage their own transactions
// ([Step] does this for you, saving a round trip). It returns [idem.ErrLeaseLost] when
// the record is no longer in flight under p.Token; the statement then has raised, so
// the transaction is aborted: roll it back and tell the handle with
// [idem.Handle.StepFailed]. After a successful COMMIT call [idem.Handle.StepCommitted].
func (s *Store) StepTx(ctx context.Context, tx pgx.Tx, p *idemstore.StepParams) error {
	if tx == nil || p == nil {
		return errors.New("postgres: StepTx needs a transaction and params")
	}
	_, err := tx.Exec(ctx, s.writes().recordStepTx, stepArgs(p)...)
	return interpretError(err)
}
