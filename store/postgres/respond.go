package postgres

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// DefaultClaimLockTimeout is how long a [Store.Respond] transaction that claims its key
// (idem.RouteOptions.ClaimInHandler) waits for a concurrent, uncommitted claim of the
// same key before the request answers 409 request_in_progress.
const DefaultClaimLockTimeout = 100 * time.Millisecond

// claimInsertLockTimeout bounds the other lock waits of a ClaimInHandler claim's insert
// (the table's extension lock, which a database busy with I/O can hold longer than
// ClaimLockTimeout; a row of the key that a transaction of another route updates):
// long enough that a slow disk does not answer a fresh key 409, short enough that a
// stuck transaction does not hold the request forever (it answers 409 too).
const claimInsertLockTimeout = "5s"

// keyLockClass is the first key of the advisory locks of ClaimInHandler claims
// (pg_advisory_xact_lock(int4, int4): 'idm1'); the second is keyLockID of the key.
// RecordInsertCompleted writes it as a literal (1768189233); the tests that stand in
// for a concurrent claim take the lock through this constant, and would wait seconds
// instead of ClaimLockTimeout if the two differed.
const keyLockClass = 0x69646d31

// keyLockID is the second key of the advisory lock that a ClaimInHandler claim holds
// for its (scope, key) until its transaction ends: 32-bit FNV-1a of scope, a zero
// byte and key. Two keys that share it only make one wait for the other.
func keyLockID(scope, key string) int32 {
	h := uint32(2166136261)
	for i := 0; i < len(scope); i++ {
		h = (h ^ uint32(scope[i])) * 16777619
	}
	h *= 16777619 // the zero byte: h ^ 0 == h
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return int32(h)
}

// Respond answers the request r with the response fn returns, after committing the
// statements fn queues on b together with the key's idempotency record, in one
// transaction (SPEC §7). It is the path for a handler whose writes all go to this
// database and are known before they run: the handler returns its response instead of
// writing it, and neither has to mind an order.
//
//	err := st.Respond(w, r, func(b *pgx.Batch) (*idem.Response, error) {
//		b.Queue(`INSERT INTO orders (id, scope, amount) VALUES ($1, $2, $3)`, id, scope, amount)
//		return idem.JSONResponse(http.StatusCreated, order)
//	})
//	if err != nil { ... } // nothing committed and nothing was sent: answer it
//
// On a route with idem.RouteOptions.ClaimInHandler the whole request is one round
// trip: the record inserted already completed with the response (under the key's
// advisory lock, waited for at most Config.ClaimLockTimeout), the statements and the
// commit, pipelined. When the key is recorded already, nothing commits and Respond
// claims it the usual way: it answers the stored response, 409 request_in_progress or
// key_reused, or, having taken over an expired record or a lapsed lease, sends the
// statements once more with the record's fenced completion. (While the route's
// requests often find their key recorded, the middleware reads the key before the
// handler and answers a retry from that read: it never reaches Respond.) Elsewhere (the middleware
// claimed the key before the handler) it is BEGIN, the statements, the fenced
// completion and COMMIT: one round trip after the claim's. A request marked
// idem.WithoutKey (no key) gets BEGIN, the statements and COMMIT.
//
// Respond sends the response when the transaction committed, and returns nil once the
// request is answered (with fn's response, a replay, or a refusal; when the
// transaction fails on the store's side the middleware answers 503 store_unavailable,
// or 409 when a concurrent request holds the key, and logs it). Whatever the handler
// writes after that is refused. It returns an error, having sent nothing and
// committed nothing, when the handler must answer: fn's error, or the error of one of
// fn's statements, whether the server refused it before it ran (a table that does not
// exist) or it failed while running (a constraint, a raised exception: a statement
// that must stop the transaction fails on the server, as nothing in between can stop
// the COMMIT queued behind it); never as the store being unavailable. Then anything the handler answers goes through the middleware as
// usual: stored or releasing the key by its status (SPEC §6). It returns
// [idem.ErrNoHandle] for a request that is neither behind the middleware nor marked
// idem.WithoutKey. fn runs once per call of Respond, before anything is sent: its
// statements may be sent twice (the fallback above), each time in a transaction that
// commits at most once. On a ClaimInHandler route the requests of a key that one
// process serves call it once: the middleware answers a key the process knows before
// the handler (409 while its handler runs there, a read once it is recorded there).
// A retry that another process serves while the route sees few retries still reaches
// the handler, and fn runs for it before its batch finds the key recorded (its
// statements never commit; the request is answered the replay, 409 or key_reused). So
// fn only builds the statements and the response: work of any other kind (a call to
// another system, a message sent) belongs under a lease (a lease route, or InTx), or
// must be idempotent itself. RespondSQL and the SQLite store's Respond claim the key
// before fn runs: there fn runs only for the request that executes.
//
// Respond never retries a transaction that may have committed.
func (s *Store) Respond(w http.ResponseWriter, r *http.Request, fn func(b *pgx.Batch) (*idemstore.Response, error)) error {
	if _, err := idem.TxHandle(r.Context()); err != nil {
		s.logger.ErrorContext(r.Context(), "postgres: Respond refused a request without an idem.Handle", "error", err)
		return err
	}
	app := &pgx.Batch{}
	resp, err := fn(app)
	if err != nil {
		return err
	}
	return idem.ServeTx(w, r, func(ctx context.Context, rec *idem.TxRecord) (*idemstore.Response, error) {
		return resp, s.respondOnce(ctx, rec, resp, app)
	})
}

