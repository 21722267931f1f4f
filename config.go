package idem

import (
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/seal"
)

// Requirement says whether a request must, may or must not carry an Idempotency-Key.
type Requirement int

const (
	// KeyByMethod, the zero value, takes the requirement from [Config.Methods] by the
	// request's method.
	KeyByMethod Requirement = iota
	// KeyRequired refuses a request without a key with 400 key_required.
	KeyRequired
	// KeyOptional honours a key when one is sent and passes a request without one
	// through untouched.
	KeyOptional
	// KeyOff passes every request through untouched; a key header is ignored.
	KeyOff
)

// String returns "by_method", "required", "optional" or "off".
func (q Requirement) String() string {
	switch q {
	case KeyByMethod:
		return "by_method"
	case KeyRequired:
		return "required"
	case KeyOptional:
		return "optional"
	case KeyOff:
		return "off"
	}
	return fmt.Sprintf("Requirement(%d)", int(q))
}

func (q Requirement) valid() bool { return q >= KeyByMethod && q <= KeyOff }

// DefaultMethods returns the method table of SPEC §2: a key is required for POST and
// PATCH, honoured when sent for PUT and DELETE, and ignored for GET, HEAD and OPTIONS.
// A method missing from the table (a custom one) is treated as optional, since it is
// not known to be safe. It returns a new map each time.
func DefaultMethods() map[string]Requirement {
	return map[string]Requirement{
		http.MethodPost:    KeyRequired,
		http.MethodPatch:   KeyRequired,
		http.MethodPut:     KeyOptional,
		http.MethodDelete:  KeyOptional,
		http.MethodGet:     KeyOff,
		http.MethodHead:    KeyOff,
		http.MethodOptions: KeyOff,
		http.MethodTrace:   KeyOff,
	}
}

