package grpcidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idem-go/idem"
)

// MetadataKey is the metadata key that carries the idempotency key. Its value is
// parsed as SPEC §3 parses the Idempotency-Key header ([idem.ParseKey]).
const MetadataKey = "idempotency-key"

// ReplayedKey is the header metadata key set to "true" on a response replayed from
// the store, as the HTTP middleware sets Idempotent-Replayed.
const ReplayedKey = "idempotent-replayed"

// DefaultRequirement is the key requirement of a method that [ServerConfig.Methods]
// does not name: optional. gRPC has no method table telling safe calls from unsafe
// ones, so a call without a key passes through and a call with one is honoured.
const DefaultRequirement = idem.KeyOptional

// ServerConfig configures [UnaryServerInterceptor]. Guard and Scope are required;
// every other field has a default.
type ServerConfig struct {
	// Guard runs the state machine of SPEC §5 on its store: claims, leases, replays.
	// Share the HTTP middleware's ([idem.Middleware.Guard]) or build one with
	// [idem.NewGuard]. Required.
	Guard *idem.Guard

	// Scope returns the authenticated principal of a call, from its context (as an
	// authentication interceptor that runs before this one left it there). Records
	// are identified by (scope, key), so nothing of one principal is ever replayed to
	// another (SPEC §3). An empty scope or an error refuses a keyed call with
	// UNAUTHENTICATED without touching the store. Required.
	Scope func(ctx context.Context) (string, error)

	// Methods sets options per full method name ("/pkg.Service/Method"): whether a
	// call needs a key, and what a call that finds its key's holder dead does.
	// Methods not named get the zero MethodOptions: a key as Requirement says, and
	// takeover of a lapsed lease. Defaults to none.
	Methods map[string]MethodOptions

	// Requirement is the key requirement of methods whose MethodOptions do not set
	// one. Defaults to [DefaultRequirement] (optional).
	Requirement idem.Requirement

	// MinKeyLength is the shortest key accepted (SPEC §3). Defaults to
	// [idem.DefaultMinKeyLength].
	MinKeyLength int

	// StorePolicy says whether a handler's status error with code is stored and
	// replayed (true) or releases the key so that a retry executes afresh (false);
	// a handler overrides it for one call with FromContext(ctx).SetStore. A success
	// is always stored. Defaults to [DefaultStorePolicy].
	StorePolicy func(code codes.Code) bool

	// MaxResponseBytes bounds the encoded response that is stored. A larger response
	// is sent all the same and its record completed as not stored: repeats get
	// FAILED_PRECONDITION (response_not_stored) and the call is never executed
	// again (SPEC §6). Defaults to [idem.DefaultMaxResponseBytes].
	MaxResponseBytes int

	// RetryAfter is the delay of the RetryInfo sent with UNAVAILABLE when the store
	// fails. (ABORTED, for a key in progress, carries the guard's RetryAfter.)
	// Defaults to [idem.DefaultRetryAfter].
	RetryAfter time.Duration

	// Types resolves the stored response's message type when it is replayed.
	// Defaults to [protoregistry.GlobalTypes], where generated code registers its
	// messages.
	Types protoregistry.MessageTypeResolver

	// Logger receives the interceptor's logs. Keys are logged as a short hash, never
	// in full; messages are never logged. Defaults to [slog.Default].
	Logger *slog.Logger
}

// MethodOptions change the interceptor's behaviour for one method
// ([ServerConfig.Methods]).
type MethodOptions struct {
	// Requirement says whether a call must carry a key ([idem.KeyRequired]: a call
	// without one gets INVALID_ARGUMENT), may ([idem.KeyOptional]: a key is honoured
	// when sent) or is never keyed ([idem.KeyOff]: a key is ignored). Defaults to
	// ServerConfig.Requirement ([idem.KeyByMethod], the zero value, means that).
	Requirement idem.Requirement

	// OnLapse says what a call does that finds its key in flight with the holder's
	// lease lapsed (the holder died): take it over and execute again
	// ([idem.LapseTakeOver]), or get UNKNOWN outcome_unknown, stored, until an
	// operator resolves the key ([idem.LapseUnknown], for a method whose foreign
	// effects cannot be deduplicated; SPEC §13). Defaults to [idem.LapseTakeOver].
	OnLapse idem.LapsePolicy
}

