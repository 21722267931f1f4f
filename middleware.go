package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
)

// Middleware is the net/http middleware that makes keyed requests idempotent (SPEC
// §2–§9). Build one with [New] and wrap handlers with [Middleware.Handler], or with
// [Middleware.Route] for per-route options. It belongs inside the authentication
// middleware (the Scope function reads the principal) and inside any compression
// middleware. It is safe for concurrent use.
//
// It is the HTTP adapter of a [Guard] (SPEC §16): for a keyed request it parses the
// key, refuses an unauthenticated request, reads and fingerprints the body, and
// begins the guard's claim of (scope, key). The request that acquires the key runs the
// handler, with the body re-readable and the [Handle] in its context, while the
// guard's heartbeat renews the lease; the response is captured, then stored or the key
// released (SPEC §6), and only then sent. Duplicates get the stored response with
// "Idempotent-Replayed: true", or a §9 error.
//
// When the store fails to complete the record after the handler ran (other than by
// losing the lease), the client still gets the handler's response: its effects
// happened, and a 503 would make the client retry and execute the operation again once
// the lease lapses. The failure is logged at error level.
//
// The handler's context does not end when the client goes away (it disconnects, or
// its own timeout fires): the operation runs to its outcome, which is stored, so that
// the client's retry gets that outcome (409 request_in_progress while it still runs)
// rather than half-done work to resume. It ends only when the lease is lost (cause
// [ErrLeaseLost]). A handler has nothing to do about a departed client; it should
// bound its outside calls (client.Transport's AttemptTimeout, a context deadline), so
// that the operation ends in bounded time whoever waits for it.
type Middleware struct {
	cfg *config
	g   *Guard
	// unnamed warns, once, of keyed requests whose route has no name while an
	// Observer labels its events with it.
	unnamed sync.Once
}

// route is a RouteOptions resolved against the Config.
type route struct {
	m           *Middleware
	requirement Requirement
	ttl         time.Duration
	policy      func(status int) bool
	name        string
	keyHeader   string // canonical
	fingerprint FingerprintFunc
	errorWriter ErrorWriter
	// claimInHandler is RouteOptions.ClaimInHandler; retries says whether its requests
	// read their key before the handler.
	claimInHandler bool
	retries        retryRate
	// local is what this process knows of a route's keys (localkeys.go): on a
	// ClaimInHandler route, which keys run and were recorded here; on a lease route,
	// which were recorded here.
	local localKeys
	// onLapse is RouteOptions.OnLapse (SPEC §5.3, §13).
	onLapse LapsePolicy
	// noStoreBody is RouteOptions.NoStoreBody (SPEC §19).
	noStoreBody bool
}

// New returns a Middleware for cfg. It panics with a message naming the field when cfg
// is invalid (a programmer's mistake): "idem: Config.Scope is required".
func New(cfg Config) *Middleware {
	c, g := newConfig(cfg)
	return &Middleware{cfg: c, g: g}
}

// Guard returns the [Guard] the middleware runs on: the same store, lease, replay
// cache and clock, for adapters and functions ([Do]) that share them.
func (m *Middleware) Guard() *Guard { return m.g }

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
	if !opts.OnLapse.Valid() {
		panic(fmt.Sprintf("idem: RouteOptions.OnLapse is not a known policy: %v", opts.OnLapse))
	}
	if opts.ClaimInHandler && !m.g.cfg.Store.Capabilities().Transactions {
		panic("idem: RouteOptions.ClaimInHandler needs a store whose package claims the key in the handler's transaction " +
			"(store/sqlite's or store/postgres's Respond); this store has none (Capabilities.Transactions is false): " +
			"mount the route without ClaimInHandler (with Redis, answer through backstop's Respond)")
	}
	ttl := m.g.callTTL(opts.TTL, "RouteOptions.TTL")
	if opts.Resume != nil {
		if opts.Name == "" {
			panic("idem: RouteOptions.Resume needs a RouteOptions.Name to register it under")
		}
		m.g.registerResume(opts.Name, opts.Resume, ttl, "RouteOptions.Resume")
	}
	rt := &route{m: m, requirement: opts.Requirement, ttl: ttl,
		policy: opts.StorePolicy, claimInHandler: opts.ClaimInHandler, name: opts.Name, onLapse: opts.OnLapse, noStoreBody: opts.NoStoreBody,
		keyHeader: m.cfg.KeyHeader, fingerprint: opts.Fingerprint, errorWriter: opts.ErrorWriter}
	if opts.KeyHeader != "" {
		rt.keyHeader = canonicalKeyHeader("RouteOptions.KeyHeader", opts.KeyHeader)
	}
	if rt.policy == nil {
		rt.policy = m.cfg.StorePolicy
	}
	if rt.fingerprint == nil {
		rt.fingerprint = m.cfg.Fingerprint
	}
	if rt.errorWriter == nil {
		rt.errorWriter = m.cfg.ErrorWriter
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(rt, next, w, r)
		})
	}
}

