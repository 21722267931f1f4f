// Package grpcidem makes unary gRPC calls idempotent with idem (SPEC §16): a server
// interceptor that executes a keyed call at most once per (scope, key) and replays its
// stored response to every retry, and a client interceptor that adds a key and retries
// safely. It is a thin adapter on [idem.Guard]; the guard's store, lease, heartbeat,
// fencing and takeover of a lapsed lease work as they do for HTTP, across any number
// of server processes sharing the store.
//
// # Server
//
// [UnaryServerInterceptor] reads the key from the metadata key "idempotency-key",
// parsed as SPEC §3 parses the Idempotency-Key header. The scope is the authenticated
// principal, from [ServerConfig.Scope] (run this interceptor after the authentication
// interceptor). The fingerprint covers the full method name and the request message's
// deterministic protobuf encoding, so that a retry of the same message matches (map
// fields included) and one key used for another method or message is refused. The
// call's outcome is stored: its response message (replayed decoded into its type,
// with the header metadata "idempotent-replayed: true"), or a status error the store
// policy keeps. The call's name, for the guard's Observer and the record, is the full
// method name. A call without a key passes through unless its method requires one
// ([ServerConfig.Methods]); since gRPC has no method table telling safe calls from
// unsafe ones, a key is optional by default. Streaming calls cannot run at most once
// per key (a stream has no one response to store): [StreamServerInterceptor], installed
// beside the unary one, refuses those that carry a key or whose method requires one
// with FAILED_PRECONDITION ([CodeStreamNotSupported]) and logs an error naming the
// method, so that none runs unprotected while its client believes otherwise.
//
// The handler runs under a context that carries the claim ([FromContext]) and does
// not end when the client cancels or its deadline passes, as the HTTP middleware's
// handler does: the call runs to its outcome, which is stored for the client's retry.
// It ends, with cause [idem.ErrLeaseLost], when the lease is lost. [InTx] commits the
// handler's writes and the stored response in one transaction of the store (SPEC §7).
//
// Each outcome has a status; every status the interceptor produces itself carries an
// errdetails.ErrorInfo (domain [ErrorDomain], reason the SPEC §9 code in upper case,
// metadata {"code": code}; [ErrorCode] reads it), and a RetryInfo when a retry may
// succeed:
//
//	outcome (SPEC §9 code)                  status               details        HTTP
//	--------------------------------------  -------------------  -------------  ----
//	first call: the handler runs            the handler's        -              -
//	completed: replay                       the stored outcome   as stored      -
//	no key where required (key_required)    INVALID_ARGUMENT     ErrorInfo      400
//	malformed key (key_invalid)             INVALID_ARGUMENT     ErrorInfo      400
//	no principal (scope_required)           UNAUTHENTICATED      ErrorInfo      401
//	another request or method (key_reused)  FAILED_PRECONDITION  ErrorInfo      409
//	in flight (request_in_progress)         ABORTED              + RetryInfo    409
//	a bound per principal (quota_exceeded,  RESOURCE_EXHAUSTED   + RetryInfo    429
//	  §19)
//	completed, not stored                   FAILED_PRECONDITION  ErrorInfo      409
//	  (response_not_stored)
//	store failed or stalled, completion     UNAVAILABLE          + RetryInfo    503
//	  lost (store_unavailable)
//	outcome unknown (outcome_unknown, §13)  UNKNOWN              ErrorInfo      500
//
// ABORTED's RetryInfo carries the guard's RetryAfter, RESOURCE_EXHAUSTED's the
// bound's (idem.QuotaError.RetryAfter); UNAVAILABLE's,
// [ServerConfig.RetryAfter]. FAILED_PRECONDITION is final: retrying cannot succeed.
// outcome_unknown is the answer, stored until an operator resolves the key, of a call
// that finds its key's holder dead under [MethodOptions.OnLapse] [idem.LapseUnknown]
// (SPEC §13); it is UNKNOWN rather than INTERNAL because the outcome is unknown, not an
// invariant broken, and it is final too. (Resolve such a key by releasing it; a
// response an operator completes it with is HTTP's, which a gRPC call cannot replay.)
// A stored outcome that this binary cannot decode (its message type is unknown) is
// INTERNAL.
//
// Which outcomes are stored mirrors SPEC §6: a response message always; a status
// error when [ServerConfig.StorePolicy] says so — by default only FAILED_PRECONDITION,
// a final outcome that a retry would not change (a declined card) — and otherwise the
// key is released, so that the retry executes afresh: every other code means "nothing
// happened, you may try again" or maps to an HTTP status that §6 releases. A plain
// error is UNKNOWN, and released; a panic releases the key and is re-raised. A handler
// overrides the policy for its call with FromContext(ctx).SetStore. When the lease
// was lost while the handler ran, or the completion did not commit, the client gets
// UNAVAILABLE instead of the handler's outcome. Response header and trailer metadata
// the handler sets are sent on the first call only; they are not stored.
//
// # Client
//
// [UnaryClientInterceptor] adds a fresh key (a UUID v4) to each call that lacks one,
// keeps it across attempts, and retries with the HTTP client's policy pieces
// (package client): exponential backoff with full jitter, the server's RetryInfo
// delay (as Retry-After), a token-bucket [client.Budget] shared by every call, and
// MaxAttempts. [Retryable] is the default policy; [Attempts] reports how many
// attempts a call took.
package grpcidem
