package idem

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Middleware is the net/http middleware that makes keyed requests idempotent (SPEC
// §2–§9). Build one with [New] and wrap handlers with [Middleware.Handler], or with
// [Middleware.Route] for per-route options. It belongs inside the authentication
// middleware (the Scope function reads the principal) and inside any compression
// middleware. It is safe for concurrent use.
//
// For a keyed request it parses the key, refuses an unauthenticated request, reads and
// fingerprints the body, and claims (scope, key) in one store operation. The request
// that acquires the key runs the handler, with the body re-readable and a [Handle] in
// its context, while a heartbeat renews the lease; the response is captured, then
// stored or the key released (SPEC §6), and only then sent. Duplicates get the stored
// response with "Idempotent-Replayed: true", or a §9 error.
//
// When the store fails to complete the record after the handler ran (other than by
// losing the lease), the client still gets the handler's response: its effects
// happened, and a 503 would make the client retry and execute the operation again once
// the lease lapses. The failure is logged at error level.
type Middleware struct {
	cfg *config

	// newBeat arms a heartbeat's timer (time.AfterFunc), and newLeaseTimer the timer
	// of a lease's end; tests fire them by hand.
	newBeat, newLeaseTimer func(d time.Duration, f func()) beatTimer
	// hooks signal tests; all nil in production.
	hooks testHooks
	// cache is the bounded cache of completed responses (Config.ReplayCacheSize); nil
	// when off.
	cache *replayCache
}

// testHooks let tests wait on events instead of sleeping.
type testHooks struct {
	renewed func(err error) // after each lease renewal
	waiting func()          // when a duplicate starts waiting for an in-flight request
}

// route is a RouteOptions resolved against the Config.
type route struct {
	requirement Requirement
	ttl         time.Duration
	policy      func(status int) bool
	// claimInHandler is RouteOptions.ClaimInHandler.
	claimInHandler bool
	// A later policy for keys whose holder died (SPEC §5.3 "unknown") goes here; today
	// a lapsed lease is always taken over and the operation executes again.
}

// New returns a Middleware for cfg. It panics with a message naming the field when cfg
// is invalid (a programmer's mistake): "idem: Config.Scope is required".
func New(cfg Config) *Middleware {
	m := &Middleware{cfg: newConfig(cfg), newBeat: newRealBeat, newLeaseTimer: newRealBeat}
	if m.cfg.ReplayCacheSize > 0 {
		m.cache = newReplayCache(m.cfg.ReplayCacheSize)
	}
	return m
}

// Handler wraps next with the middleware's default options: the key requirement comes
// from the method table.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return m.Route(RouteOptions{})(next)
}

// Route returns a middleware that wraps a route's handler with opts, which override
// the Config for that route. It panics when opts is invalid.
func (m *Middleware) Route(opts RouteOptions) func(http.Handler) http.Handler {
	if !opts.Requirement.valid() {
		panic(fmt.Sprintf("idem: RouteOptions.Requirement is not a known requirement: %v", opts.Requirement))
	}
	if opts.TTL < 0 {
		panic(fmt.Sprintf("idem: RouteOptions.TTL must not be negative, got %v", opts.TTL))
	}
	if opts.TTL != 0 {
		checkTTL("RouteOptions.TTL", opts.TTL, m.cfg.Lease)
	}
	rt := &route{requirement: opts.Requirement, ttl: opts.TTL, policy: opts.StorePolicy, claimInHandler: opts.ClaimInHandler}
	setDefault(&rt.ttl, m.cfg.TTL)
	if rt.policy == nil {
		rt.policy = m.cfg.StorePolicy
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(rt, next, w, r)
		})
	}
}

// WriteError writes the idem error code with the middleware's profile and problem type
// base, as [WriteError] does.
func (m *Middleware) WriteError(w http.ResponseWriter, r *http.Request, code string, detail string) {
	if retryable(code) && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", m.cfg.retryAfter())
	}
	WriteProblem(w, r, m.cfg.Profile, &Problem{Code: code, Detail: detail, TypeBase: m.cfg.ProblemTypeBase})
}

