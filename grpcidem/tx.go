package grpcidem

import (
	"context"

	"google.golang.org/protobuf/proto"

	"github.com/idem-go/idem"
)

type callKey struct{}

// claim is what a keyed call's handler context carries.
type claim struct {
	h *idem.Handle
	s *server
}

// newHandlerContext returns the context of a keyed call's handler: the claim's, which
// is cancelled with cause [idem.ErrLeaseLost] when the lease is lost, carrying the
// claim for [FromContext] and [InTx]. It hides the claim from [idem.FromContext]: a
// store's SPEC §7 helper called directly runs a plain transaction, since it could
// only complete the record with a response the handler has not returned yet, and
// would release the key after committing the writes. InTx is the way to commit them
// with the record.
func (s *server) newHandlerContext(h *idem.Handle) context.Context {
	return context.WithValue(idem.NewContext(h.Context(), nil), callKey{}, &claim{h: h, s: s})
}

// FromContext returns the claim of the keyed call whose handler's context is ctx, or
// nil for a call without a key (or a method with keys off). A handler uses it to
// override the store policy for its outcome (SetStore), to set its record's TTL
// (SetTTL), or to read the key, the scope and the record's id. The interceptor ends
// the claim when the handler returns: a handler must not call Complete or Release.
func FromContext(ctx context.Context) *idem.Handle {
	if c, ok := ctx.Value(callKey{}).(*claim); ok {
		return c.h
	}
	return nil
}

// InTx runs fn in one transaction of the store's database through inTx, the store
// package's SPEC §7 helper (store/sqlite's (*Store).InTx, whose Tx is *sql.Tx, or
// store/postgres's, whose Tx is pgx.Tx), and returns fn's response: for a keyed call,
// fn's writes and the stored response commit together or not at all. A retry is then
// replayed and never executes fn's writes twice, whatever crashes when.
//
// The handler returns what InTx returns. When fn fails, the transaction rolls back
// and fn's error is returned (the store policy then decides, as for any error). When
// the completion cannot commit (another call took the key over, [idem.ErrLeaseLost],
// or COMMIT failed) nothing commits, InTx returns that error, and the interceptor
// answers UNAVAILABLE instead of the handler's outcome: the retry meets the key's real
// outcome. Without a key (the interceptor marks such a call's context idem.WithoutKey)
// InTx runs a plain transaction; a context that is neither a keyed call's nor marked
// fails with idem.ErrNoHandle. Call it at most once per call: a second transaction
// commits as a plain one.
func InTx[Resp proto.Message, Tx any](ctx context.Context,
	inTx func(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error,
	fn func(ctx context.Context, tx Tx) (Resp, error)) (Resp, error) {
	var resp Resp
	c, _ := ctx.Value(callKey{}).(*claim)
	if c != nil {
		ctx = idem.NewContext(ctx, c.h) // the store's helper completes the record
	}
	err := inTx(ctx, func(ctx context.Context, tx Tx) error {
		r, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		if c != nil {
			// The response is the result the completion stores, in this transaction.
			stored, err := encodeMessage(r, c.s.MaxResponseBytes)
			if err != nil {
				return err
			}
			c.h.SetResponse(stored)
		}
		resp = r
		return nil
	})
	if err != nil {
		var zero Resp
		return zero, err
	}
	return resp, nil
}
