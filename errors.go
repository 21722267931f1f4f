package idem

import (
	"errors"

	"github.com/idem-go/idem/idemstore"
)

// The errors of idem (SPEC §5, §9). [Guard.Begin], [Do] and a handler's helpers
// return them, wrapped or as themselves; the middleware answers each with its §9 code.
var (
	// ErrKeyReused: the key was used with another fingerprint (another input). The
	// record is untouched; retrying cannot succeed.
	ErrKeyReused = errors.New("idem: idempotency key already used with a different input")
	// ErrResponseNotStored: the operation completed, but its result was not kept
	// (streamed, or too large), so it cannot be replayed; it is never executed again.
	ErrResponseNotStored = errors.New("idem: the operation completed but its result was not stored")
	// ErrStoreUnavailable: the store failed, or did not answer within StoreTimeout.
	// Retry later. Errors matching it are [*StoreError]s carrying the cause.
	ErrStoreUnavailable = errors.New("idem: store unavailable")
	// ErrScopeRequired: a [Call] without a scope.
	ErrScopeRequired = errors.New("idem: scope required")
	// ErrOutcomeUnknown: the key's holder died while the operation ran under the
	// policy [LapseUnknown], so whether its effects happened is unknown; every repeat
	// gets this error (the middleware answers 500 outcome_unknown) until an operator
	// resolves the key (SPEC §13). Retrying cannot help.
	ErrOutcomeUnknown = errors.New("idem: the outcome of the operation with this idempotency key is unknown")
	// ErrRecordUnreadable: the key's record is sealed and cannot be opened (SPEC §19):
	// sealed under a key that is not configured, altered or moved in the store. The
	// operation is never executed again for it, and nothing else is answered in its
	// place: the middleware answers 500 record_unreadable, and an error log line names
	// the key. Errors matching it are [*UnreadableError]s. Retrying cannot help until
	// the key is configured again.
	ErrRecordUnreadable = errors.New("idem: the key's record cannot be opened")
	// ErrLeaseLost is the cause of an operation's context cancelled because its lease
	// was lost, and the error of a fenced store call whose token no longer holds the
	// record: [idemstore.ErrLeaseLost].
	ErrLeaseLost = idemstore.ErrLeaseLost

	// ErrClaimDeferred is for store packages: a [TxFunc] returns an error wrapping it when
	// the claim of [TxRecord.Claim], made first in its transaction, found the key already
	// there (in any state), so that nothing committed. [ServeTx] then claims the key the
	// usual way; the handler never sees it.
	ErrClaimDeferred = errors.New("idem: the key was not claimed in the handler's transaction; it is claimed the usual way")

	// ErrKeyInProgress is what a store's [TxFunc] returns on a
	// [RouteOptions.ClaimInHandler] route when a concurrent transaction holding the same
	// key did not commit within the store's lock timeout: [ServeTx] passes it to
	// [Handle.CompletionFailed], and the middleware answers 409 request_in_progress. A
	// repeat of a call whose key is executing elsewhere fails with it too
	// ([InProgressError] matches it).
	ErrKeyInProgress = errors.New("idem: a concurrent request holds the key")

	// ErrKeyRequired is returned by [ParseKey] when the request has no Idempotency-Key
	// header. The middleware answers it with 400 key_required where a key is required.
	ErrKeyRequired = errors.New("idem: Idempotency-Key header required")

	// ErrKeyInvalid is wrapped by every error [ParseKey] returns for a header that is present
	// but unusable, and by [Guard.Begin]'s (and so [Do]'s) for a key longer than
	// [MaxKeyLength] bytes or with a control character; the wrapping error says why. The
	// middleware answers it with 400 key_invalid.
	ErrKeyInvalid = errors.New("idem: invalid Idempotency-Key")

	// ErrNoHandle is returned by the store packages' SPEC §7 helpers for a context that
	// carries no [Handle] and was not marked by [WithoutKey]: most likely a context other
	// than the request's (a server's, context.Background()) passed inside a keyed
	// request's handler, which would otherwise run a plain transaction and lose the
	// guarantee that the writes and the stored response commit together.
	ErrNoHandle = errors.New("idem: the context carries no idem.Handle: pass the request's own context (r.Context()) " +
		"of a request behind the idem middleware, or idem.WithoutKey(ctx) for a transaction that completes no record")

	// ErrNoResponse is returned by a SPEC §7 helper whose transaction was to commit with
	// the handler's response while the handler had written none yet (it writes after the
	// helper returns: the natural order, and the wrong one with InTx). Nothing commits;
	// the middleware answers 500 internal_error, stores nothing and logs the mistake, and
	// the handler's later writes are refused. Write the response inside the
	// transaction's function, or use the store's Respond, which takes the response its
	// function returns.
	ErrNoResponse = errors.New("idem: the handler wrote no response before its transaction was to commit with it: " +
		"write the response inside the transaction's function, or return it from the store's Respond")

	// ErrAnswered is returned by a SPEC §7 helper on a [RouteOptions.ClaimInHandler] route
	// when the claim it made first did not acquire the key: the middleware answers the
	// request itself (the stored response, 409 request_in_progress, key_reused, or 503
	// store_unavailable), the helper ran nothing, and whatever the handler writes after
	// it is discarded. A handler may treat it as any other error.
	ErrAnswered = errors.New("idem: the key was not acquired: the middleware answers this request itself")

	// ErrStepCommitted is returned by [Handle.PrepareStep] for a step that already
	// committed: its result is saved and it must not run again ([Handle.StepResult]).
	ErrStepCommitted = errors.New("idem: step already committed")
)