// CleanerConfig returns a [CleanerConfig] with the middleware's Retention, Logger and
// Clock, for a [Cleaner] of the same store.
func (m *Middleware) CleanerConfig() CleanerConfig {
	return CleanerConfig{Retention: m.cfg.Retention, Logger: m.cfg.Logger, Clock: m.cfg.Clock}
}

// storeNow is the Now of store parameters: zero, so that the store's clock decides,
// unless a Clock is injected.
func (m *Middleware) storeNow() time.Time {
	if m.cfg.Clock != nil {
		return m.cfg.Clock()
	}
	return time.Time{}
}

// localNow is the middleware's own reading of time.
func (m *Middleware) localNow() time.Time {
	if m.cfg.Clock != nil {
		return m.cfg.Clock()
	}
	return time.Now()
}

// request is one keyed request on its way through the middleware. It is one
// allocation: the execution, when the request acquires the key, lives in it too.
type request struct {
	m         *Middleware
	rt        *route
	w         http.ResponseWriter
	r         *http.Request // as received; the handler gets a copy with the body re-readable
	keyValues []string      // the Idempotency-Key header as received (a copy)
	keyBuf    [1]string     // backs keyValues for the usual single header
	scope     string
	key       string
	fp        Fingerprint
	body      *[]byte // the request body, in a pooled buffer
	claim     RecordClaimParams
	ex        execution
	// detachedCtx is the context of store calls that must outlive the client.
	detachedCtx detachedCtx
	// firstCall is the context of the first claim, the only store call of most
	// requests; later calls make their own.
	firstCall     callCtx
	firstCallUsed bool
}

func (m *Middleware) serve(rt *route, next http.Handler, w http.ResponseWriter, r *http.Request) {
	values := r.Header.Values("Idempotency-Key")
	q := m.cfg.requirement(rt.requirement, r.Method)
	if q == KeyOff || (q == KeyOptional && len(values) == 0) {
		next.ServeHTTP(w, r)
		return
	}
	x := &request{m: m, rt: rt, w: w, r: r, detachedCtx: detachedCtx{r.Context()}}
	if len(values) > 0 {
		// A copy, so that the response's header never aliases the request's.
		if len(values) == 1 {
			x.keyBuf[0] = values[0]
			values = x.keyBuf[:1:1]
		} else {
			values = slices.Clone(values)
		}
		w.Header()["Idempotency-Key"] = values
	}
	key, err := ParseKey(values, m.cfg.MinKeyLength)
	if err != nil {
		m.refuseKey(w, r, err)
		return
	}
	scope, err := m.cfg.Scope(r)
	if err != nil || scope == "" {
		m.WriteError(w, r, CodeScopeRequired, "")
		return
	}
	x.keyValues, x.scope, x.key = values, scope, key
	if !x.readBody(r) {
		return
	}
	defer putBody(x.body)
	x.fp = FingerprintRequest(r, *x.body)
	x.run(next)
}

func (m *Middleware) refuseKey(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, ErrKeyRequired) {
		m.WriteError(w, r, CodeKeyRequired, "")
		return
	}
	// ParseKey's errors say what is wrong and never contain the key.
	m.WriteError(w, r, CodeKeyInvalid, "The Idempotency-Key header is invalid: "+
		strings.TrimPrefix(err.Error(), ErrKeyInvalid.Error()+": ")+".")
}

// attrs are the attributes of every log line about the request, then extra: a hash of
// the key, never the key itself. They are built only when a line is logged.
func (x *request) attrs(extra ...any) []any {
	return append([]any{slog.String("key_hash", keyHash(x.scope, x.key)),
		slog.String("method", x.r.Method), slog.String("path", x.r.URL.Path)}, extra...)
}

// keyHash identifies a key in logs without revealing it.
func keyHash(scope, key string) string {
	sum := sha256.Sum256([]byte(scope + "\x00" + key))
	return hex.EncodeToString(sum[:6])
}