// A transaction of Respond is a pipelined batch without BEGIN: one implicit
// transaction, committed at its end, or rolled back by the first error with nothing
// more to send (no ROLLBACK round trip). It runs at the connection's default isolation
// level, which is READ COMMITTED unless the database, the role or the session says
// otherwise; on a connection whose default is another level the batch opens with
// beginReadCommitted and ends with COMMIT instead. (SET TRANSACTION cannot set it: in
// a pipeline without BEGIN PostgreSQL answers it with a WARNING, one line in the
// server's log per request.)
const beginReadCommitted = "BEGIN ISOLATION LEVEL READ COMMITTED"

// readCommittedKey is the key of the connection's CustomData that says whether its
// default isolation level is READ COMMITTED (defaultReadCommitted).
const readCommittedKey = "idem.postgres.readCommitted"

// defaultReadCommitted reports whether conn's transactions are READ COMMITTED by
// default, read from the server once per connection. (A session that changes
// default_transaction_isolation afterwards runs Respond at its level.)
func defaultReadCommitted(ctx context.Context, conn *pgx.Conn) (bool, error) {
	data := conn.PgConn().CustomData()
	if rc, ok := data[readCommittedKey].(bool); ok {
		return rc, nil
	}
	var level string
	if err := conn.QueryRow(ctx, `SELECT current_setting('default_transaction_isolation')`).Scan(&level); err != nil {
		return false, err
	}
	rc := level == "read committed"
	data[readCommittedKey] = rc
	return rc, nil
}

// respondOnce sends one transaction of Respond, pipelined in one round trip: READ
// COMMITTED, the record's claim (the insert of the completed record, under the key's
// advisory lock) or its fenced completion, as rec says, and the statements of app.
// A transaction that met a prepared statement lost behind a pooler (isLostStatement:
// a Parse or a Bind refused, after which the server ran nothing more of the batch and
// rolled it back) is sent once more, on another connection: the pool switched to a
// mode that works there (ConfigurePool).
func (s *Store) respondOnce(ctx context.Context, rec *idem.TxRecord, resp *idemstore.Response, app *pgx.Batch) error {
	done, err := rec.Complete(resp)
	if err != nil {
		return err
	}
	claim := rec.Claim()
	if done == nil {
		claim = nil // the response releases the key: nothing to record
	}
	err = s.respondTx(ctx, claim, done, app)
	if isLostStatement(err) {
		s.logger.InfoContext(ctx, "postgres: Respond's transaction met a prepared statement lost behind a connection pooler, "+
			"and ran nothing; sending it once more", "error", err)
		err = s.respondTx(ctx, claim, done, app)
	}
	return err
}