// Config configures a [Middleware]. Store and Scope are required; every other field
// has a default. Store, TTL, Lease, Heartbeat, InFlightWait, StoreTimeout, RetryAfter,
// ReplayCacheSize, Logger, Clock and the bounds per scope configure the [Guard] the
// middleware runs on, as the fields of [GuardConfig] do.
type Config struct {
	// Store keeps the records. Required.
	Store idemstore.Store

	// Scope returns the authenticated principal of a request, the caller (a user, an
	// API key, a tenant): it is named for what it does to keys, which are scoped by it.
	// Records are identified by (scope, key), so nothing of one principal is ever
	// replayed to another, and the keys derived for outside calls differ between
	// principals (SPEC §3, §13). An empty scope or an error refuses a keyed request with 401 scope_required
	// without touching the store. It should return something stable and not secret,
	// such as a user id or the hex SHA-256 of a bearer token. Required.
	Scope func(r *http.Request) (string, error)

	// KeyScope, under a keyring (Seal), keeps Scope's answer keyed in the store: the
	// HMAC of it under the store's MAC secret (SPEC §19), once the store's sealing is
	// in effect, and the answer itself before (and after it ends); the middleware
	// finds a record made in either form (SPEC §20; [Call.KeyScope]). Set it when the
	// scope is a credential's digest, which anyone could recompute from a guessed
	// credential (idem proxy and idem payments do). Defaults to false: the scope is
	// stored as Scope returns it. Without a keyring it does nothing.
	KeyScope bool

	// Methods sets the key requirement per request method. Entries replace those of
	// the default table; a method found in neither is optional. Routes may override
	// it with [RouteOptions.Requirement]. Defaults to [DefaultMethods].
	Methods map[string]Requirement

	// MinKeyLength is the shortest key accepted (SPEC §3). Defaults to
	// [DefaultMinKeyLength].
	MinKeyLength int

	// TTL is how long a record lives after its creation; routes may override it. It
	// must be longer than Lease and at most [MaxTTL] (New panics otherwise): a record whose TTL ran out
	// before its handler finished would be completed already expired, and a retry
	// would execute the operation again. Make it longer than the slowest handler too;
	// a record completed after its TTL is logged at warn level. Defaults to
	// [DefaultTTL].
	TTL time.Duration

	// Retention is how long a cleaner built with [Middleware.CleanerConfig] keeps
	// records after they expire. The SQL stores start a cleaner of their own when they
	// open, whose retention is their Config.Cleaner's. Defaults to [DefaultRetention]
	// (0).
	Retention time.Duration

	// Lease is how long a claim holds its key without renewal before another request
	// may take it over. The handler's context is cancelled with cause [ErrLeaseLost]
	// at the lease's end less a margin (Lease/10, at most [MaxLeaseMargin]) unless a
	// renewal succeeded by then, so that a holder whose store stopped answering never
	// runs on beside the request that takes its key over. Defaults to [DefaultLease].
	Lease time.Duration

	// Heartbeat is how often the lease is renewed while the handler runs; it must be
	// shorter than Lease. Defaults to Lease/3.
	Heartbeat time.Duration

	// RetryAfter is the Retry-After sent with request_in_progress and
	// store_unavailable, rounded up to whole seconds (at least 1). Defaults to
	// [DefaultRetryAfter].
	RetryAfter time.Duration

	// InFlightWait is how long a duplicate of a request that is still executing waits
	// for it to finish, polling the store with a short backoff, before it answers 409
	// request_in_progress. When the first request completes in time the duplicate gets
	// its replay; when it released the key, the duplicate claims it and executes. The
	// whole wait, store calls included, ends within InFlightWait + StoreTimeout.
	// Defaults to [DefaultInFlightWait] (0: answer 409 at once).
	InFlightWait time.Duration

	// StoreTimeout bounds each store call made before the handler runs: the claim and
	// each poll of an in-flight wait. A call that has not answered by then (a stalled
	// store: connections open, no replies), like one that fails, answers 503
	// store_unavailable with Retry-After (SPEC §9). Lock contention that a store
	// retries (SQLite's busy state) is retried within it too. The completion and the
	// release after the handler are bounded by Lease instead. Defaults to
	// [DefaultStoreTimeout].
	StoreTimeout time.Duration

	// MaxBodyBytes bounds the request body that is read and fingerprinted; a larger
	// body is refused with 413 body_too_large (SPEC §4). Defaults to
	// [DefaultMaxBodyBytes].
	MaxBodyBytes int64

	// KeyHeader is the name of the request header that carries the idempotency key;
	// routes may override it. The key is echoed under the same name on every response
	// to a keyed request. Defaults to [DefaultKeyHeader] ("Idempotency-Key").
	KeyHeader string

	// Fingerprint computes the fingerprint of a keyed request from the request and its
	// body, read within MaxBodyBytes (the request's own Body must not be read); routes
	// may override it. A retry must get the same fingerprint, another operation a
	// different one. [FingerprintJSONFields] and [FingerprintJSONExcept] cover chosen
	// members of a JSON body only. Defaults to [FingerprintRequest] (SPEC §4).
	Fingerprint FingerprintFunc

	// ErrorWriter writes the errors the middleware answers itself (SPEC §9); routes may
	// override it. It gets a [Problem] with Code, Status (the profile's) and Detail set,
	// after the middleware has set Retry-After (request_in_progress, store_unavailable)
	// and echoed the key header, and must write the whole response. Defaults to
	// [WriteProblem] in Profile's shape with ProblemTypeBase.
	ErrorWriter ErrorWriter

	// MaxResponseBytes bounds the response body that is stored. A larger response is
	// streamed to the client and the record completed as not stored (SPEC §6).
	// Defaults to [DefaultMaxResponseBytes].
	MaxResponseBytes int64

	// StoredHeaders are response headers stored and replayed in addition to
	// [DefaultStoredHeaders]. Credentials (Authorization, Cookie, Set-Cookie,
	// X-Api-Key, WWW-Authenticate…), Date and hop-by-hop headers are refused
	// ([New] panics saying why; admin.StoredHeaderError is the same check and
	// more, for operators). Defaults to none.
	StoredHeaders []string

	// StorePolicy says whether a response with status is stored (true) or releases the
	// key so that a retry executes afresh (false); routes may override it and a
	// handler may override it for one response with [Handle.SetStore]. Defaults to
	// [DefaultStorePolicy].
	StorePolicy func(status int) bool

	// ReplayCacheSize, when positive, keeps up to this many completed responses in an
	// in-process cache (least recently used evicted first), so that a replay served
	// from it costs no store round trip (SPEC §5). The cache is filled when this
	// process completes a record or replays one from the store, and is consulted
	// before the claim. A hit needs the same scope and a matching fingerprint; a
	// mismatch goes to the store, which answers key_reused. It holds completed records
	// only (never in-flight state; records completed as not stored are kept too, and
	// answer response_not_stored), and never a released key. Sharing the store with
	// other processes is safe: a completed record never changes before it expires.
	//
	// Entries are dropped a margin of a few seconds before the record's expires_at.
	// Expiry is read from the process's clock (Clock when set), not the store's; the
	// margin covers a bounded skew between them. Each entry holds a copy of the
	// response, so memory use is about ReplayCacheSize times the typical stored
	// response. Defaults to [DefaultReplayCacheSize] (0, off).
	ReplayCacheSize int

	// Profile is the shape of error bodies (SPEC §9). Defaults to [ProfileSeed].
	Profile Profile

	// ProblemTypeBase is the base URI of problem types in [ProfileIETF]. Defaults to
	// [DefaultProblemTypeBase].
	ProblemTypeBase string

	// Logger receives the middleware's logs. Keys are logged as a short hash, never
	// in full; bodies are never logged. Repeated warnings and errors are summarised,
	// one line and a count per 10 s.
	// Defaults to [slog.Default].
	Logger *slog.Logger

	// Clock, when set, replaces the store's clock for every lease and expiry decision
	// (it is passed as the Now of store parameters) and the middleware's own reading
	// of time. Tests use it; production leaves it nil so that the store's clock
	// decides (SPEC §5). Defaults to nil.
	Clock func() time.Time

	// Observer is told of every claim's outcome, completion, release, failed renewal,
	// lost lease and store call (SPEC §15), labelled with the route's name
	// ([RouteOptions.Name]). Defaults to nil, which costs nothing.
	Observer *observe.Observer

	// MaxInFlightPerScope bounds the keyed requests of one scope (principal) under way
	// in this process at once: past it a keyed request gets 429 quota_exceeded with
	// Retry-After, nothing claimed (SPEC §19); see [GuardConfig.MaxInFlightPerScope].
	// Negative: no bound. Defaults to [DefaultMaxInFlightPerScope].
	MaxInFlightPerScope int
	// MaxStoredBytesPerScope bounds the bytes of responses one scope stores in this
	// process per QuotaWindow: past it its new keys get 429 quota_exceeded with
	// Retry-After (the rest of the window), nothing claimed, while its retries are
	// still replayed; see [GuardConfig.MaxStoredBytesPerScope]. Negative: no bound.
	// Defaults to [DefaultMaxStoredBytesPerScope].
	MaxStoredBytesPerScope int64
	// QuotaWindow is the window of MaxStoredBytesPerScope. Defaults to
	// [DefaultQuotaWindow].
	QuotaWindow time.Duration
	// Seal, when set, seals records (SPEC §19): the stored responses' status, headers
	// and body, and the results steps save, are sealed above the store, bound to their
	// record, and fingerprints are keyed; see [GuardConfig.Seal]. A record that cannot
	// be opened is answered 500 record_unreadable and never executed again. Make it with
	// [OpenKeyring] on Store. Defaults to nil: records are stored in clear.
	Seal *seal.Keyring

	// SealingOff lets a middleware without a keyring (Seal nil) serve a store whose
	// sealing began: sealing is being turned off (SPEC §20, docs/security.md). See
	// [GuardConfig.SealingOff]. Defaults to false: without a keyring, a store whose
	// sealing began is not served.
	SealingOff bool
}

