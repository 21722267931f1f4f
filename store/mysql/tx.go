package mysql

import (
	"context"
	"database/sql"
	"errors"
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/sqlstore"
)

// InTx runs fn in one transaction of [Store.DB] and commits it together with the
// completion of the request's idempotency record (the [idem.Handle] in ctx): the SPEC
// §7 helper of the lease path, for a handler that calls something outside the database
// (a card processor) before its writes. A handler whose writes all go to this database
// is simpler with [Store.Respond], which takes the response from its function's return.
//
// The handler writes its response inside fn: after fn returns nil InTx asks the handle
// for the completion of that response and runs it, fenced by the lock token, in the
// same transaction. InTx refuses to commit a response the handler has not written yet
// ([idem.ErrNoResponse]: nothing commits, the client gets 500 internal_error), and a
// write after the completion fails (the client gets the stored response). If another
// request took the key over, the transaction rolls back and InTx returns
// [idem.ErrLeaseLost]; if COMMIT fails (a Galera certification failure among others),
// it returns that error. In both cases the middleware answers 503 store_unavailable
// instead of the handler's response, because its effects did not commit, and the key
// stays claimed until its lease lapses.
//
// A ctx without a Handle is refused with [idem.ErrNoHandle], unless marked by
// [idem.WithoutKey]: a plain transaction. On an idem.RouteOptions.ClaimInHandler route
// InTx claims the key first, the usual way, and returns [idem.ErrAnswered] without
// running fn when the middleware answers instead (a replay, a duplicate).
//
// When fn returns an error (or panics) the transaction rolls back and InTx returns that
// error (or re-panics). fn runs once: InTx never retries it, not even after a
// deadlock, which it returns (wrapping [ErrUnavailable]).
func (s *Store) InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return s.tx.InTx(ctx, fn)
}

// Respond answers the request r with the response fn returns, after committing fn's
// writes in tx together with the key's idempotency record, in one transaction (SPEC
// §7). It is the path for a handler whose writes all go to this database: the handler
// returns its response instead of writing it.
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
// transaction (one INSERT, whose row lock makes a concurrent duplicate wait for this
// transaction's end and then find its record), then fn runs, and the record is
// completed with fn's response before COMMIT: one transaction, one commit for the whole
// request, no lease. When the key is already there nothing commits and fn does not run:
// Respond answers what the claim found (the stored response, 409 request_in_progress,
// key_reused), or, when it takes over an expired record or a lapsed lease, or loses a
// race (a duplicate that committed first, a deadlock, a Galera certification failure
// at COMMIT), claims it the usual way and runs fn once more under the lease when that
// claim acquires the key. Elsewhere (the middleware claimed the key before the handler)
// it completes the record, fenced by the lock token, in fn's transaction. A request
// marked idem.WithoutKey (no key) gets a plain transaction.
//
// Respond sends the response when the transaction committed, and returns nil once the
// request is answered. It returns an error, having sent nothing and committed nothing,
// when the handler must answer: fn's error. It returns [idem.ErrNoHandle] for a request
// that is neither behind the middleware nor marked idem.WithoutKey. fn may run twice
// (the fallback above), each time in a transaction that commits at most once.
func (s *Store) Respond(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error)) error {
	if _, err := idem.TxHandle(r.Context()); err != nil {
		s.logger.ErrorContext(r.Context(), "mysql: Respond refused a request without an idem.Handle", "error", err)
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
	var existing *idemstore.Record
	if claim != nil && !claim.LikelyNew {
		// As RecordClaim does: a plain read first, so that a replay, a duplicate or a
		// reused key is answered without a write, unless the key is likely new: then
		// the claim's INSERT finds out (a duplicate key is a lost race below).
		t := now(claim.Now)
		var err error
		if existing, err = getRecord(ctx, s.db, claim.Scope, claim.Key, false); err != nil {
			return nil, &idem.StoreError{Op: "claim", Err: interpretError(err)}
		}
		if res := sqlstore.AnswerWithoutWriting(existing, claim.Fingerprint, t); res != nil {
			return nil, &idem.KeyTakenError{Found: res.Record, Now: t}
		}
	}
	tx, end, err := s.begin(ctx)
	if err != nil {
		return nil, &idem.StoreError{Op: "begin", Err: err}
	}
	defer end()
	if claim != nil {
		t := now(claim.Now)
		res, err := claimTx(ctx, tx, claim, t, existing)
		switch {
		case errors.Is(err, errRaced), contention(err):
			// Another claim of the key won the race: the usual claim reads what it
			// committed.
			return nil, &idem.KeyTakenError{Now: t}
		case err != nil:
			return nil, &idem.StoreError{Op: "claim", Err: interpretError(err)}
		}
		if err := sqlstore.KeyTaken(res); err != nil {
			return nil, err
		}
	}
	resp, err := s.tx.Respond(ctx, tx, rec, claim, fn, releaseClaim, func() error {
		if err := tx.Commit(); err != nil {
			return &idem.StoreError{Op: "commit", Err: interpretError(err)}
		}
		return nil
	})
	if claim != nil && contention(err) {
		// The transaction that claimed the key was rolled back as a deadlock victim:
		// on a Galera cluster, a certification failure at COMMIT or an abort by
		// another node's write (1213 from fn's statements or the completion), because
		// another node committed a claim of the key first. Nothing committed: a lost
		// race, never a 5xx. The usual claim reads the winner's record.
		return nil, &idem.KeyTakenError{Now: now(claim.Now)}
	}
	return resp, err
}

// releaseClaim deletes, in tx, a claim made by Respond's transaction whose response is
// not to be stored (SPEC §6), so that it never commits.
func releaseClaim(ctx context.Context, tx *sql.Tx, p *idemstore.ClaimParams) error {
	_, err := tx.ExecContext(ctx, queryRecordRelease, p.Scope, p.Key, p.Token)
	return err
}

// begin begins the transaction of an application's function (InTx, Step, Respond); end
// rolls it back unless it committed (also when the function panics).
func (s *Store) begin(ctx context.Context) (tx *sql.Tx, end func(), err error) {
	tx, err = s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, interpretError(err)
	}
	return tx, func() { _ = tx.Rollback() }, nil // sql.ErrTxDone after a commit
}

// txHelpers is what the SPEC §7 helpers (sqlstore.Tx) need of s.
func (s *Store) txHelpers() *sqlstore.Tx {
	return &sqlstore.Tx{
		Pkg: "mysql", Logger: s.logger, Begin: s.begin, Interpret: interpretError,
		Complete: func(ctx context.Context, tx *sql.Tx, p *idemstore.CompleteParams) error {
			return completeTx(ctx, tx, p)
		},
		Step: func(ctx context.Context, tx *sql.Tx, p *idemstore.StepParams) error { return stepTx(ctx, tx, p) },
	}
}

// CompleteTx runs the fenced completion of p inside tx, a transaction the application
// opened on [Store.DB]. When the holder no longer holds the record (another request
// took the key over, or it was completed or released) it changes nothing and returns
// [idem.ErrLeaseLost]; the application must then roll tx back and tell the handle with
// CompletionFailed. [Store.InTx] does all of this.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p *idemstore.CompleteParams) error {
	return s.tx.Fenced(completeTx(ctx, tx, p))
}