// bodyPool holds request body buffers. Buffers that grew past maxPooledBody are left
// to the garbage collector, so that one large body does not pin memory.
var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledBody = 64 << 10

// minBodyGrowth is the least a body buffer grows by once its bytes fill it.
const minBodyGrowth = 8 << 10

func putBody(b *[]byte) {
	if cap(*b) <= maxPooledBody {
		*b = (*b)[:0]
		bodyPool.Put(b)
	}
}

// readBody reads the request body within Config.MaxBodyBytes (SPEC §4) into a pooled
// buffer, x.body. It answers the request itself and returns false when the body is
// refused.
func (x *request) readBody(r *http.Request) bool {
	limit := x.m.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		x.m.WriteError(x.w, r, CodeBodyTooLarge, "")
		return false
	}
	x.body = bodyPool.Get().(*[]byte)
	if r.Body == nil || r.Body == http.NoBody {
		return true
	}
	buf, err := readLimited(*x.body, r.Body, r.ContentLength, limit)
	*x.body = buf
	if err == nil {
		return true
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		// The rest of the body is unread: the connection cannot be reused.
		x.w.Header().Set("Connection", "close")
		x.m.WriteError(x.w, r, CodeBodyTooLarge, "")
	default:
		x.m.cfg.Logger.InfoContext(r.Context(), "idem: reading the request body failed", x.attrs(slog.Any("error", err))...)
		x.m.WriteError(x.w, r, CodeBodyUnreadable, "")
	}
	putBody(x.body)
	return false
}

// readLimited appends rd's content to buf and fails with an *http.MaxBytesError once
// it exceeds limit. size is the declared length, or -1.
//
// The buffer grows with the bytes that arrive, at most doubling, never to what size
// announces before the bytes are there: a client that announces 1 MiB and sends
// nothing holds no more than the pooled buffer (SPEC §15). size only caps the growth,
// so that a body of the announced length ends in a buffer of size+1 (+1: reading EOF
// needs no growth).
func readLimited(buf []byte, rd io.Reader, size, limit int64) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = grow(buf, size)
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			return buf, &http.MaxBytesError{Limit: limit}
		}
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// grow returns full with room for more: twice its capacity (at least minBodyGrowth,
// about what net/http already buffers per connection), but no more than the announced
// size+1 while the body is within it.
func grow(full []byte, size int64) []byte {
	c := max(2*cap(full), minBodyGrowth)
	if size >= 0 && int64(len(full)) < size+1 && int64(c) > size+1 {
		c = int(size + 1)
	}
	return append(make([]byte, 0, c), full...)
}

// newTokens returns a fresh lock token and record id: 16 random bytes each, in hex,
// from one read of crypto/rand and in one string.
func newTokens() (token, id string) {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	var h [64]byte
	hex.Encode(h[:], b[:])
	s := string(h[:])
	return s[:32], s[32:]
}

// run claims the key and acts on the outcome: execute, replay, or a §9 error.
func (x *request) run(next http.Handler) {
	m, ctx := x.m, x.r.Context()
	if m.cache != nil {
		if resp, ok := m.cache.get(x.scope, x.key, x.fp, m.localNow()); ok {
			x.replay(resp)
			return
		}
	}
	if x.rt.claimInHandler && x.executeClaimingInHandler(next) {
		return
	}
	// waitUntil is set when the key is first found in flight; every store call after
	// that ends by waitUntil + StoreTimeout (stopAt).
	var waitUntil, stopAt time.Time
	backoff := waitPollMin
	for {
		token, id := newTokens()
		started, startedReal := m.localNow(), time.Now()
		x.claim = RecordClaimParams{
			Scope: x.scope, Key: x.key, Fingerprint: x.fp, Token: token, RecordID: id,
			Lease: m.cfg.Lease, TTL: x.rt.ttl, Now: m.storeNow(),
		}
		res, err := x.claimKey(ctx, stopAt)
		if err != nil {
			x.storeUnavailable(ctx, "claim", err)
			return
		}
		switch res.Outcome {
		case ClaimAcquired:
			if res.TookOver {
				m.cfg.Logger.InfoContext(ctx, "idem: took over a key whose holder's lease lapsed; executing again", x.attrs()...)
			}
			x.execute(next, token, started, startedReal, res.Record)
			return
		case ClaimCompleted:
			x.cacheRecord(res.Record)
			x.replay(res.Record.Response)
			return
		case ClaimMismatch:
			m.WriteError(x.w, x.r, CodeKeyReused, "")
			return
		}
		if waitUntil.IsZero() {
			waitUntil = time.Now().Add(m.cfg.InFlightWait)
			stopAt = waitUntil.Add(m.cfg.StoreTimeout)
		}
		rec, again, err := x.await(ctx, waitUntil, stopAt, &backoff)
		switch {
		case err != nil:
			x.storeUnavailable(ctx, "wait", err)
			return
		case rec != nil && !x.fp.Matches(rec.Fingerprint):
			m.WriteError(x.w, x.r, CodeKeyReused, "")
			return
		case rec != nil:
			x.cacheRecord(rec)
			x.replay(rec.Response)
			return
		case !again:
			m.WriteError(x.w, x.r, CodeRequestInProgress, "")
			return
		}
	}
}