// RouteOptions change the middleware's behaviour for the routes one
// [Middleware.Route] wraps.
type RouteOptions struct {
	// Name is the routes' operation's stable identifier, not only a label. It is two
	// things: the Observer's route label (a metric label, such as "payouts.create";
	// without a Name the label is the request's ServeMux pattern, http.Request's
	// Pattern such as "POST /v1/payouts"), and, on a route with steps, the name the
	// record keeps (SPEC §13), as [Call.Name] does, so that the [Completer] finds the
	// resume function registered under it (Resume); the pattern is never kept. Keep it
	// stable across deploys while any record of the route is unfinished: the
	// unfinished records of a renamed route find no resume function (the completer
	// logs each) until their clients retry. Required with Resume; defaults to "".
	Name string
	// Requirement overrides the method table for these routes. Defaults to
	// [KeyByMethod].
	Requirement Requirement
	// TTL overrides Config.TTL; like it, it must be longer than Config.Lease and at
	// most [MaxTTL]. Defaults to Config.TTL.
	TTL time.Duration
	// StorePolicy overrides Config.StorePolicy. Defaults to Config.StorePolicy.
	StorePolicy func(status int) bool

	// KeyHeader overrides Config.KeyHeader. Defaults to Config.KeyHeader.
	KeyHeader string
	// Fingerprint overrides Config.Fingerprint. Defaults to Config.Fingerprint.
	Fingerprint FingerprintFunc
	// ErrorWriter overrides Config.ErrorWriter. Defaults to Config.ErrorWriter.
	ErrorWriter ErrorWriter

	// ClaimInHandler says that the route's handlers write only to the store's
	// database, through the store's Respond (store/postgres's and store/sqlite's
	// (*Store).Respond): the middleware parses the key, the scope and the fingerprint
	// as usual and runs the handler without a claim, and Respond claims the key inside
	// the one transaction that also holds the handler's writes and its completed record
	// (on PostgreSQL the record, the writes and COMMIT travel in one round trip). No
	// lease or heartbeat is needed: the open transaction is the lock, and a crash rolls
	// everything back. When the key is recorded already, that transaction writes
	// nothing and Respond answers what the key calls for (the stored response,
	// key_reused, 409, or, for an expired record or a lapsed lease, the writes run
	// again under the lease); a duplicate that finds the claim uncommitted waits a
	// bounded time (the store's lock timeout) and gets 409 request_in_progress. While
	// the route's requests often find their key recorded (more than a quarter of the
	// recent ones: a client retrying, a retry storm), the middleware reads the key first
	// (one primary-key read) and answers a retry as the lease route does, without
	// running the handler; it stops when they rarely do (under an eighth), since the
	// read costs every new key a round trip. Either way a key this process knows is
	// answered before the handler: a duplicate of a key whose handler runs here gets
	// 409 request_in_progress (unless InFlightWait is set), and a key recorded here
	// (the route's last 1,024) is read first. A helper that needs a
	// lease (InTx, backstop's) claims the key first the usual way
	// ([Handle.AcquireForTx]). A handler that answers a response to store without a
	// helper (its writes through the database directly) is a misuse, answered 500
	// internal_error, never stored, and logged at error level naming the route: it
	// would run once per duplicate. Route panics when the store has no such Respond
	// (Capabilities.Transactions false: Redis, memory). Unsuitable for a handler that
	// calls anything outside the database before its transaction: a duplicate that
	// another process serves runs that call too. Defaults to false.
	ClaimInHandler bool

	// Resume, when set, is the function that finishes the operation of a record whose
	// holder died after one of its steps committed, for the [Completer] (SPEC §13).
	// Route registers it with the middleware's guard under Name ([Guard.RegisterResume]),
	// and panics when Name is empty or has a resume function already. Defaults to nil.
	Resume ResumeFunc

	// NoStoreBody keeps the outcome of these routes only (SPEC §19): a response that
	// the store policy stores is recorded with its status alone, no header and no
	// body, as one too large to store is (Response.NotStored), and the client still
	// gets it whole. Repeats get 409 response_not_stored, and the operation is never
	// executed again. For routes whose responses mint secrets (a card's token, an API
	// key) that must exist in one place only. Defaults to false.
	NoStoreBody bool

	// OnLapse says what a request does that finds its key in flight with the holder's
	// lease lapsed (SPEC §5.3, §13): take it over and run the handler again, resuming
	// after its last committed step ([LapseTakeOver]), or answer 500 outcome_unknown,
	// stored so that every retry gets it, until an operator resolves the key
	// ([LapseUnknown]: for handlers whose foreign effects cannot be deduplicated).
	// Defaults to [LapseTakeOver].
	OnLapse LapsePolicy
}