// DefaultStorePolicy is SPEC §6's policy in gRPC's codes: it stores a handler's
// FAILED_PRECONDITION (the operation ran and reached a final outcome that a retry
// would not change, as a declined card's 402 does over HTTP) and releases the key for
// every other code, each of which means "nothing happened, you may try again" or maps
// to an HTTP status that §6 releases: INVALID_ARGUMENT, OUT_OF_RANGE (400),
// UNAUTHENTICATED (401), PERMISSION_DENIED (403), NOT_FOUND (404), ALREADY_EXISTS,
// ABORTED (409), RESOURCE_EXHAUSTED (429), CANCELED, DEADLINE_EXCEEDED, UNKNOWN,
// INTERNAL, UNIMPLEMENTED, UNAVAILABLE and DATA_LOSS (5xx). A plain (non-status)
// error is UNKNOWN.
func DefaultStorePolicy(code codes.Code) bool {
	return code == codes.OK || code == codes.FailedPrecondition
}

// server is a validated ServerConfig with its defaults applied.
type server struct {
	ServerConfig
}

// UnaryServerInterceptor returns the interceptor that makes keyed unary calls
// idempotent (SPEC §16); see the package documentation for what it does and the
// status of each outcome. Streaming calls are not intercepted: install
// [StreamServerInterceptor] beside it, which refuses streaming calls that ask for a
// key. It panics with a
// "grpcidem: " message naming the field when cfg is invalid.
func UnaryServerInterceptor(cfg ServerConfig) grpc.UnaryServerInterceptor {
	s := newServer(cfg)
	return s.intercept
}

// CodeStreamNotSupported is the SPEC §9-style code of a streaming call that asked for
// an idempotency key ([StreamServerInterceptor]): it carries one, or its method
// requires one.
const CodeStreamNotSupported = "stream_not_supported"

// StreamServerInterceptor returns the interceptor that keeps streaming calls from
// running silently unprotected. idem makes unary calls idempotent; a stream has no one
// response to store and replay, so a streaming call cannot run at most once per key.
// A streaming call that carries a key, or whose method requires one
// ([MethodOptions.Requirement], ServerConfig.Requirement), is refused with
// FAILED_PRECONDITION (code [CodeStreamNotSupported]) before its handler runs, and an
// error naming the method is logged (once per method and interceptor); a streaming call
// without a key, of a method that does not require one, passes through. Install it
// beside [UnaryServerInterceptor] with the same config:
//
//	grpc.NewServer(
//		grpc.ChainUnaryInterceptor(auth, grpcidem.UnaryServerInterceptor(cfg)),
//		grpc.ChainStreamInterceptor(authStream, grpcidem.StreamServerInterceptor(cfg)),
//	)
//
// It panics, as UnaryServerInterceptor does, when cfg is invalid.
func StreamServerInterceptor(cfg ServerConfig) grpc.StreamServerInterceptor {
	s := newServer(cfg)
	var logged sync.Map // method name → true
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		keyed := len(md.Get(MetadataKey)) > 0
		q := s.method(info.FullMethod).Requirement
		if q == idem.KeyOff || (!keyed && q != idem.KeyRequired) {
			return handler(srv, ss)
		}
		if _, seen := logged.LoadOrStore(info.FullMethod, true); !seen {
			s.Logger.ErrorContext(ss.Context(), "grpcidem: a streaming call asked for an idempotency key, which streaming methods cannot honour; "+
				"refusing it (make the method unary, or set its MethodOptions.Requirement to idem.KeyOff and send no key)",
				"method", info.FullMethod, "requirement", q.String(), "keyed", keyed)
		}
		return newStatus(codes.FailedPrecondition, CodeStreamNotSupported,
			"streaming methods cannot run at most once per idempotency key; call it without one", 0)
	}
}

