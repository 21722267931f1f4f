package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// The SPEC §7 helpers' side of the root package: what store packages build their
// transaction helpers on (InTx for the lease path, Respond for the one-round-trip path),
// and the mistakes those helpers refuse loudly rather than let pass.

// withoutKey marks a context whose operations run without a key on purpose
// (WithoutKey); it is the value of handleKey there. w is the request's
// ResponseWriter when the middleware marked it (a request let through without a key),
// where [Finish] writes its response.
type withoutKey struct{ w http.ResponseWriter }

// WithoutKey returns ctx marked as running no keyed operation on purpose: the store
// packages' SPEC §7 helpers then run a plain transaction that completes no record,
// instead of failing with [ErrNoHandle]. The middleware marks the requests it lets
// through without a key (a route or method where the key is optional or off) unless
// their method is safe (GET, HEAD, OPTIONS, TRACE); a handler on a route without the
// middleware, or a background job, marks its own context. Inside a keyed operation it
// hides the operation's Handle: a transaction of its own that must not complete the
// record.
func WithoutKey(ctx context.Context) context.Context {
	return context.WithValue(ctx, handleKey{}, withoutKey{})
}

// withoutKeyFor is WithoutKey for a request the middleware lets through without a
// key, answered on w.
func withoutKeyFor(ctx context.Context, w http.ResponseWriter) context.Context {
	return context.WithValue(ctx, handleKey{}, withoutKey{w: w})
}