// WriteError writes the idem error code with the middleware's ErrorWriter (by default
// in its profile's shape with its problem type base, as [WriteError] does), after
// setting Retry-After for request_in_progress and store_unavailable.
func (m *Middleware) WriteError(w http.ResponseWriter, r *http.Request, code string, detail string) {
	m.writeError(m.cfg.ErrorWriter, w, r, code, detail)
}

func (m *Middleware) writeError(write ErrorWriter, w http.ResponseWriter, r *http.Request, code string, detail string) {
	if retryable(code) && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", m.cfg.retryAfter())
	}
	write(w, r, &Problem{Status: m.cfg.Profile.Status(code), Code: code, Detail: detail})
}

// writeError answers the request with the route's ErrorWriter.
func (x *request) writeError(code string, detail string) {
	x.rt.m.writeError(x.rt.errorWriter, x.w, x.r, code, detail)
}

// CleanerConfig returns a [CleanerConfig] with the middleware's Retention, Logger and
// Clock, for a [Cleaner] of the same store.
func (m *Middleware) CleanerConfig() CleanerConfig {
	return CleanerConfig{Retention: m.cfg.Retention, Logger: m.cfg.Logger, Clock: m.cfg.Clock}
}

// request is one keyed request on its way through the middleware. It is one
// allocation: the guard's Handle, when the request acquires the key, lives in it too.
type request struct {
	rt *route // and its middleware, rt.m
	w  http.ResponseWriter
	r  *http.Request // as received; the handler gets a copy with the body re-readable
	// keyBuf is the key header as received (a copy): one value, as ParseKey accepts
	// no other number of them; keyValues returns it as the header's values.
	keyBuf [1]string
	body   *[]byte // the request body, in a pooled buffer
	// h is the claim; capture records what the handler writes, and is the Responder
	// that supplies the response the claim stores.
	h       Handle
	capture *capture
	// keyFound says that a ClaimInHandler route's request found its key recorded
	// already, for the route's retryRate.
	keyFound bool
}

func (m *Middleware) serve(rt *route, next http.Handler, w http.ResponseWriter, r *http.Request) {
	values := r.Header[rt.keyHeader]
	q := m.cfg.requirement(rt.requirement, r.Method)
	if q == KeyOff || (q == KeyOptional && len(values) == 0) {
		if !safeMethod(r.Method) {
			// Its SPEC §7 transactions run plain, on purpose (WithoutKey).
			r = r.WithContext(withoutKeyFor(r.Context(), w))
		}
		next.ServeHTTP(w, r)
		return
	}
	x := &request{rt: rt, w: w, r: r}
	if len(values) > 0 {
		// A copy, so that the response's header never aliases the request's.
		if len(values) == 1 {
			x.keyBuf[0] = values[0]
			values = x.keyBuf[:1:1]
		} else {
			values = slices.Clone(values)
		}
		w.Header()[rt.keyHeader] = values
	}
	key, err := ParseKey(values, m.cfg.MinKeyLength)
	if err != nil {
		x.refuseKey(err)
		return
	}
	scope, err := m.cfg.Scope(r)
	if err != nil || scope == "" || scope == idemstore.ReservedScope {
		x.writeError(CodeScopeRequired, "")
		return
	}
	x.h.init(m.g, r.Context(), scope, key, Fingerprint{}, rt.ttl)
	x.h.describer, x.h.managed, x.h.route, x.h.operation, x.h.claim.OnLapse = x, true, rt.name, rt.name, rt.onLapse
	if rt.name == "" {
		x.h.route = r.Pattern
		if r.Pattern == "" && m.cfg.Observer != nil {
			m.unnamed.Do(func() {
				m.cfg.Logger.WarnContext(r.Context(), "idem: keyed requests reach the middleware without a route name, so the Observer's "+
					"metrics and spans label them route=\"\": mount it after the router matched the route (a ServeMux pattern; chi's "+
					"r.With or a Group's Use; gin and echo: an adapter that sets Request.Pattern, as in examples/), or name the "+
					"route with RouteOptions.Name", "method", r.Method, "path", r.URL.Path)
			})
		}
	}
	if !x.readBody(r) {
		return
	}
	defer putBody(x.body)
	x.h.claim.Fingerprint = m.g.keyed(rt.fingerprint(r, *x.body))
	x.run(next)
}

