package idem

import (
	"context"
	"sync"
)

// Handle is the claim that the current request holds on its (scope, key). The
// middleware puts it in the handler's context; a handler reads it with [FromContext].
//
// Handlers use Key, Scope and SetStore. Store packages use PrepareCompletion,
// Completed and CompletionFailed to implement the SPEC §7 helper, which completes the
// record inside the application's own transaction.
type Handle struct {
	scope string
	key   string

	mu       sync.Mutex
	override *bool
	// prepare freezes the captured response, stops the heartbeat and returns the fenced
	// completion to run; set by the middleware.
	prepare preparer
	// done and failed record how the §7 helper's transaction ended.
	done   bool
	failed error
}

type handleKey struct{}

// preparer is what the middleware's execution offers PrepareCompletion (an interface
// rather than a func, so that setting it allocates nothing).
type preparer interface {
	prepareInTx(override *bool) (*RecordCompleteParams, bool)
}

// FromContext returns the claim of the request whose context is ctx, or nil when the
// request carries no idempotency key (or the middleware is off for its route).
func FromContext(ctx context.Context) *Handle {
	h, _ := ctx.Value(handleKey{}).(*Handle)
	return h
}

// NewContext returns ctx carrying h. The middleware calls it; tests may too.
func NewContext(ctx context.Context, h *Handle) context.Context {
	return context.WithValue(ctx, handleKey{}, h)
}

// Key returns the request's idempotency key, as parsed (unquoted).
func (h *Handle) Key() string { return h.key }

// Scope returns the principal the key belongs to.
func (h *Handle) Scope() string { return h.scope }

// SetStore overrides, for this response only, whether it is stored (true) or releases
// the key (false), whatever its status (SPEC §6).
func (h *Handle) SetStore(store bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.override = &store
}

// PrepareCompletion is for store packages implementing the SPEC §7 helper. Called
// inside the application's transaction, after the handler wrote its response, it stops
// the lease heartbeat, freezes the captured response and returns the fenced completion
// to run in that transaction. ok is false when the response is not to be stored (its
// status releases the key, SPEC §6); the helper then just commits the application's
// writes and the middleware releases the key.
func (h *Handle) PrepareCompletion() (params *RecordCompleteParams, ok bool) {
	h.mu.Lock()
	override, prepare := h.override, h.prepare
	h.mu.Unlock()
	if prepare == nil {
		return nil, false
	}
	return prepare.prepareInTx(override)
}

// Completed tells the middleware that the completion prepared by PrepareCompletion
// committed with the application's writes: the record is completed and is never
// released, whatever happens next.
func (h *Handle) Completed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = true
}

// CompletionFailed tells the middleware that the transaction holding the completion did
// not commit (or the fenced completion found the key taken over, [ErrLeaseLost]). The
// client then never receives the handler's response: it gets 503 store_unavailable.
func (h *Handle) CompletionFailed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed = err
}

// outcome reports how a §7 transaction ended: completed, or failed with err.
func (h *Handle) outcome() (completed bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done, h.failed
}

// storeOverride returns the handler's SetStore override, nil when there is none.
func (h *Handle) storeOverride() *bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.override
}