// Finish runs the last transaction of an operation, the one that answers, and makes
// the response fn returns the operation's: it runs fn through inTx, the store's SPEC
// §7 lease helper (store/sqlite's or store/postgres's InTx, store/postgres's InSQLTx,
// backstop's InTx), and fn's writes, that response and the key's record commit
// together, or none of them does. The response goes where the operation runs:
//
//   - in a handler behind the middleware, to the client: Finish writes it, and the
//     handler writes nothing after it (Finish returned nil: the request is answered;
//     an error: nothing committed and nothing was written, answer it yourself);
//   - in a resume function ([RouteOptions.Resume], run by the [Completer]), to the
//     record: the completer stores it for the client's retry;
//   - on a request the middleware let through without a key (a route whose key is
//     optional), to the client once the plain transaction committed.
//
// So a handler and its resume function share one function, the operation: its steps
// (store/sqlite's Step, store/postgres's Step, [Step]), its outside calls with
// [Handle.DerivedKey], and Finish at the end, whose function returns the response
// ([JSONResponse]) in both. A response fn returns must have a status from 200 to 999;
// one whose status releases the key (a 5xx, SPEC §6) commits fn's writes and releases
// the key, keeping a record whose steps committed (SPEC §13).
//
// Finish returns fn's error, or inTx's ([ErrNoHandle] for a context that carries no
// operation; [ErrLeaseLost] when the key was taken over, and then, as when the
// transaction fails to commit, the middleware answers 503 store_unavailable in place
// of the response; [ErrAnswered] on a [RouteOptions.ClaimInHandler] route whose key
// was there already). It refuses a context marked [WithoutKey] by the application,
// which has nowhere to deliver the response, before running anything. An operation
// run with [Do] or [DoTx] returns its result instead.
func Finish[Tx any](ctx context.Context, inTx func(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error,
	fn func(ctx context.Context, tx Tx) (*Response, error)) error {
	var w http.ResponseWriter // a request without a key: answered after COMMIT
	if v, ok := ctx.Value(handleKey{}).(withoutKey); ok {
		if v.w == nil {
			return errors.New("idem: Finish delivers its response to a request or a resume function; this context, marked idem.WithoutKey, has neither: use the store's InTx")
		}
		w = v.w
	}
	var resp *Response
	err := inTx(ctx, func(ctx context.Context, tx Tx) error {
		r, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		if err := checkResponse("Finish", r); err != nil {
			return err
		}
		resp = r
		if h := FromContext(ctx); h != nil {
			return h.deliver(r)
		}
		return nil
	})
	if err == nil && w != nil {
		writeResponse(w, resp)
	}
	return err
}

// deliver makes resp the operation's result, inside the transaction that completes
// the record with it ([Finish]): behind the middleware it is written to the
// request's capture, which the completion stores and the client gets; elsewhere (a
// resume function) it is the handle's response.
func (h *Handle) deliver(resp *Response) error {
	x, ok := h.describer.(*request)
	if !ok || !h.managed {
		h.SetResponse(resp)
		return nil
	}
	c := x.capture
	if c.wroteHeader || c.passThrough {
		return errors.New("idem: the handler wrote a response before Finish: return the response from Finish's function instead")
	}
	writeResponse(c, resp)
	return nil
}

// checkResponse refuses a nil response or one whose status is not 200 to 999, as
// returned by the function of the helper named by caller.
func checkResponse(caller string, resp *Response) error {
	if resp == nil {
		return fmt.Errorf("idem: %s's function returned a nil response", caller)
	}
	if resp.Status < 200 || resp.Status > 999 {
		return fmt.Errorf("idem: %s's function returned status %d; a response's status is 200 to 999", caller, resp.Status)
	}
	return nil
}

// TxHandle returns the claim that a SPEC §7 helper's transaction completes, for store
// packages: the [Handle] ctx carries, or nil (and no error) when ctx was marked by
// [WithoutKey], or [ErrNoHandle].
func TxHandle(ctx context.Context) (*Handle, error) {
	switch v := ctx.Value(handleKey{}).(type) {
	case *Handle:
		return v, nil
	case withoutKey:
		return nil, nil
	}
	return nil, ErrNoHandle
}

// AcquireForTx is for store packages' SPEC §7 helpers whose transaction completes a
// record held under a lease (InTx, steps): it makes sure the handle holds its key
// before the application's transaction begins. On a [RouteOptions.ClaimInHandler]
// route, where the middleware did not claim, it claims the key now the usual way;
// when that claim does not acquire the key, the middleware answers the request with
// what the claim found (a replay, 409, key_reused, 503) and AcquireForTx returns
// [ErrAnswered]: the helper runs nothing and returns that error. Everywhere else it
// returns nil at once.
func (h *Handle) AcquireForTx(ctx context.Context) error {
	return h.acquireForTx(ctx, nil)
}

// acquireForTx is AcquireForTx whose claim starts from what a transaction found of
// the key (see Guard.claimFrom), when found is not nil.
func (h *Handle) acquireForTx(ctx context.Context, found *idemstore.ClaimResult) error {
	if !h.inTx {
		return nil
	}
	resp, err := h.g.claimFrom(ctx, h, found)
	if x, ok := h.describer.(*request); ok && (resp != nil || err != nil || h.tookOver) {
		x.keyFound = true // for the route's retryRate
	}
	if resp == nil && err == nil {
		// Held under a lease from now on, without a heartbeat: the handler's context
		// ends with the lease (executeClaimingInHandler), and the fence refuses a
		// completion after a takeover.
		h.inTx, h.claimedInTx = false, false
		return nil
	}
	if a, ok := h.describer.(answerer); ok {
		a.answerLater(resp, err)
	}
	return ErrAnswered
}

// answerer is the middleware's request: it answers, once the handler has returned, a
// claim that a helper made inside the handler and that did not acquire the key.
type answerer interface {
	answerLater(resp *Response, err error)
}

// KeyTakenError is what a store's [TxFunc] returns when the claim of [TxRecord.Claim]
// found the key already there, and nothing committed. Found is what the transaction
// read of the key's record (nil when it read none: an expired record, or one inserted
// by a transaction that committed after the read), and Now the store's time of that
// read: [ServeTx] answers a completed record, one in flight and one of another
// fingerprint as a claim that found them would, without asking the store again, and
// claims the key the usual way otherwise. It matches [ErrClaimDeferred].
type KeyTakenError struct {
	Found *idemstore.Record
	Now   time.Time
	// Err is the store's error (a unique violation), for logs.
	Err error
}

func (e *KeyTakenError) Error() string {
	if e.Err == nil {
		return ErrClaimDeferred.Error()
	}
	return ErrClaimDeferred.Error() + ": " + e.Err.Error()
}

// Is reports whether target is [ErrClaimDeferred].
func (e *KeyTakenError) Is(target error) bool { return target == ErrClaimDeferred }

// Unwrap returns the store's error.
func (e *KeyTakenError) Unwrap() error { return e.Err }

// found is the claim result the record found stands for, or nil when the key must be
// claimed afresh (absent, expired, a lapsed lease: the store decides those).
func (e *KeyTakenError) found(p *idemstore.ClaimParams) *idemstore.ClaimResult {
	if e == nil || e.Found == nil {
		return nil
	}
	res := &idemstore.ClaimResult{Record: e.Found, Now: e.Now}
	switch p.Decide(e.Found, e.Now) {
	case idemstore.DecideReplay:
		res.Outcome = idemstore.ClaimCompleted
	case idemstore.DecideInFlight:
		res.Outcome = idemstore.ClaimInFlight
	case idemstore.DecideMismatch:
		res.Outcome = idemstore.ClaimMismatch
	default:
		return nil
	}
	return res
}

// TxFunc is one attempt of a store package's Respond transaction, run by [ServeTx]:
// in one transaction of the store's database, the handler's writes and what rec says
// to do with the key's record. It returns the handler's response, which it passes to
// [TxRecord.Complete] before the record's statement (and before COMMIT).
//
// Its errors tell ServeTx what happened: a [*KeyTakenError] (or any error wrapping
// [ErrClaimDeferred]) when the claim of [TxRecord.Claim] found the key already there
// (nothing committed);
// [ErrKeyInProgress] when a concurrent transaction holding the key did not commit in
// time; [ErrLeaseLost] when the fenced completion found the key taken over; a
// [*StoreError] when BEGIN, a record statement, COMMIT or the connection failed (a
// COMMIT's outcome may be unknown). Any other error is the handler's own (its
// function's, or a statement of its writes): nothing committed, and ServeTx returns
// it for the handler to answer.
type TxFunc func(ctx context.Context, rec *TxRecord) (*Response, error)

// TxRecord is what one attempt of a Respond transaction does with the key's record,
// besides the handler's writes. Store packages use it inside a [TxFunc].
type TxRecord struct {
	h      *Handle
	x      *request
	claim  *idemstore.ClaimParams
	params *idemstore.CompleteParams
	frozen bool // Complete wrote the response into the capture and froze it
	resp   *Response
}

// Claim returns the claim the transaction makes first: non-nil on a
// [RouteOptions.ClaimInHandler] route, whose key nobody holds yet; the record it
// inserts holds the completion of [TxRecord.Complete] when that returns one (and is
// deleted again, or never inserted, when it does not). Nil when the middleware holds
// the key already (the completion is then fenced by its token) and for a transaction
// without a key ([WithoutKey]).
func (t *TxRecord) Claim() *idemstore.ClaimParams { return t.claim }

// Complete fixes resp as the request's response: the client gets exactly it if the
// transaction commits, and it returns the completion to run (or, with [TxRecord.Claim],
// to insert) inside the transaction before COMMIT. It returns nil params (no error)
// when resp releases the key (SPEC §6) or the transaction has no key: the transaction
// then records nothing. An error (resp is nil, or the handler wrote a response before
// calling Respond) means: roll back and return it.
func (t *TxRecord) Complete(resp *Response) (*idemstore.CompleteParams, error) {
	if err := checkResponse("Respond", resp); err != nil {
		return nil, err
	}
	t.resp = resp
	if t.h == nil {
		return nil, nil
	}
	c := t.x.capture
	if c.wroteHeader || c.passThrough {
		return nil, errors.New("idem: the handler wrote a response before calling Respond: return the response from Respond's function instead")
	}
	writeResponse(c, resp)
	t.frozen = true
	p, err := t.h.PrepareCompletion()
	t.params = p
	return p, err
}

// undo discards what Complete prepared, after a transaction that committed nothing:
// the capture is empty again, and the next completion freezes another response.
func (t *TxRecord) undo() {
	if !t.frozen {
		return
	}
	t.x.capture.reopen()
	h := t.h
	h.mu.Lock()
	h.decided, h.store, h.params, h.failed = false, false, nil, nil
	h.mu.Unlock()
	t.frozen = false
}

// writeResponse writes resp to w: its headers, status and body.
func writeResponse(w http.ResponseWriter, resp *Response) {
	dst := w.Header()
	for k, v := range resp.Header {
		dst[k] = v
	}
	w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body)
	}
}