func newServer(c ServerConfig) *server {
	switch {
	case c.Guard == nil:
		panic("grpcidem: ServerConfig.Guard is required")
	case c.Scope == nil:
		panic("grpcidem: ServerConfig.Scope is required")
	case c.MinKeyLength < 0 || c.MinKeyLength > idem.MaxKeyLength:
		panic(fmt.Sprintf("grpcidem: ServerConfig.MinKeyLength must be between 1 and %d, got %d", idem.MaxKeyLength, c.MinKeyLength))
	case c.MaxResponseBytes < 0:
		panic(fmt.Sprintf("grpcidem: ServerConfig.MaxResponseBytes must not be negative, got %d", c.MaxResponseBytes))
	case c.RetryAfter < 0:
		panic(fmt.Sprintf("grpcidem: ServerConfig.RetryAfter must not be negative, got %v", c.RetryAfter))
	}
	checkRequirement("ServerConfig.Requirement", c.Requirement)
	for name, o := range c.Methods {
		if !strings.HasPrefix(name, "/") || strings.Count(name, "/") != 2 {
			panic(fmt.Sprintf("grpcidem: ServerConfig.Methods: %q is not a full method name (/package.Service/Method)", name))
		}
		checkRequirement("ServerConfig.Methods["+name+"].Requirement", o.Requirement)
		if o.OnLapse != idem.LapseTakeOver && o.OnLapse != idem.LapseUnknown {
			panic(fmt.Sprintf("grpcidem: ServerConfig.Methods[%s].OnLapse is not a known policy: %v", name, o.OnLapse))
		}
	}
	if c.Requirement == idem.KeyByMethod {
		c.Requirement = DefaultRequirement
	}
	if c.MinKeyLength == 0 {
		c.MinKeyLength = idem.DefaultMinKeyLength
	}
	if c.StorePolicy == nil {
		c.StorePolicy = DefaultStorePolicy
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = idem.DefaultMaxResponseBytes
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = idem.DefaultRetryAfter
	}
	if c.Types == nil {
		c.Types = protoregistry.GlobalTypes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &server{c}
}

func checkRequirement(field string, q idem.Requirement) {
	switch q {
	case idem.KeyByMethod, idem.KeyRequired, idem.KeyOptional, idem.KeyOff:
		return
	}
	panic(fmt.Sprintf("grpcidem: %s is not a known requirement: %v", field, q))
}

// method returns the options of a method, its requirement resolved.
func (s *server) method(name string) MethodOptions {
	o := s.Methods[name]
	if o.Requirement == idem.KeyByMethod {
		o.Requirement = s.Requirement
	}
	return o
}

// fingerprintOptions encode a request for its fingerprint: deterministically, so that
// a retry of the same message (maps included) has the same bytes.
var fingerprintOptions = proto.MarshalOptions{Deterministic: true}

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(MetadataKey)
	opts := s.method(info.FullMethod)
	if q := opts.Requirement; q == idem.KeyOff || (q == idem.KeyOptional && len(values) == 0) {
		// Without a key on purpose: the store's SPEC §7 helpers run plain
		// transactions under it (idem.WithoutKey), and refuse any other context.
		return handler(idem.WithoutKey(ctx), req)
	}
	key, err := idem.ParseKey(values, s.MinKeyLength)
	if err != nil {
		return nil, keyError(err)
	}
	scope, err := s.Scope(ctx)
	if err != nil || scope == "" {
		return nil, newStatus(codes.Unauthenticated, idem.CodeScopeRequired, "an idempotency key requires an authenticated call", 0)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "grpcidem: the request of %s is a %T, not a protocol buffer message", info.FullMethod, req)
	}
	fp, err := fingerprint(info.FullMethod, msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "grpcidem: encoding the request for its fingerprint: %v", err)
	}
	// The call runs to its outcome even when the client goes away or its deadline
	// passes, as the HTTP middleware's handler does: the outcome is stored, so the
	// client's retry gets a replay instead of a key in flight or half-done work.
	h, replay, err := s.Guard.Begin(context.WithoutCancel(ctx),
		idem.Call{Scope: scope, Key: key, Fingerprint: fp, Name: info.FullMethod, OnLapse: opts.OnLapse})
	switch {
	case err != nil:
		return nil, s.beginError(err)
	case replay != nil:
		return s.replay(ctx, info.FullMethod, replay)
	}
	return s.execute(ctx, h, req, info, handler)
}

// fingerprint is the fingerprint of a call to method with msg (SPEC §4, §16): the
// method's full name and the message's deterministic encoding. A NUL byte goes first,
// so that an encoding that happens to be valid JSON is hashed as the raw bytes it is,
// never canonicalised as JSON (which would ignore white space in it).
func fingerprint(method string, msg proto.Message) (idem.Fingerprint, error) {
	b, err := fingerprintOptions.MarshalAppend([]byte{0}, msg)
	if err != nil {
		return idem.Fingerprint{}, err
	}
	return idem.FingerprintInput(method, b), nil
}

// keyError is the status of a key that ParseKey refused.
func keyError(err error) error {
	if errors.Is(err, idem.ErrKeyRequired) {
		return newStatus(codes.InvalidArgument, idem.CodeKeyRequired, "an "+MetadataKey+" is required for this method", 0)
	}
	// ParseKey's errors say what is wrong and never contain the key.
	why := strings.TrimPrefix(err.Error(), idem.ErrKeyInvalid.Error()+": ")
	why = strings.ReplaceAll(why, "Idempotency-Key header", MetadataKey+" value")
	return newStatus(codes.InvalidArgument, idem.CodeKeyInvalid, "the "+MetadataKey+" is invalid: "+why, 0)
}

