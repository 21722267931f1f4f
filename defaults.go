package idem

import "time"

// Defaults and limits. A zero field of a config struct takes its default; each
// field's documentation names its constant.
const (
	// — of [Config] and [GuardConfig] —

	// DefaultTTL is how long a completed record lives after its creation (SPEC §8).
	DefaultTTL = 24 * time.Hour
	// DefaultLease is how long a claim holds its key before another request may take
	// it over (SPEC §5).
	DefaultLease = 30 * time.Second
	// DefaultRetryAfter is the Retry-After of request_in_progress and
	// store_unavailable answers.
	DefaultRetryAfter = time.Second
	// DefaultMaxBodyBytes bounds the request body the middleware reads (SPEC §4).
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxResponseBytes bounds the response body the middleware stores (SPEC §6).
	DefaultMaxResponseBytes = 1 << 20
	// DefaultInFlightWait is how long a duplicate waits for the first request: not at
	// all, it gets 409 request_in_progress at once.
	DefaultInFlightWait time.Duration = 0
	// DefaultRetention is how long the cleaner keeps records after they expire.
	DefaultRetention time.Duration = 0
	// DefaultReplayCacheSize is the number of completed responses the middleware
	// keeps in memory: none, every replay reads the store.
	DefaultReplayCacheSize = 0
	// DefaultKeyHeader is the header that carries the idempotency key (SPEC §3).
	DefaultKeyHeader = "Idempotency-Key"
	// DefaultStoreTimeout bounds each store call made before the handler runs (the
	// claim, each poll of an in-flight wait): a store that does not answer within it
	// gets 503 store_unavailable, not a hung request (SPEC §9).
	DefaultStoreTimeout = 5 * time.Second
	// DefaultMaxInFlightPerScope bounds the keyed operations of one scope under way in
	// one process at once (SPEC §19): far above what one client runs at once, far
	// below a flood.
	DefaultMaxInFlightPerScope = 256
	// DefaultMaxStoredBytesPerScope bounds the bytes of results one scope stores in
	// one process per DefaultQuotaWindow (SPEC §19): 256 MiB per 10 minutes, about
	// 440 KB/s sustained, such as 100 results of 4 KB a second.
	DefaultMaxStoredBytesPerScope = 256 << 20
	// DefaultQuotaWindow is the window of MaxStoredBytesPerScope.
	DefaultQuotaWindow = 10 * time.Minute
	// MaxTTL is the longest TTL of any record (about 100 years): the longest that
	// every store represents for a record created in the next century and a half
	// (SQLite keeps expires_at as integer nanoseconds since 1970, which overflow in
	// 2262). A longer TTL is refused wherever one is given; use MaxTTL for records
	// that must outlive everything.
	MaxTTL = 100 * 365 * 24 * time.Hour
	// MaxLeaseMargin caps how long before its lease ends a handler whose renewals
	// failed is cancelled: the margin is Lease/10, at most this (SPEC §5, Lease).
	MaxLeaseMargin = time.Second

	// — of [CleanerConfig] —

	// DefaultCleanerInterval is the pause between two cleaning passes.
	DefaultCleanerInterval = time.Minute
	// DefaultCleanerBatchSize bounds how many records one delete removes.
	DefaultCleanerBatchSize = 1000
	// DefaultCleanerBatchTimeout bounds one batch delete: past it the batch is
	// cancelled and the next one is smaller, so that no batch holds its locks longer.
	DefaultCleanerBatchTimeout = time.Second
	// DefaultCleanerBatchTarget is how long one batch of the cleaner should take.
	DefaultCleanerBatchTarget = 200 * time.Millisecond

	// — of [CompleterConfig] —

	// DefaultCompleterInterval is the pause between two passes of a Completer.
	DefaultCompleterInterval = 10 * time.Second
	// DefaultCompleterBatchSize bounds how many records one query of a pass returns.
	DefaultCompleterBatchSize = 100
	// DefaultCompleterBatchTimeout bounds one query for resumable records.
	DefaultCompleterBatchTimeout = 30 * time.Second
	// DefaultCompleterRetryBackoff is how long a record whose resume failed waits
	// before the next attempt; it doubles at every failure.
	DefaultCompleterRetryBackoff = 30 * time.Second
	// DefaultCompleterMaxRetryBackoff caps the wait between attempts on one record.
	DefaultCompleterMaxRetryBackoff = 10 * time.Minute
	// DefaultCompleterWarnAfter is the age past which an unfinished operation that a
	// completer cannot finish is logged at WARN.
	DefaultCompleterWarnAfter = 5 * time.Minute

	// — of steps (SPEC §13) —

	// MaxStepNameLength is the longest step name, in bytes.
	MaxStepNameLength = 255
	// MaxStepResultsBytes bounds the encoded results of all the steps of one record:
	// steps save small results (an id, an amount), not documents.
	MaxStepResultsBytes = 64 << 10

	// — of keys (SPEC §3) —

	// DefaultMinKeyLength is the shortest key [ParseKey] accepts unless configured
	// otherwise: long enough to refuse PIN-like keys, short enough for the design note's
	// examples (SPEC §3). Clients should send 128-bit random keys, such as a UUID v4.
	DefaultMinKeyLength = 8
	// MaxKeyLength is the longest key [ParseKey] accepts, in bytes (SPEC §3).
	MaxKeyLength = 255
)
