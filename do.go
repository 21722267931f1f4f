package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Do runs fn at most once per (call.Scope, call.Key) and returns its result to every
// repeat (SPEC §16): the first call claims the key, runs fn under the claim's context
// while the lease is renewed, and stores the result JSON-encoded; a repeat with the
// same fingerprint gets the stored result decoded, with replayed true, without running
// fn. fn's context is cancelled with cause [ErrLeaseLost] if the lease is lost.
//
// When fn returns an error (or panics, or its result cannot be JSON-encoded) the key
// is released, so that a repeat runs fn afresh, and the error is returned (the panic
// re-raised). The other errors are [Guard.Begin]'s — [ErrKeyReused],
// [ErrKeyInProgress] (an [*InProgressError]), [ErrResponseNotStored],
// [ErrStoreUnavailable] — and [ErrLeaseLost] when another caller took the key over
// before the result was stored: fn's effects then happened, and the caller that took
// over runs fn again, so make fn's effects idempotent on their own, or use [DoTx]. A
// result that the store fails to record is returned all the same (fn's effects
// happened), and the failure logged.
//
// The result is stored as a [Response] with status 200 and the JSON body, so T must
// survive a JSON round trip (exported fields; no channels or funcs).
func Do[T any](ctx context.Context, g *Guard, call Call, fn func(ctx context.Context) (T, error)) (result T, replayed bool, err error) {
	h, result, replayed, err := begin[T](ctx, g, call)
	if h == nil {
		return result, replayed, err
	}
	defer releaseOnPanic(h)
	v, err := fn(h.Context())
	if err == nil {
		err = h.setResult(v)
	}
	if err != nil {
		_ = h.Release()
		return result, false, err
	}
	return completeResult(h, v)
}

// DoTx is [Do] whose function's writes commit with the record, in one transaction of
// the store's database (SPEC §7): fn runs inside inTx, the store package's SPEC §7
// helper, such as store/postgres's (*Store).InTx (Tx pgx.Tx) or store/sqlite's
// (*Store).InTx (Tx *sql.Tx). fn's writes and the stored result commit together or
// not at all: when another caller took the key over (the fence fails, [ErrLeaseLost]),
// or COMMIT fails, nothing commits and DoTx returns that error; a repeat then gets the
// winner's result, or runs fn afresh.
//
// fn returns its result, which DoTx encodes inside the transaction before the
// completion is prepared, so that the stored result is always the one fn returned in
// the transaction that committed. When fn returns an error the transaction rolls back,
// the key is released and the error is returned. inTx must run its function at most
// once per call, in a transaction that completes the record of the handle carried by
// its context ([FromContext]); with a helper that does not, the result is stored after
// the transaction, as Do stores it.
func DoTx[T, Tx any](ctx context.Context, g *Guard, call Call,
	inTx func(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error,
	fn func(ctx context.Context, tx Tx) (T, error)) (result T, replayed bool, err error) {
	h, result, replayed, err := begin[T](ctx, g, call)
	if h == nil {
		return result, replayed, err
	}
	defer releaseOnPanic(h)
	var v T
	err = inTx(h.Context(), func(ctx context.Context, tx Tx) error {
		r, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		if err := h.setResult(r); err != nil {
			return err
		}
		v = r
		return nil
	})
	if err != nil {
		// fn failed (nothing committed), or the transaction holding the completion
		// did not commit: release the key (a no-op if it was taken over).
		_ = h.Release()
		return result, false, err
	}
	return completeResult(h, v)
}

// begin begins call: it returns the claim to run the function under, or none and
// what to return instead: the stored result decoded, or Begin's error.
func begin[T any](ctx context.Context, g *Guard, call Call) (h *Handle, result T, replayed bool, err error) {
	h, replay, err := g.Begin(ctx, call)
	if err != nil || replay == nil {
		return h, result, false, err
	}
	result, replayed, err = decodeResult[T](replay)
	return nil, result, replayed, err
}

// resultHeader is the header of a stored result of Do.
var resultHeader = map[string][]string{"Content-Type": {"application/json"}}

// setResult encodes v as the result the completion stores.
func (h *Handle) setResult(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("idem: encoding the result: %w", err)
	}
	h.SetResponse(&Response{Status: 200, Header: resultHeader, Body: b})
	return nil
}

// completeResult completes h's claim with the result v set before and returns v,
// unless the result must not be used.
func completeResult[T any](h *Handle, v T) (T, bool, error) {
	err := h.Complete()
	if err != nil && !errors.Is(err, ErrStoreUnavailable) {
		var zero T
		return zero, false, err
	}
	return v, false, nil
}

// decodeResult decodes a stored result of Do.
func decodeResult[T any](resp *Response) (T, bool, error) {
	var v T
	if err := json.Unmarshal(resp.Body, &v); err != nil {
		return v, true, fmt.Errorf("idem: decoding the stored result: %w", err)
	}
	return v, true, nil
}

// releaseOnPanic releases h's key when the function panicked, and raises the panic
// again.
func releaseOnPanic(h *Handle) {
	if p := recover(); p != nil {
		_ = h.Release()
		panic(p)
	}
}