// safeMethod reports whether method is one of RFC 9110's safe methods, whose
// handlers write nothing: the middleware does not mark their requests WithoutKey.
func safeMethod(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// keyValues are the values of the key header as received, once ParseKey accepted them.
func (x *request) keyValues() []string { return x.keyBuf[:] }

func (x *request) refuseKey(err error) {
	name := x.rt.keyHeader
	if errors.Is(err, ErrKeyRequired) {
		detail := ""
		if name != DefaultKeyHeader {
			detail = "An " + name + " header is required for this request."
		}
		x.writeError(CodeKeyRequired, detail)
		return
	}
	// ParseKey's errors say what is wrong and never contain the key.
	x.writeError(CodeKeyInvalid, "The "+name+" header is invalid: "+
		strings.TrimPrefix(err.Error(), ErrKeyInvalid.Error()+": ")+".")
}

// attrs are the attributes of every log line about the request, then extra: a hash of
// the key, never the key itself. They are built only when a line is logged.
func (x *request) attrs(extra ...any) []any {
	return append([]any{slog.String("key_hash", keyHash(x.h.scope, x.h.key)),
		slog.String("method", x.r.Method), slog.String("path", x.r.URL.Path)}, extra...)
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
	limit := x.rt.m.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		x.writeError(CodeBodyTooLarge, "")
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
		x.writeError(CodeBodyTooLarge, "")
	default:
		x.rt.m.cfg.Logger.InfoContext(r.Context(), "idem: reading the request body failed", x.attrs(slog.Any("error", err))...)
		x.writeError(CodeBodyUnreadable, "")
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

// run claims the key through the guard and acts on the outcome: execute, replay, or a
// §9 error.
func (x *request) run(next http.Handler) {
	g, h := x.rt.m.g, &x.h
	if resp, err := g.cached(h); resp != nil || err != nil {
		// A cached replay found its key recorded, as a read would have: the route's
		// rate of retries counts it (issue 28).
		x.rt.retries.observe(true)
		x.answer(resp, err)
		return
	}
	if resp, err := g.admit(x.r.Context(), h); resp != nil || err != nil {
		x.answer(resp, err)
		return
	}
	defer h.leaveQuota()
	if x.rt.claimInHandler {
		x.runClaimingInHandler(next)
		return
	}
	x.runLease(next)
}

// runLease claims a lease route's key and runs the handler under the lease. While the
// route's requests often find their key recorded (retryRate, as on a ClaimInHandler
// route), a plain primary-key read of the key comes first (Handle.lookup): a replay is
// then that read, not the claim statement, which costs more on PostgreSQL (issue 31);
// a key without a completed record is then claimed as usual, one round trip more. A
// route that mostly sees new keys claims at once.
func (x *request) runLease(next http.Handler) {
	rt, g, h := x.rt, x.rt.m.g, &x.h
	ctx := x.r.Context()
	var first *idemstore.ClaimResult
	found := false
	if rt.retries.readFirst() {
		res, ok, err := h.lookup(ctx)
		if err != nil {
			h.observeClaim(observe.OutcomeStoreError, false, time.Now(), err)
			x.answer(nil, g.storeError(ctx, h, "lookup", err))
			return
		}
		first, found = res, ok
	}
	// A key that the read did not find, or that a route of new keys did not read, is
	// most likely new, unless this process recorded it lately: the store may claim it
	// by its insert alone.
	k := cacheKey{h.scope, h.key}
	h.likelyNew = !found && !rt.local.recorded(k)
	defer rt.local.note(k)
	resp, err := g.claimFrom(ctx, h, first)
	var storeErr *StoreError
	rt.retries.observe(found || resp != nil || h.tookOver || (err != nil && !errors.As(err, &storeErr)))
	if resp != nil || err != nil {
		x.answer(resp, err)
		return
	}
	x.execute(next)
}

// answer sends a replay, or the §9 error of a claim that did not acquire the key.
func (x *request) answer(resp *Response, err error) {
	switch {
	case err == nil:
		x.replay(resp)
	case errors.Is(err, ErrKeyReused):
		x.writeError(CodeKeyReused, "")
	case errors.Is(err, ErrResponseNotStored):
		x.writeError(CodeResponseNotStored, "")
	case errors.Is(err, ErrOutcomeUnknown):
		x.writeError(CodeOutcomeUnknown, "")
	case errors.Is(err, ErrRecordUnreadable):
		x.writeError(CodeRecordUnreadable, "")
	case errors.Is(err, ErrKeyInProgress):
		x.writeError(CodeRequestInProgress, "")
	case errors.Is(err, ErrQuotaExceeded):
		var qerr *QuotaError
		if errors.As(err, &qerr) {
			x.w.Header().Set("Retry-After", strconv.FormatInt(int64(max((qerr.RetryAfter+time.Second-1)/time.Second, 1)), 10))
		}
		x.writeError(CodeQuotaExceeded, "")
	default: // the guard logged the store's error (SPEC §9: fail closed)
		x.writeError(CodeStoreUnavailable, "")
	}
}

// replay answers with a stored response (SPEC §5.4).
func (x *request) replay(resp *Response) {
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

// execute runs the handler under the acquired claim (SPEC §5–§7).
func (x *request) execute(next http.Handler) {
	h := &x.h
	// The handler's context does not end when the client goes away: the operation runs
	// to its outcome, which is stored, so the client's retry gets a replay rather than
	// a key stuck in flight or half-done work to redo. It ends only with the lease
	// (cause ErrLeaseLost).
	x.capture = getCapture(x.w, x.rt.keyHeader, x.keyValues(), x.rt.m.cfg.MaxResponseBytes)
	h.responder = x
	h.start(&h.detached)
	defer h.cancel(nil)
	defer func() {
		if p := recover(); p != nil {
			// The capture is not pooled again: the panic may have left it in use.
			h.abort()
			panic(p) // http.ErrAbortHandler included: net/http handles it
		}
	}()
	next.ServeHTTP(x.capture, x.handlerRequest(h.Context()))
	x.reportLateWrites()
	x.finish()
	putCapture(x.capture)
}

// empty reports whether the handler has written no response yet (the Handle's
// emptiness check before a SPEC §7 completion).
func (x *request) empty() bool { return x.capture.empty() }

// refuseWrites makes the handler's writes fail from now on, without a log line of
// their own: the middleware answers 500 for a mistake already logged.
func (x *request) refuseWrites() { x.capture.frozen, x.capture.answered = true, true }

// Response freezes the captured response for the claim's completion and applies the
// route's store policy (the Responder of the request's Handle).
func (x *request) Response() (*Response, bool) {
	resp := x.capture.freeze(x.rt.m.cfg.storedHeaders)
	store := x.rt.policy(resp.Status)
	if store && x.rt.noStoreBody && !resp.NotStored {
		// The outcome only: the client gets the capture as it is.
		resp = &Response{Status: resp.Status, NotStored: true}
	}
	return resp, store
}

// finish ends the claim, then sends the response (SPEC §6, §7). The client never gets
// a response whose completion is known to have failed.
func (x *request) finish() {
	h := &x.h
	end, err := h.finish()
	if x.capture.early {
		// The client was answered already (AnswerNow): the claim's end was for the
		// store, and the repeats of the key.
		return
	}
	switch end {
	case endStored, endUnstored, endUnknown:
		// Unstored: the operation's effects happened, and the client gets its
		// response (logged by the guard).
		x.capture.send()
	case endReleased:
		if h.leaseLost() {
			// The handler gave up because its lease was lost (the store went away, or
			// another request took the key over): whatever it answered, the client is
			// told to retry, and the retry meets the key's real outcome (SPEC §5, §9).
			x.rt.m.cfg.Logger.WarnContext(x.r.Context(), "idem: the handler answered after losing its lease; answering 503", x.attrs()...)
			x.unavailable()
			return
		}
		x.capture.send()
	default: // the §7 transaction failed, or the lease was lost before the completion
		if errors.Is(err, ErrNoResponse) {
			x.writeError(CodeInternalError, "") // logged by the handle
			return
		}
		x.unavailable()
	}
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
	x.capture.bodyReader.Reset(body)
	r.Body = &x.capture.bodyReader
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return r
}

func noBody() (io.ReadCloser, error) { return http.NoBody, nil }

// bodyReader reads the request body for the handler.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// unavailable answers 503 store_unavailable instead of the handler's response, unless
// the handler already streamed it.
func (x *request) unavailable() {
	if x.capture.passThrough {
		x.rt.m.cfg.Logger.ErrorContext(x.r.Context(), "idem: the response was already streamed; cannot answer 503", x.attrs()...)
		return
	}
	x.writeError(CodeStoreUnavailable, "")
}
