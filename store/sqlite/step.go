package sqlite

import (
	"context"
	"database/sql"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/sqlstore"
)

// Step runs fn as the step named step of the operation whose context ctx is (SPEC §13):
// fn's writes in tx and the record's new recovery point, with fn's result saved in the
// record, commit together in one BEGIN IMMEDIATE transaction, fenced by the lock token,
// or none of them does.
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
//	pending, err := sqlite.Step(ctx, st, "charge_pending", func(ctx context.Context, tx *sql.Tx) (Pending, error) {
//		return insertPendingCharge(ctx, tx, in)
//	})
//
// A ctx without an [idem.Handle] is refused with [idem.ErrNoHandle], unless marked by
// [idem.WithoutKey] (a request without a key): a plain transaction. As with [Store.InTx], fn holds SQLite's write lock while it runs: keep
// slow work, such as the processor call, outside it.
func Step[T any](ctx context.Context, s *Store, step string, fn func(ctx context.Context, tx *sql.Tx) (T, error)) (T, error) {
	return sqlstore.Step(ctx, s.tx, step, fn)
}

// StepTx runs the fenced step p (made by [idem.Handle.PrepareStep]) inside tx, a
// transaction the application opened on [Store.DB], for applications that manage
// their own transactions ([Step] does all of this). When the holder no longer holds
// the record it changes nothing and returns [idem.ErrLeaseLost]: roll tx back and tell
// the handle with StepFailed. After COMMIT, call [idem.Handle.StepCommitted].
func (s *Store) StepTx(ctx context.Context, tx *sql.Tx, p *idemstore.StepParams) error {
	return s.tx.Fenced(stepTx(ctx, tx, p))
}