// ServeTx is what store packages build their Respond helper on: it answers the request
// r with the response run returns, after run committed the handler's writes and the
// key's record in one transaction (SPEC §7). On a [RouteOptions.ClaimInHandler] route
// the first attempt claims the key inside that transaction ([TxRecord.Claim]); when it
// finds the key already there, ServeTx claims it the usual way and, when that acquires
// it (an expired record, a lapsed lease), runs one more attempt completing the record
// under the lease, or else has the middleware answer what the claim found (the stored
// response, 409, key_reused). Either way the handler has nothing more to do, and
// ServeTx returns nil; it also returns nil when the transaction failed on the store's
// side (the middleware answers 409 or 503 store_unavailable, and logs it).
//
// It returns an error only when the handler must answer: the handler's own (run's
// function or one of its statements failed, and nothing committed), or a misuse
// ([ErrNoHandle]: the request carries no Handle; a request not behind the middleware,
// or a response written before). Whatever the handler writes after ServeTx returned
// nil is refused (Write fails, and the middleware logs it); the client gets the
// answer ServeTx settled.
//
// A request marked by [WithoutKey] (no key) gets a plain transaction whose response
// ServeTx writes to w after COMMIT.
func ServeTx(w http.ResponseWriter, r *http.Request, run TxFunc) error {
	ctx := r.Context()
	h, err := TxHandle(ctx)
	if err != nil {
		return err
	}
	if h == nil {
		rec := &TxRecord{}
		resp, err := run(ctx, rec)
		if err != nil {
			return err
		}
		writeResponse(w, resp)
		return nil
	}
	x, _ := h.describer.(*request)
	if x == nil || x.capture == nil {
		return errors.New("idem: Respond needs a request behind the idem middleware (its Handle came from elsewhere)")
	}
	for {
		rec := &TxRecord{h: h, x: x}
		if h.inTx {
			h.newClaim()
			h.claimedInTx = true
			rec.claim = &h.claim
		}
		_, err := run(ctx, rec)
		switch {
		case err == nil:
			if rec.params != nil {
				h.Completed()
			}
			return nil
		case errors.Is(err, ErrClaimDeferred) && rec.claim != nil:
			rec.undo()
			h.claimedInTx = false
			x.keyFound = true
			var taken *KeyTakenError
			errors.As(err, &taken)
			if h.acquireForTx(ctx, taken.found(rec.claim)) != nil {
				return nil // the middleware answers what the claim found
			}
			// Held now (an expired record, a lapsed lease): once more, fenced.
		case errors.Is(err, ErrKeyInProgress), errors.Is(err, ErrLeaseLost), errors.Is(err, ErrStoreUnavailable):
			// The middleware answers 409 or 503 instead of the response, which stays
			// frozen: later writes are refused.
			h.CompletionFailed(err)
			return nil
		default:
			rec.undo()
			if rec.claim != nil {
				h.claimedInTx = false
			}
			return err
		}
	}
}

// JSONResponse returns a response with status and v encoded as JSON, with
// Content-Type application/json: what a Respond function returns for a JSON API.
func JSONResponse(status int, v any) (*Response, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("idem: encoding the response: %w", err)
	}
	return &Response{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}, nil
}
