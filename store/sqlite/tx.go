package sqlite

import (
	"context"
	"database/sql"
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/sqlstore"
)

// InTx runs fn in one BEGIN IMMEDIATE transaction and commits it together with the
// completion of the request's idempotency record (the [idem.Handle] in ctx): the SPEC
// §7 helper of the lease path, for a handler that calls something outside the
// database (a card processor) before its writes. A handler whose writes all go to
// this database is simpler with [Store.Respond], which takes the response from its
// function's return.
//
// The handler writes its response inside fn: after fn returns nil InTx asks the handle
// for the completion of that response and runs it, fenced by the lock token, in the
// same transaction. InTx refuses to commit a response the handler has not written yet
// ([idem.ErrNoResponse]: nothing commits, the client gets 500 internal_error, nothing
// is stored, and the mistake is logged), and a write after the completion fails (the
// client gets the stored response). If another request took the key over, the
// transaction rolls back and InTx returns [idem.ErrLeaseLost]; if COMMIT fails, it
// returns that error. In both cases the middleware answers 503 store_unavailable
// instead of the handler's response, because its effects did not commit.
//
// A ctx without a Handle is refused with [idem.ErrNoHandle] (a context other than the
// request's would silently lose the guarantee), unless marked by [idem.WithoutKey]: a
// plain transaction. On an idem.RouteOptions.ClaimInHandler route InTx claims the key
// first, the usual way, and returns [idem.ErrAnswered] without running fn when the
// middleware answers instead (a replay, a duplicate).
//
// When fn returns an error (or panics) the transaction rolls back and InTx returns
// that error (or re-panics). fn runs once: only BEGIN is retried while another process
// holds the write lock. fn must not call InTx or write outside tx, which would wait
// for the write lock that tx holds.
//
// The transaction holds SQLite's one write lock (and this process's write turn) while
// fn runs, so keep slow work, such as a call to a card processor, outside fn. While it
// holds the lock no process can take the key over; the middleware's lease renewal,
// which waits for the lock meanwhile, is aborted when the completion begins.
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return s.tx.InTx(ctx, fn)
}

// Respond answers the request r with the response fn returns, after committing fn's
// writes in tx together with the key's idempotency record, in one transaction (SPEC
// §7). It is the path for a handler whose writes all go to this database: the
// handler returns its response instead of writing it, and neither has to mind an
// order.
//
//	err := st.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
//		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, amount) VALUES (?, ?)`, id, amount); err != nil {
//			return nil, err
//		}
//		return idem.JSONResponse(http.StatusCreated, order)
//	})
//	if err != nil { ... } // nothing committed and nothing was sent: answer it
//
// On a route with idem.RouteOptions.ClaimInHandler the key is claimed first inside the
// transaction (BEGIN IMMEDIATE holds SQLite's write lock: no other process can claim
// it meanwhile), then fn runs, and the record is completed with fn's response before
// COMMIT: one transaction and one fsync for the whole request, no lease. When the key
// is already there nothing commits and fn does not run: Respond answers what the claim
// found (the stored response, 409 request_in_progress, key_reused), or, when it takes
// over an expired record or a lapsed lease, claims it the usual way and runs fn once
// more under the lease. Elsewhere (the middleware claimed the key before the handler)
// it completes the record, fenced by the lock token, in fn's transaction. A request
// marked idem.WithoutKey (no key) gets a plain transaction.
//
// Respond sends the response when the transaction committed, and returns nil once the
// request is answered (with fn's response, a replay, or a refusal; when the
// transaction fails on the store's side the middleware answers 503
// store_unavailable and logs it). Whatever the handler writes after that is refused.
// It returns an error, having sent nothing and committed nothing, when the handler
// must answer: fn's error. Then anything the handler answers goes through the
// middleware as usual: stored or releasing the key by its status (SPEC §6). It returns
// [idem.ErrNoHandle] for a request that is neither behind the middleware nor marked
// idem.WithoutKey. fn may run twice (the fallback above), each time in a transaction
// that commits at most once; as with InTx, it must not write outside tx.
func (s *Store) Respond(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error)) error {
	if _, err := idem.TxHandle(r.Context()); err != nil {
		s.logger.ErrorContext(r.Context(), "sqlite: Respond refused a request without an idem.Handle", "error", err)
		return err
	}
	return idem.ServeTx(w, r, func(ctx context.Context, rec *idem.TxRecord) (*idemstore.Response, error) {
		return s.respondOnce(ctx, rec, fn)
	})
}

// respondOnce runs one transaction of Respond: the claim rec asks for, fn, and the
// record's completion.
func (s *Store) respondOnce(ctx context.Context, rec *idem.TxRecord, fn func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error)) (*idemstore.Response, error) {
	claim := rec.Claim()
	if claim != nil {
		// As RecordClaim does: a plain read first, so that a replay, a duplicate or a
		// reused key is answered without queueing for the write lock.
		t := now(claim.Now)
		var existing *idemstore.Record
		err := s.retryBusy(ctx, "claim read", func() (err error) {
			existing, err = getRecord(ctx, s.db, claim.Scope, claim.Key)
			return err
		})
		if err != nil {
			return nil, &idem.StoreError{Op: "claim", Err: interpretError(err)}
		}
		if res := sqlstore.AnswerWithoutWriting(existing, claim.Fingerprint, t); res != nil {
			return nil, &idem.KeyTakenError{Found: res.Record, Now: t}
		}
	}
	tx, end, err := s.beginApp(ctx, "Respond")
	if err != nil {
		return nil, &idem.StoreError{Op: "begin", Err: err}
	}
	defer end()
	if claim != nil {
		res, err := claimTx(ctx, tx, claim, now(claim.Now))
		if err != nil {
			return nil, &idem.StoreError{Op: "claim", Err: interpretError(err)}
		}
		if err := sqlstore.KeyTaken(res); err != nil {
			return nil, err
		}
	}
	return s.tx.Respond(ctx, tx, rec, claim, fn, releaseClaimInTx, func() error {
		if err := tx.Commit(); err != nil {
			return &idem.StoreError{Op: "commit", Err: interpretError(err)}
		}
		return nil
	})
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
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p *idemstore.CompleteParams) error {
	return s.tx.Fenced(completeTx(ctx, tx, p))
}

// releaseClaimInTx deletes, in tx, a claim made by Respond's transaction whose
// response is not to be stored (SPEC §6), so that it never commits.
func releaseClaimInTx(ctx context.Context, tx *sql.Tx, p *idemstore.ClaimParams) error {
	_, err := tx.ExecContext(ctx, queryRecordRelease,
		sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("token", p.Token))
	return err
}

// txHelpers is what the SPEC §7 helpers (sqlstore.Tx) need of s.
func (s *Store) txHelpers() *sqlstore.Tx {
	return &sqlstore.Tx{
		Pkg: "sqlite", Logger: s.logger, Interpret: interpretError,
		Begin: func(ctx context.Context) (*sql.Tx, func(), error) { return s.beginApp(ctx, "application") },
		Complete: func(ctx context.Context, tx *sql.Tx, p *idemstore.CompleteParams) error {
			return completeTx(ctx, tx, p)
		},
		Step: func(ctx context.Context, tx *sql.Tx, p *idemstore.StepParams) error { return stepTx(ctx, tx, p) },
	}
}