// beginError is the status of a claim that did not acquire the key.
func (s *server) beginError(err error) error {
	var inProgress *idem.InProgressError
	var quota *idem.QuotaError
	switch {
	case errors.Is(err, idem.ErrKeyReused):
		return newStatus(codes.FailedPrecondition, idem.CodeKeyReused, "the idempotency key was already used with a different request or method", 0)
	case errors.Is(err, idem.ErrResponseNotStored):
		return newStatus(codes.FailedPrecondition, idem.CodeResponseNotStored, "the call with this idempotency key completed, but its response was not stored and cannot be replayed", 0)
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return newStatus(codes.Unknown, idem.CodeOutcomeUnknown, "the call with this idempotency key may or may not have taken effect; it will not be executed again until the key is resolved", 0)
	case errors.As(err, &inProgress):
		return newStatus(codes.Aborted, idem.CodeRequestInProgress, "a call with this idempotency key is in progress; retry later", inProgress.RetryAfter)
	case errors.As(err, &quota):
		return newStatus(codes.ResourceExhausted, idem.CodeQuotaExceeded, "this principal reached a bound of its own ("+quota.Limit+"); nothing was executed; retry later", quota.RetryAfter)
	default: // the guard logged the store's error (SPEC §9: fail closed)
		return s.unavailable()
	}
}

// unavailable is the status of a store that failed, or of a result that must not be
// used (its completion did not commit, or its lease was lost).
func (s *server) unavailable() error {
	return newStatus(codes.Unavailable, idem.CodeStoreUnavailable, "the idempotency store is unavailable; retry later", s.RetryAfter)
}

// replay answers with a stored result (SPEC §5.4), marking it with ReplayedKey.
func (s *server) replay(ctx context.Context, method string, stored *idem.Response) (any, error) {
	resp, err := decodeResult(stored, s.Types)
	if errors.Is(err, errNotAResult) {
		s.Logger.ErrorContext(ctx, "grpcidem: the stored result cannot be replayed", "method", method, "error", err)
		return nil, status.Errorf(codes.Internal, "grpcidem: the stored result of this idempotency key cannot be replayed: %v", err)
	}
	if serr := grpc.SetHeader(ctx, metadata.Pairs(ReplayedKey, "true")); serr != nil {
		s.Logger.DebugContext(ctx, "grpcidem: marking the replay failed", "method", method, "error", serr)
	}
	return resp, err
}

// execute runs the handler under the acquired claim and stores its outcome or
// releases the key (SPEC §5–§7).
func (s *server) execute(ctx context.Context, h *idem.Handle, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	hctx := s.newHandlerContext(h)
	defer func() {
		if p := recover(); p != nil {
			_ = h.Release()
			panic(p)
		}
	}()
	resp, herr := handler(hctx, req)
	h.SetResponder(s.outcome(resp, herr))
	err := h.Complete()
	leaseLost := errors.Is(context.Cause(h.Context()), idem.ErrLeaseLost)
	switch {
	case err == nil && leaseLost && herr != nil:
		// The handler gave up because its lease was lost (the store went away, or
		// another call took the key over): whatever it answered, the client is told
		// to retry, and the retry meets the key's real outcome.
		s.Logger.WarnContext(ctx, "grpcidem: the handler failed after losing its lease; answering UNAVAILABLE", "method", info.FullMethod)
		return nil, s.unavailable()
	case err == nil, errors.Is(err, idem.ErrStoreUnavailable):
		// Stored or released as decided; or the store failed to record the outcome
		// (logged by the guard), whose effects happened: it stands.
		return resp, herr
	default:
		// The lease was lost before the completion, or the §7 transaction did not
		// commit: the outcome must not be used.
		return nil, s.unavailable()
	}
}

// outcome is what the handler's result stores: the response message, or the status
// error, with the store policy's decision. A response that is not a protocol buffer
// message, or cannot be encoded, releases the key.
func (s *server) outcome(resp any, herr error) idem.Responder {
	if herr != nil {
		st := status.Convert(herr)
		r, err := encodeStatus(st)
		if err != nil {
			return result{}
		}
		return result{resp: r, store: s.StorePolicy(st.Code())}
	}
	msg, ok := resp.(proto.Message)
	if !ok {
		return result{}
	}
	r, err := encodeMessage(msg, s.MaxResponseBytes)
	if err != nil {
		return result{}
	}
	return result{resp: r, store: true}
}

// result is the Responder of a call whose handler returned.
type result struct {
	resp  *idem.Response
	store bool
}

func (r result) Response() (*idem.Response, bool) { return r.resp, r.store }
