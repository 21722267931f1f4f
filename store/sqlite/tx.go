package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// InTx runs fn in one BEGIN IMMEDIATE transaction and commits it: the SPEC §7 helper
// that commits the application's writes and the idempotency record's completion
// together, or neither.
//
// When ctx carries an [idem.Handle] (the request came through the idem middleware with
// a key), after fn returns nil InTx asks the handle for the completion of the response
// the handler wrote (inside fn) and runs it, fenced by the lock token, in the same
// transaction. If another request took the key over, the transaction rolls back and
// InTx returns [idem.ErrLeaseLost]; if COMMIT fails, it returns that error. In both
// cases the middleware answers 503 store_unavailable instead of the handler's
// response, because its effects did not commit. Without a handle InTx is a plain
// transaction.
//
// When fn returns an error (or panics) the transaction rolls back and InTx returns
// that error (or re-panics). fn runs once: only BEGIN is retried while another process
// holds the write lock. fn must not call InTx or write outside tx, which would wait
// for the write lock that tx holds.
//
// On a route that claims in the handler (idem.RouteOptions.ClaimInHandler) InTx also
// claims the key, first thing in its transaction: the claim, the application's writes
// and the completion commit together, with one fsync and no lease to renew (the write
// lock is the lock). When the key is already there, in any state but expired, nothing
// commits: InTx calls [idem.Handle.DeferClaim] and returns an error wrapping
// [idem.ErrClaimDeferred] without running fn, and the middleware claims the usual way.
//
// The transaction holds SQLite's one write lock (and this process's write turn) while
// fn runs, so keep slow work, such as a call to a card processor, outside fn. While it
// holds the lock no process can take the key over; the middleware's lease renewal,
// which waits for the lock meanwhile, is aborted when the completion begins.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	h := idem.FromContext(ctx)
	tx, end, err := s.beginApp(ctx, "InTx")
	if err != nil {
		return err
	}
	defer end()

	claimed, err := s.claimInTx(ctx, tx, h)
	if err != nil {
		return err
	}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	completing := false
	if h != nil {
		var p *idem.RecordCompleteParams
		if p, completing = h.PrepareCompletion(); completing {
			if err := s.CompleteTx(ctx, tx, p); err != nil {
				h.CompletionFailed(err)
				return err
			}
		} else if err := releaseClaimInTx(ctx, tx, claimed); err != nil {
			h.CompletionFailed(err)
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		err = interpretError(err)
		if h != nil {
			// Even a response that releases the key must not reach the client: its
			// effects did not commit.
			h.CompletionFailed(err)
		}
		return err
	}
	if completing {
		h.Completed()
	}
	return nil
}

// beginApp begins the transaction of an application's function (InTx, Step): it takes
// this process's write turn, then BEGIN IMMEDIATE, retried while another process holds
// the write lock. end rolls the transaction back unless it committed (also when the
// function panics) and gives the write turn back.
func (s *Store) beginApp(ctx context.Context, what string) (tx *sql.Tx, end func(), err error) {
	if err := s.lockWrites(ctx, what); err != nil {
		return nil, nil, err
	}
	err = s.retryBusy(ctx, "begin", func() (err error) {
		tx, err = s.db.BeginTx(ctx, nil)
		return err
	})
	if err != nil {
		s.unlockWrites()
		return nil, nil, interpretError(err)
	}
	return tx, func() {
		_ = tx.Rollback() // sql.ErrTxDone after a commit
		s.unlockWrites()
	}, nil
}

// CompleteTx runs the fenced completion of p inside tx, a transaction the application
// opened on [Store.DB] (which begins IMMEDIATE). When the holder no longer holds the
// record (another request took the key over, or it was completed or released) it
// changes nothing and returns [idem.ErrLeaseLost]; the application must then roll tx
// back and tell the handle with CompletionFailed. [Store.InTx] does all of this.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p *idem.RecordCompleteParams) error {
	err := completeTx(ctx, tx, p)
	if errors.Is(err, idem.ErrLeaseLost) {
		return err
	}
	return interpretError(err)
}

// claimInTx claims the key of a ClaimInHandler route inside tx, before the handler's
// writes. It returns the claim it made (nil when the route does not claim in the
// handler), or an error wrapping idem.ErrClaimDeferred, having told the handle, when
// the key is taken.
func (s *Store) claimInTx(ctx context.Context, tx *sql.Tx, h *idem.Handle) (*idem.RecordClaimParams, error) {
	if h == nil {
		return nil, nil
	}
	p, ok := h.PrepareClaim()
	if !ok {
		return nil, nil
	}
	res, err := claimTx(ctx, tx, p, now(p.Now))
	if err != nil {
		err = interpretError(err)
		h.CompletionFailed(err)
		return nil, err
	}
	if res.Outcome != idem.ClaimAcquired || res.TookOver {
		// A replay, a duplicate or a mismatch (or a lapsed lease: the middleware logs
		// takeovers) is the middleware's to answer.
		h.DeferClaim()
		return nil, fmt.Errorf("%w (%s)", idem.ErrClaimDeferred, res.Outcome)
	}
	return p, nil
}

// releaseClaimInTx deletes, in tx, a claim made by claimInTx (none when p is nil)
// whose response is not to be stored (SPEC §6), so that it never commits.
func releaseClaimInTx(ctx context.Context, tx *sql.Tx, p *idem.RecordClaimParams) error {
	if p == nil {
		return nil
	}
	_, err := tx.ExecContext(ctx, queryRecordRelease,
		sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("token", p.Token))
	return interpretError(err)
}
