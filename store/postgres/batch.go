package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
)

// DefaultClaimLockTimeout is how long an [Store.InTxBatch] transaction that claims its
// key (RouteOptions.ClaimInHandler) waits for a concurrent, uncommitted claim of the
// same key before the request answers 409 request_in_progress.
const DefaultClaimLockTimeout = 100 * time.Millisecond

// InTxBatch is [Store.InTx] for a handler whose statements are known before they run:
// BEGIN, the statements queue adds, the record's completion and COMMIT travel to the
// database in one pipelined round trip (SPEC §7). The handler must write its response
// before calling InTxBatch, as the response those statements produce when they succeed
// (the completion stores it). A statement that must stop the transaction has to fail
// on the server (a constraint, a raised exception): nothing in between can stop the
// COMMIT queued behind it.
//
// The request's [idem.Handle] in ctx decides what the batch holds:
//
//   - none: BEGIN, the statements, COMMIT.
//   - the middleware claimed the key (the lease path): BEGIN, the statements, the
//     fenced completion, COMMIT. When a statement fails, nothing commits and the handle
//     learns it (the middleware answers 503) unless the handler calls
//     [idem.Handle.Reopen] to answer otherwise, for instance through InTx after a
//     unique violation that a read must explain.
//   - the route claims in the handler (RouteOptions.ClaimInHandler): BEGIN, a bounded
//     lock_timeout, the record inserted already completed, the statements, COMMIT:
//     one round trip for the whole request. When the key is already there, or a
//     statement fails, nothing commits: InTxBatch calls [idem.Handle.DeferClaim] and
//     returns an error wrapping [idem.ErrClaimDeferred], and the middleware claims the
//     usual way (a replay, a refusal, or a second run of the handler under a lease).
//     When a concurrent, uncommitted transaction holds the key for longer than
//     Config.ClaimLockTimeout it returns [idem.ErrKeyInProgress] (409
//     request_in_progress): no duplicate holds a connection for long.
//
// InTxBatch never retries; see InTx for what a failed COMMIT means.
func (s *Store) InTxBatch(ctx context.Context, queue func(b *pgx.Batch)) error {
	h := idem.FromContext(ctx)
	var (
		claim *idem.RecordClaimParams
		done  *idem.RecordCompleteParams
	)
	if h != nil {
		claim, _ = h.PrepareClaim()
		if p, ok := h.PrepareCompletion(); ok {
			done = p
		}
	}
	if done == nil {
		claim = nil // the response releases the key: nothing to record
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	if claim != nil {
		args, err := insertDoneArgs(claim, done, strconv.FormatInt(s.claimLockTimeout.Milliseconds(), 10)+"ms")
		if err != nil {
			h.CompletionFailed(err)
			return err
		}
		b.Queue(s.q.recordInsertDone, args...)
	}
	first := b.Len()
	queue(b)
	app := b.Len() - first
	if done != nil && claim == nil {
		args, err := completeArgs(done)
		if err != nil {
			h.CompletionFailed(err)
			return err
		}
		b.Queue(s.q.recordCompleteTx, args...)
	}
	b.Queue("COMMIT")

	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		err = interpretError(err)
		s.batchFailed(h, claim != nil, err)
		return err
	}
	defer conn.Release() // a connection left inside a transaction is closed, not reused
	err = s.sendBatch(ctx, conn, b, claim != nil, app, done != nil && claim == nil)
	if err != nil {
		return s.batchFailed(h, claim != nil, err)
	}
	if done != nil {
		h.Completed()
	}
	return nil
}

// sendBatch sends b and reads its results in order. The first error is the cause:
// after it the server skipped every statement up to the end of the batch, COMMIT
// included. It rolls back a transaction left open by a failure.
func (s *Store) sendBatch(ctx context.Context, conn *pgxpool.Conn, b *pgx.Batch, claims bool, app int, fenced bool) error {
	br := conn.SendBatch(ctx, b)
	var err error
	exec := func(what string) {
		if err != nil {
			return
		}
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		switch {
		case err != nil && what == "claim" && isUniqueViolation(err, "idem_records"):
			err = fmt.Errorf("%w: %w", idem.ErrClaimDeferred, err)
		case err != nil && what == "claim" && isLockTimeout(err):
			err = idem.ErrKeyInProgress
		case err != nil && what == "app" && claims:
			err = fmt.Errorf("%w: %w", idem.ErrClaimDeferred, err)
		case err == nil && what == "commit" && tag.String() != "COMMIT":
			err = pgx.ErrTxCommitRollback // the transaction had failed before
		}
	}
	exec("begin")
	if claims {
		exec("claim")
	}
	for range app {
		exec("app")
	}
	if fenced {
		exec("complete")
	}
	exec("commit")
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if pc := conn.Conn().PgConn(); err != nil && pc.TxStatus() != 'I' {
		// Through pgconn: pgx.Conn would first deallocate the statements it invalidated
		// after the error (pgx drops the cached statements of a failed batch), one more
		// round trip; the next query on this connection does that instead.
		if _, rbErr := pc.Exec(context.WithoutCancel(ctx), "ROLLBACK").ReadAll(); rbErr != nil {
			_ = pc.Close(context.WithoutCancel(ctx)) // never reuse it half-open
		}
	}
	return err
}

// batchFailed tells the handle how the batch failed and returns the error InTxBatch
// returns.
func (s *Store) batchFailed(h *idem.Handle, claims bool, err error) error {
	switch {
	case h == nil:
		return interpretError(err)
	case claims && errors.Is(err, idem.ErrClaimDeferred):
		h.DeferClaim()
		return err
	case claims && errors.Is(err, idem.ErrKeyInProgress):
		h.CompletionFailed(idem.ErrKeyInProgress)
		return err
	}
	err = interpretError(err)
	h.CompletionFailed(err)
	return err
}

// insertDoneArgs are the arguments of RecordInsertCompleted.
func insertDoneArgs(c *idem.RecordClaimParams, p *idem.RecordCompleteParams, lockTimeout string) ([]any, error) {
	resp := p.Response
	if resp == nil {
		return nil, errors.New("postgres: RecordCompleteParams.Response is nil")
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	return []any{[]byte(c.Scope), []byte(c.Key), c.RecordID, c.Fingerprint.Version, c.Fingerprint.Sum[:],
		resp.Status, encodeHeaders(resp.Header), body, resp.NotStored, micros(p.TTL), nowParam(c.Now), lockTimeout}, nil
}

// isUniqueViolation reports whether err is a unique violation on table.
func isUniqueViolation(err error, table string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.TableName == table
}

// isLockTimeout reports whether err is lock_not_available: lock_timeout ran out.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}