// claimKey runs the claim x.claim under StoreTimeout, ending by stopAt at the latest
// when that is set (SPEC §9, bounded time).
func (x *request) claimKey(ctx context.Context, stopAt time.Time) (*RecordClaimResult, error) {
	deadline := callDeadline(x.m.cfg.StoreTimeout, stopAt)
	if !x.firstCallUsed {
		x.firstCallUsed = true
		x.firstCall.start(ctx, deadline)
		defer x.firstCall.stop()
		return x.m.cfg.Store.RecordClaim(&x.firstCall, &x.claim)
	}
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return x.m.cfg.Store.RecordClaim(cctx, &x.claim)
}

// callDeadline is the deadline of a store call starting now: timeout away, or stopAt
// when that is earlier.
func callDeadline(timeout time.Duration, stopAt time.Time) time.Time {
	d := time.Now().Add(timeout)
	if !stopAt.IsZero() && stopAt.Before(d) {
		return stopAt
	}
	return d
}

// Backoff of a duplicate polling for the first request's outcome.
const (
	waitPollMin = 5 * time.Millisecond
	waitPollMax = 200 * time.Millisecond
)

// await polls the record of an in-flight request until it completes (rec), goes away
// or its lease lapses (again: claim once more), or until the wait ends (neither). Each
// poll runs under StoreTimeout and ends by stopAt. The backoff carries over between
// calls of one request, so that a lease that looks lapsed to this host but not to the
// store does not make it claim in a tight loop.
func (x *request) await(ctx context.Context, until, stopAt time.Time, backoff *time.Duration) (rec *Record, again bool, err error) {
	if time.Until(until) <= 0 {
		return nil, false, nil
	}
	if x.m.hooks.waiting != nil && *backoff == waitPollMin {
		x.m.hooks.waiting()
	}
	for {
		left := time.Until(until)
		if left <= 0 {
			return nil, false, nil
		}
		t := time.NewTimer(min(*backoff, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, false, ctx.Err()
		case <-t.C:
		}
		*backoff = min(2**backoff, waitPollMax)
		rec, err := x.poll(ctx, stopAt)
		switch {
		case errors.Is(err, ErrNotFound):
			return nil, true, nil
		case err != nil:
			return nil, false, err
		case rec.State == StateCompleted:
			return rec, false, nil
		case !x.m.localNow().Before(rec.LeaseEnd):
			// Perhaps lapsed; the claim asks the store's clock.
			return nil, true, nil
		}
	}
}

// poll reads the record of an in-flight request under StoreTimeout, ending by stopAt.
func (x *request) poll(ctx context.Context, stopAt time.Time) (*Record, error) {
	ctx, cancel := context.WithDeadline(ctx, callDeadline(x.m.cfg.StoreTimeout, stopAt))
	defer cancel()
	return x.m.cfg.Store.RecordGet(ctx, &RecordGetParams{Scope: x.scope, Key: x.key, Now: x.m.storeNow()})
}

// cacheRecord puts a completed record read from the store in the replay cache, when
// there is one. The record is the caller's own copy (Store contract), so its response
// is kept as is.
func (x *request) cacheRecord(rec *Record) {
	if x.m.cache == nil || rec == nil || rec.State != StateCompleted {
		return
	}
	x.m.cache.put(x.scope, x.key, rec.Fingerprint, rec.Response, rec.ExpiresAt, x.m.localNow())
}

// cacheCompleted puts the response this process just stored in the replay cache, when
// there is one: it expires at the claimed record's created_at + TTL (SPEC §8).
func (ex *execution) cacheCompleted(resp *Response) {
	m := ex.m
	if m.cache == nil || ex.claimed == nil {
		return
	}
	expires := CompletedExpiresAt(ex.claimed.CreatedAt, ex.rt.ttl)
	m.cache.put(ex.scope, ex.key, ex.claimed.Fingerprint, cloneResponse(resp), expires, m.localNow())
}

// replay answers with a stored response (SPEC §5.4).
func (x *request) replay(resp *Response) {
	if resp == nil || resp.NotStored {
		x.m.WriteError(x.w, x.r, CodeResponseNotStored, "")
		return
	}
	// The stored values are copied, all into one array: resp may be shared (the
	// replay cache), and whoever holds the response's header may change it.
	h := x.w.Header()
	n := 1
	for _, v := range resp.Header {
		n += len(v)
	}
	all := make([]string, 0, n)
	for k, v := range resp.Header {
		all = append(all, v...)
		h[k] = all[len(all)-len(v) : len(all) : len(all)]
	}
	all = append(all, "true")
	h["Idempotent-Replayed"] = all[len(all)-1:]
	x.w.WriteHeader(resp.Status)
	if x.r.Method != http.MethodHead && bodyAllowed(resp.Status) {
		_, _ = x.w.Write(resp.Body)
	}
}

// storeUnavailable answers 503 store_unavailable after a store error (SPEC §9): the
// request fails closed and the process keeps serving.
func (x *request) storeUnavailable(ctx context.Context, op string, err error) {
	level := slog.LevelError
	if ctx.Err() != nil {
		level = slog.LevelInfo // the client went away; the store may be fine
	}
	x.m.cfg.Logger.Log(ctx, level, "idem: store "+op+" failed", x.attrs(slog.Any("error", err))...)
	x.m.WriteError(x.w, x.r, CodeStoreUnavailable, "")
}

// storeCtx is the context of the completion or release after the handler ran: they
// must happen even when the client went away, within a bound.
func (x *request) storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(x.detached(), x.m.cfg.Lease)
}