// respondTx sends respondOnce's transaction on a connection of the pool.
func (s *Store) respondTx(ctx context.Context, claim *idemstore.ClaimParams, done *idemstore.CompleteParams, app *pgx.Batch) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return &idem.StoreError{Op: "begin", Err: interpretError(err)}
	}
	defer conn.Release() // a connection left inside a transaction is closed, not reused
	implicit, err := defaultReadCommitted(ctx, conn.Conn())
	if err != nil {
		return &idem.StoreError{Op: "begin", Err: interpretError(err)}
	}
	b := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(app.QueuedQueries)+4)}
	if !implicit {
		b.Queue(beginReadCommitted)
	}
	if claim != nil {
		args, err := insertDoneArgs(claim, done, strconv.FormatInt(s.claimLockTimeout.Milliseconds(), 10)+"ms")
		if err != nil {
			return err
		}
		b.Queue(s.writes().recordInsertDone, args...)
	}
	appFrom := len(b.QueuedQueries)
	for _, q := range app.QueuedQueries {
		// A copy: pgx keeps what it learnt of the statement on the queued query, and
		// a second attempt runs on another connection.
		b.QueuedQueries = append(b.QueuedQueries, &pgx.QueuedQuery{SQL: q.SQL, Arguments: q.Arguments, Fn: q.Fn})
	}
	fenced := done != nil && claim == nil
	if fenced {
		args, err := completeArgs(done)
		if err != nil {
			return err
		}
		b.Queue(s.writes().recordCompleteTx, args...)
	}
	if !implicit {
		b.Queue("COMMIT")
	}
	return s.sendBatch(ctx, conn, b, !implicit, claim, appFrom, len(app.QueuedQueries), fenced)
}

// sendBatch sends b and reads its results in order, classifying the first error for
// idem.ServeTx: the claim's (an idem.KeyTakenError when the key is recorded already,
// or idem.ErrKeyInProgress), a statement of the application's (as is), the fence's
// (idem.ErrLeaseLost), or the store's (an idem.StoreError). The application's
// statements are the app from appFrom on. After the first error the server skipped
// every statement up to the end of the batch, and rolled its implicit transaction back.
func (s *Store) sendBatch(ctx context.Context, conn *pgxpool.Conn, b *pgx.Batch, explicit bool, claim *idemstore.ClaimParams, appFrom, app int, fenced bool) error {
	appSQL := make(map[string]bool, app)
	for _, q := range b.QueuedQueries[appFrom : appFrom+app] {
		appSQL[q.SQL] = true
	}
	br := conn.SendBatch(ctx, b)
	var err error
	next := 0 // the statement exec reads the results of
	var callbackErr error
	exec := func(what string) {
		q := b.QueuedQueries[next]
		next++
		if err != nil {
			return
		}
		if what == "app" && q.Fn != nil {
			// A callback of the application's (QueryRow, Query, Exec on the queued
			// query) reads the statement's results. Its own error cannot stop the
			// transaction, which the server commits at the batch's end: it is logged.
			if cbErr := q.Fn(br); cbErr != nil {
				var pgErr *pgconn.PgError
				if isLostStatement(cbErr) {
					err = &idem.StoreError{Op: what, Err: interpretError(cbErr)}
				} else if errors.As(cbErr, &pgErr) {
					err = classifyApp(cbErr)
				} else if callbackErr == nil { // a broken connection fails Close too
					callbackErr = cbErr
				}
			}
			return
		}
		_, err = br.Exec()
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
		case isLostStatement(err):
			// A statement's Parse or Bind refused behind a pooler, the application's
			// too: nothing of the batch ran, and respondOnce sends it once more.
			err = &idem.StoreError{Op: what, Err: interpretError(err)}
		case refusedApp(err, appSQL):
			// pgx describes (prepares) the batch's new statements before it sends
			// them, and the server refused one of the application's (a table that
			// does not exist, a syntax error): the handler's error to answer, never
			// the store being unavailable.
		case what == "claim":
			err = claimError(err)
		case what == "app" && errors.As(err, &pgErr):
			err = classifyApp(err)
		case what == "complete" && errors.Is(interpretError(err), idemstore.ErrLeaseLost):
			err = idemstore.ErrLeaseLost
		default:
			err = &idem.StoreError{Op: what, Err: interpretError(err)}
		}
	}
	if explicit {
		exec("begin")
	}
	if claim != nil {
		exec("claim")
	}
	for range app {
		exec("app")
	}
	if fenced {
		exec("complete")
	}
	if explicit {
		exec("commit")
	}
	if stoppedAtTheClaim(err) {
		keepStatementCaches(b)
	}
	// Close reads to the batch's end, where the implicit transaction commits: an
	// error there is the commit's.
	if closeErr := br.Close(); err == nil && closeErr != nil {
		err = &idem.StoreError{Op: "commit", Err: interpretError(closeErr)}
	}
	if pc := conn.Conn().PgConn(); err != nil && pc.TxStatus() != 'I' {
		// Left in a transaction (a statement of the application's began one): roll it
		// back through pgconn, without the deallocations pgx.Conn would send first.
		if _, rbErr := pc.Exec(context.WithoutCancel(ctx), "ROLLBACK").ReadAll(); rbErr != nil {
			_ = pc.Close(context.WithoutCancel(ctx)) // never reuse it half-open
		}
	}
	if callbackErr != nil {
		s.logger.ErrorContext(ctx, "postgres: a callback of Respond's statements failed; the transaction's outcome stands",
			"error", callbackErr, "committed", err == nil)
	}
	return err
}

