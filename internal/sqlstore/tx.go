package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// Tx is what a store hands the SPEC §7 helpers: how to begin its transaction, how to
// run its fenced statements in one, and how to normalise its errors.
type Tx struct {
	// Pkg prefixes log lines ("mysql").
	Pkg    string
	Logger *slog.Logger
	// Begin begins a transaction for the application's function; end rolls it back
	// unless it committed, and releases whatever Begin took.
	Begin func(ctx context.Context) (tx *sql.Tx, end func(), err error)
	// Complete and Step run the fenced completion and step in tx;
	// idemstore.ErrLeaseLost when the holder no longer holds the record.
	Complete func(ctx context.Context, tx *sql.Tx, p *idemstore.CompleteParams) error
	Step     func(ctx context.Context, tx *sql.Tx, p *idemstore.StepParams) error
	// Interpret normalises the store's errors.
	Interpret func(error) error
}

// Handle is the Handle a SPEC §7 helper (what, for the log) completes, claimed under a
// lease: none for a context marked idem.WithoutKey, idem.ErrNoHandle (logged) for one
// without a Handle, idem.ErrAnswered when a ClaimInHandler route's claim did not
// acquire the key.
func (x *Tx) Handle(ctx context.Context, what string) (*idem.Handle, error) {
	h, err := idem.TxHandle(ctx)
	if err != nil {
		x.Logger.ErrorContext(ctx, x.Pkg+": "+what+" refused a context without the request's idem.Handle", "error", err)
		return nil, err
	}
	if h != nil {
		if err := h.AcquireForTx(ctx); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// Fenced normalises the error of a fenced statement: idemstore.ErrLeaseLost as it is.
func (x *Tx) Fenced(err error) error {
	if errors.Is(err, idemstore.ErrLeaseLost) {
		return err
	}
	return x.Interpret(err)
}

// InTx runs fn in one transaction and commits it together with the completion of the
// request's idempotency record (the idem.Handle in ctx): the store's InTx.
func (x *Tx) InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	h, err := x.Handle(ctx, "InTx")
	if err != nil {
		return err
	}
	tx, end, err := x.Begin(ctx)
	if err != nil {
		return err
	}
	defer end()

	if err := fn(ctx, tx); err != nil {
		return err
	}
	var p *idemstore.CompleteParams
	if h != nil {
		if p, err = h.PrepareCompletion(); err != nil {
			return err
		}
		if p != nil {
			if err := x.Fenced(x.Complete(ctx, tx, p)); err != nil {
				h.CompletionFailed(err)
				return err
			}
		}
	}
	if err := tx.Commit(); err != nil {
		err = x.Interpret(err)
		if h != nil {
			// Even a response that releases the key must not reach the client: its
			// effects did not commit.
			h.CompletionFailed(err)
		}
		return err
	}
	if p != nil {
		h.Completed()
	}
	return nil
}

// Step runs fn as the step named step of the operation whose context ctx is (SPEC
// §13), committing fn's writes with the record's new recovery point: the store's Step.
func Step[T any](ctx context.Context, x *Tx, step string, fn func(ctx context.Context, tx *sql.Tx) (T, error)) (T, error) {
	var v, zero T
	h, err := x.Handle(ctx, "Step")
	if err != nil {
		return zero, err
	}
	if h != nil {
		if done, err := h.StepResult(step, &v); done || err != nil {
			return v, err
		}
	}
	tx, end, err := x.Begin(ctx)
	if err != nil {
		return zero, err
	}
	defer end()
	if v, err = fn(ctx, tx); err != nil {
		return zero, err
	}
	var p *idemstore.StepParams
	if h != nil {
		if p, err = h.PrepareStep(step, v); err != nil {
			return zero, err
		}
		if err := x.Fenced(x.Step(ctx, tx, p)); err != nil {
			h.StepFailed(err)
			return zero, err
		}
	}
	if err := tx.Commit(); err != nil {
		err = x.Interpret(err)
		if h != nil {
			h.StepFailed(err)
		}
		return zero, err
	}
	if h != nil {
		h.StepCommitted(p)
	}
	return v, nil
}

// Respond runs the rest of one of Respond's transactions once its claim (if any) is
// made in tx: fn, then the record's completion with fn's response, or, when that
// response releases the key (SPEC §6), release, which deletes the claim made in tx so
// that it never commits; then commit, whose error the store wraps as the middleware
// must see it (an *idem.StoreError, or an *idem.KeyTakenError for a lost race).
func (x *Tx) Respond(ctx context.Context, tx *sql.Tx, rec *idem.TxRecord, claim *idemstore.ClaimParams,
	fn func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error),
	release func(ctx context.Context, tx *sql.Tx, p *idemstore.ClaimParams) error,
	commit func() error) (*idemstore.Response, error) {
	resp, err := fn(ctx, tx)
	if err != nil {
		return nil, err
	}
	p, err := rec.Complete(resp)
	if err != nil {
		return nil, err
	}
	switch {
	case p != nil:
		if err := x.Complete(ctx, tx, p); err != nil {
			if errors.Is(err, idemstore.ErrLeaseLost) {
				return nil, err
			}
			return nil, &idem.StoreError{Op: "complete", Err: x.Interpret(err)}
		}
	case claim != nil:
		if err := release(ctx, tx, claim); err != nil {
			return nil, &idem.StoreError{Op: "release", Err: x.Interpret(err)}
		}
	}
	if err := commit(); err != nil {
		return nil, err
	}
	return resp, nil
}

// KeyTaken is what Respond answers for the claim it made in its transaction when the
// claim did not simply acquire the key: a replay, a duplicate or a mismatch, answered
// from what the claim read, or a takeover, made the usual way (Found nil). Nothing
// commits then. It is nil when the claim acquired a fresh key.
func KeyTaken(res *idemstore.ClaimResult) error {
	if res.Outcome == idemstore.ClaimAcquired && !res.TookOver {
		return nil
	}
	found := res.Record
	if res.Outcome == idemstore.ClaimAcquired {
		found = nil
	}
	return &idem.KeyTakenError{Found: found, Now: res.Now}
}