// detached returns the request's context without its cancellation, as
// context.WithoutCancel does, but without an allocation: it lives in the request.
func (x *request) detached() context.Context { return &x.detachedCtx }

// execution is the run of the handler by the request that acquired the key. It lives
// in its request, and holds what the handler's run needs, so that a run costs few
// allocations.
type execution struct {
	*request
	token   string
	claimed *Record // the record as the claim returned it
	handle  *Handle // &handleVal
	capture *capture
	hb      heartbeat
	// hctx is the handler's context: it carries the handle without a
	// context.WithValue.
	hctx       handleCtx
	handleVal  Handle
	complete   RecordCompleteParams
	bodyReader bodyReader

	mu      sync.Mutex
	decided bool                  // the response is frozen and the policy applied
	store   bool                  // the decision: store (true) or release
	params  *RecordCompleteParams // the completion, when store
}

// execute runs the handler under the claim held by token (SPEC §5–§7).
func (x *request) execute(next http.Handler, token string, claimStarted, claimStartedReal time.Time, claimed *Record) {
	m := x.m
	// The handler's context does not end when the client goes away: the operation runs
	// to its outcome, which is stored, so the client's retry gets a replay rather than
	// a key stuck in flight or half-done work to redo. It ends only with the lease
	// (cause ErrLeaseLost).
	ctx, cancel := context.WithCancelCause(x.detached())
	defer cancel(nil)
	ex := &x.ex
	ex.request, ex.token, ex.claimed = x, token, claimed
	ex.handleVal.scope, ex.handleVal.key, ex.handleVal.prepare = x.scope, x.key, ex
	ex.handle = &ex.handleVal
	ex.hctx = handleCtx{Context: ctx, h: ex.handle}
	ex.capture = getCapture(x.w, x.keyValues, m.cfg.MaxResponseBytes)
	ex.hb.run = heartbeatRun{
		m:            m,
		x:            x,
		params:       RecordRenewParams{Scope: x.scope, Key: x.key, Token: token, Lease: m.cfg.Lease, TTL: x.rt.ttl},
		deadline:     claimStarted.Add(m.cfg.Lease),
		realDeadline: claimStartedReal.Add(m.cfg.Lease),
		cancel:       cancel,
	}
	m.startHeartbeat(&ex.hb)
	defer func() {
		if p := recover(); p != nil {
			ex.abort()
			panic(p) // http.ErrAbortHandler included: net/http handles it
		}
	}()
	next.ServeHTTP(ex.capture, x.handlerRequest(&ex.hctx))
	ex.finish()
	putCapture(ex.capture)
}