// refusedApp reports whether err is the server's refusal of one of the application's
// statements (appSQL) when pgx described it before sending the batch.
func refusedApp(err error, appSQL map[string]bool) bool {
	var pre pgx.ErrPreprocessingBatch
	var pgErr *pgconn.PgError
	return errors.As(err, &pre) && appSQL[pre.SQL()] && errors.As(err, &pgErr)
}

// stoppedAtTheClaim reports whether a Respond batch stopped at its claim by design:
// the key is recorded already (idem_stop, or a record committed since the claim's
// snapshot) or another claim of it holds its lock.
func stoppedAtTheClaim(err error) bool {
	var taken *idem.KeyTakenError
	return errors.As(err, &taken) || errors.Is(err, idem.ErrKeyInProgress)
}

// keepStatementCaches keeps pgx's statement and description caches of the
// connection whole after a batch that stopped at its claim by design. pgx drops every
// statement of a batch that failed from its caches, on the guess that a statement's
// plan went stale, which costs the connection's next batch a DEALLOCATE and a new
// PREPARE (cache_statement) or a new describe (cache_describe); on a ClaimInHandler
// route every replay that reaches Respond stops there (TestRespondRoundTrips). The
// results read already, pgx's Close only closes the pipeline and forgets the
// statements of the batch it was given, which is b: with its queue emptied, it
// forgets none. It never prepares a statement of its own: no session state that a
// transaction pooler would not keep.
func keepStatementCaches(b *pgx.Batch) { b.QueuedQueries = nil }

// classifyApp returns the error of one of the application's statements as Respond
// returns it: a server's error as is, anything else as the store's. (After a schema
// change the server refuses a statement whose plan pgx cached, "cached plan must not
// change result type": pgx forgets the statements of a failed batch, and the next
// prepares them afresh.)
func classifyApp(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return &idem.StoreError{Op: "app", Err: interpretError(err)}
	}
	return err
}

// claimError classifies the error of RecordInsertCompleted.
func claimError(err error) error {
	switch {
	case err == nil:
		return nil
	case isKeyStop(err), isUniqueViolation(err, "idem_records"): // recorded already, or since the statement's snapshot
		return &idem.KeyTakenError{Err: err}
	case isLockTimeout(err):
		return idem.ErrKeyInProgress
	}
	return &idem.StoreError{Op: "claim", Err: interpretError(err)}
}

// insertDoneArgs are the arguments of RecordInsertCompleted.
func insertDoneArgs(c *idemstore.ClaimParams, p *idemstore.CompleteParams, lockTimeout string) ([]any, error) {
	resp := p.Response
	if resp == nil {
		return nil, errors.New("postgres: idemstore.CompleteParams.Response is nil")
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	return []any{[]byte(c.Scope), []byte(c.Key), c.RecordID, c.Fingerprint.Version, c.Fingerprint.Sum[:],
		resp.Status, encodeHeaders(resp.Header), body, resp.NotStored, micros(p.TTL), nowParam(c.Now), lockTimeout,
		keyLockID(c.Scope, c.Key), claimInsertLockTimeout}, nil
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

// isKeyStop reports whether err is idem_stop's IDL02: RecordInsertCompleted found its
// key recorded.
func isKeyStop(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "IDL02"
}