// FingerprintFunc computes the fingerprint of a keyed request from the request and its
// body as the middleware read it ([Config.Fingerprint]). [FingerprintRequest] is the
// default.
type FingerprintFunc func(r *http.Request, body []byte) Fingerprint

// ErrorWriter writes an error the middleware answers itself ([Config.ErrorWriter]):
// p has Code, Status and Detail set. The default is [WriteProblem] in the profile's
// shape.
type ErrorWriter func(w http.ResponseWriter, r *http.Request, p *Problem)

// config is a validated Config with defaults applied.
type config struct {
	Config
	methods       map[string]Requirement
	storedHeaders map[string]bool
	retryAfterHdr string // RetryAfter as the header's value
}

// newConfig validates c and applies its defaults, and builds the guard the middleware
// runs on from the fields they share (validated as "Config.Field").
func newConfig(c Config) (*config, *Guard) {
	if c.Scope == nil {
		panic("idem: Config.Scope is required")
	}
	nonNegative("Config", "Retention", c.Retention)
	if c.MinKeyLength < 0 || c.MinKeyLength > MaxKeyLength {
		panic(fmt.Sprintf("idem: Config.MinKeyLength must be between 1 and %d, got %d", MaxKeyLength, c.MinKeyLength))
	}
	if c.MaxBodyBytes < 0 {
		panic(fmt.Sprintf("idem: Config.MaxBodyBytes must not be negative, got %d", c.MaxBodyBytes))
	}
	if c.MaxResponseBytes < 0 {
		panic(fmt.Sprintf("idem: Config.MaxResponseBytes must not be negative, got %d", c.MaxResponseBytes))
	}
	if !c.Profile.valid() {
		panic(fmt.Sprintf("idem: Config.Profile is not a known profile: %v", c.Profile))
	}
	g := newGuard(GuardConfig{
		Store: c.Store, TTL: c.TTL, Lease: c.Lease, Heartbeat: c.Heartbeat,
		InFlightWait: c.InFlightWait, StoreTimeout: c.StoreTimeout, RetryAfter: c.RetryAfter,
		ReplayCacheSize: c.ReplayCacheSize, Logger: c.Logger, Clock: c.Clock, Observer: c.Observer,
		MaxInFlightPerScope: c.MaxInFlightPerScope, MaxStoredBytesPerScope: c.MaxStoredBytesPerScope, QuotaWindow: c.QuotaWindow,
		Seal: c.Seal, SealingOff: c.SealingOff,
	}, "Config")
	c.TTL, c.Lease, c.Heartbeat = g.cfg.TTL, g.cfg.Lease, g.cfg.Heartbeat
	c.StoreTimeout, c.RetryAfter, c.Logger = g.cfg.StoreTimeout, g.cfg.RetryAfter, g.cfg.Logger

	setDefault(&c.MinKeyLength, DefaultMinKeyLength)
	setDefault(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&c.MaxResponseBytes, DefaultMaxResponseBytes)
	setDefault(&c.ProblemTypeBase, DefaultProblemTypeBase)
	setDefault(&c.KeyHeader, DefaultKeyHeader)
	c.KeyHeader = canonicalKeyHeader("Config.KeyHeader", c.KeyHeader)
	if c.StorePolicy == nil {
		c.StorePolicy = DefaultStorePolicy
	}
	if c.Fingerprint == nil {
		c.Fingerprint = FingerprintRequest
	}
	if c.ErrorWriter == nil {
		profile, base := c.Profile, c.ProblemTypeBase
		c.ErrorWriter = func(w http.ResponseWriter, r *http.Request, p *Problem) {
			p.TypeBase = base
			WriteProblem(w, r, profile, p)
		}
	}

	methods := DefaultMethods()
	for m, q := range c.Methods {
		if !q.valid() || q == KeyByMethod {
			panic(fmt.Sprintf("idem: Config.Methods[%q] must be KeyRequired, KeyOptional or KeyOff, got %v", m, q))
		}
		methods[strings.ToUpper(m)] = q
	}
	cfg := &config{Config: c, methods: methods, storedHeaders: storedHeaderSet(c.StoredHeaders)}
	s := int64((c.RetryAfter + time.Second - 1) / time.Second)
	cfg.retryAfterHdr = strconv.FormatInt(max(s, 1), 10)
	return cfg, g
}

// canonicalKeyHeader returns name in canonical form, panicking, naming field, when it
// is not a header name.
func canonicalKeyHeader(field, name string) string {
	for i := 0; i < len(name); i++ {
		if !isTokenByte(name[i]) {
			panic(fmt.Sprintf("idem: %s is not a header name: %q", field, name))
		}
	}
	return http.CanonicalHeaderKey(name)
}

// requirement returns the requirement of method under the route's override.
func (c *config) requirement(route Requirement, method string) Requirement {
	if route != KeyByMethod {
		return route
	}
	if q, ok := c.methods[method]; ok {
		return q
	}
	return KeyOptional
}

// retryAfter is RetryAfter in whole seconds, rounded up, at least 1.
func (c *config) retryAfter() string { return c.retryAfterHdr }