// handlerRequest returns the request the handler gets: a copy of the request with
// ctx, whose body reads the request body again (as often as GetBody is called).
func (x *request) handlerRequest(ctx context.Context) *http.Request {
	r := x.r.WithContext(ctx)
	body := *x.body
	r.ContentLength = int64(len(body))
	if len(body) == 0 {
		r.Body, r.GetBody = http.NoBody, noBody
		return r
	}
	x.ex.bodyReader.Reset(body)
	r.Body = &x.ex.bodyReader
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return r
}

func noBody() (io.ReadCloser, error) { return http.NoBody, nil }

// bodyReader reads the request body for the handler.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// handleCtx is the handler's context: ctx carrying the request's Handle, as
// NewContext would return it.
type handleCtx struct {
	context.Context
	h *Handle
}

func (c *handleCtx) Value(key any) any {
	if key == (handleKey{}) {
		return c.h
	}
	return c.Context.Value(key)
}

// prepareInTx implements Handle.PrepareCompletion. It is one-shot: a second
// transaction of the same handler commits as a plain one.
func (ex *execution) prepareInTx(override *bool) (*RecordCompleteParams, bool) {
	return ex.decide(override, true)
}

// decide stops the heartbeat, freezes the response and applies the store policy, once;
// later calls return the same decision (or nothing, for a §7 helper).
func (ex *execution) decide(override *bool, forTx bool) (*RecordCompleteParams, bool) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.decided {
		if forTx {
			return nil, false
		}
		return ex.params, ex.store
	}
	ex.decided = true
	ex.hb.stopAndWait()
	resp := ex.capture.freeze(ex.m.cfg.storedHeaders)
	ex.store = ex.rt.policy(resp.Status)
	if override != nil {
		ex.store = *override
	}
	if ex.store {
		ex.complete = RecordCompleteParams{
			Scope: ex.scope, Key: ex.key, Token: ex.token,
			Response: resp, TTL: ex.rt.ttl, Now: ex.m.storeNow(),
		}
		ex.params = &ex.complete
	}
	return ex.params, ex.store
}

// finish stores the response or releases the key, then sends the response (SPEC §6,
// §7). The client never gets a response whose completion is known to have failed.
func (ex *execution) finish() {
	ex.hb.stopAndWait()
	completed, failed := ex.handle.outcome()
	switch {
	case completed: // a §7 transaction committed the record with the application's writes
		ex.mu.Lock()
		params := ex.params
		ex.mu.Unlock()
		if params != nil {
			ex.cacheCompleted(params.Response)
		}
		ex.warnIfExpired()
		ex.capture.send()
		return
	case failed != nil: // ... or did not commit: neither effects nor record exist
		ex.m.cfg.Logger.WarnContext(ex.r.Context(), "idem: the completing transaction failed; answering 503",
			ex.attrs(slog.Any("error", failed))...)
		ex.release() // harmless if the commit happened after all: the record is completed
		ex.unavailable()
		return
	}
	params, store := ex.decide(ex.handle.storeOverride(), false)
	if !store {
		ex.release()
		if errors.Is(context.Cause(ex.hctx.Context), ErrLeaseLost) {
			// The handler gave up because its lease was lost (the store went away, or
			// another request took the key over): whatever it answered, the client is
			// told to retry, and the retry meets the key's real outcome (SPEC §5, §9).
			ex.m.cfg.Logger.WarnContext(ex.r.Context(), "idem: the handler answered after losing its lease; answering 503", ex.attrs()...)
			ex.unavailable()
			return
		}
		ex.capture.send()
		return
	}
	ctx, cancel := ex.storeCtx()
	err := ex.m.cfg.Store.RecordComplete(ctx, params)
	cancel()
	switch {
	case err == nil:
		ex.cacheCompleted(params.Response)
		ex.warnIfExpired()
		ex.capture.send()
	case errors.Is(err, ErrLeaseLost):
		// Another request took the key over and executes (or executed) the operation;
		// the client's retry gets its outcome.
		ex.m.cfg.Logger.WarnContext(ex.r.Context(), "idem: lease lost before the response was stored; answering 503", ex.attrs()...)
		ex.unavailable()
	default:
		// The operation's effects happened: the client gets its response, and the key
		// frees when the lease lapses. A 503 would make the client retry and execute
		// the operation a second time.
		ex.m.cfg.Logger.ErrorContext(ex.r.Context(), "idem: storing the response failed; sending it unstored",
			ex.attrs(slog.Any("error", err))...)
		ex.capture.send()
	}
}

// warnIfExpired logs a record completed after its TTL ran out: it counts as absent
// already, so a retry executes the operation again (SPEC §8). The handler ran longer
// than the TTL; the route's TTL should be longer than its slowest handler.
func (ex *execution) warnIfExpired() {
	if ex.claimed == nil || ex.m.localNow().Before(CompletedExpiresAt(ex.claimed.CreatedAt, ex.rt.ttl)) {
		return
	}
	ex.m.cfg.Logger.WarnContext(ex.r.Context(), "idem: record completed after its TTL: it is expired already, and a retry executes again; make the TTL longer than the handler runs",
		ex.attrs(slog.Duration("ttl", ex.rt.ttl))...)
}

// abort releases the key after a handler panic, unless a §7 transaction completed it.
// The capture is not pooled again: the panic may have left it in use.
func (ex *execution) abort() {
	ex.mu.Lock()
	ex.decided = true // a Handle kept past the handler finds nothing more to complete
	ex.mu.Unlock()
	ex.hb.stopAndWait()
	if completed, _ := ex.handle.outcome(); !completed {
		ex.release()
	}
}

// release deletes the in-flight record so that a retry executes afresh. A failure is
// only logged: the key frees when the lease lapses.
func (ex *execution) release() {
	ctx, cancel := ex.storeCtx()
	defer cancel()
	err := ex.m.cfg.Store.RecordRelease(ctx, &RecordReleaseParams{Scope: ex.scope, Key: ex.key, Token: ex.token})
	switch {
	case errors.Is(err, ErrLeaseLost):
		ex.m.cfg.Logger.DebugContext(ctx, "idem: release found the key no longer held", ex.attrs()...)
	case err != nil:
		ex.m.cfg.Logger.WarnContext(ctx, "idem: releasing the key failed; it frees when the lease lapses",
			ex.attrs(slog.Any("error", err))...)
	}
}

// unavailable answers 503 store_unavailable instead of the handler's response, unless
// the handler already streamed it.
func (ex *execution) unavailable() {
	if ex.capture.passThrough {
		ex.m.cfg.Logger.ErrorContext(ex.r.Context(), "idem: the response was already streamed; cannot answer 503", ex.attrs()...)
		return
	}
	ex.m.WriteError(ex.w, ex.r, CodeStoreUnavailable, "")
}
