package proxy

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/logsummary"
	"github.com/idem-go/idem/seal"
	"golang.org/x/net/http2"
)

// Defaults of [Config].
const (
	// DefaultScopeHeader is the request header whose value, hashed, is the scope of a
	// key: the principal (SPEC §3).
	DefaultScopeHeader = "Authorization"
	// DefaultUpstreamKeyHeader is the header that carries the derived key to the
	// upstream.
	DefaultUpstreamKeyHeader = "Idempotency-Key"
	// DefaultMaxStoredBody is the largest response body stored; a larger one passes
	// through and releases the key.
	DefaultMaxStoredBody = idem.DefaultMaxResponseBytes
	// DefaultUpstreamTimeout is how long a client waits for the upstream's response
	// headers before it gets 504; a protected request's exchange goes on.
	DefaultUpstreamTimeout = 60 * time.Second
	// DefaultUpstreamWaitLimit bounds a protected request's whole exchange with the
	// upstream, its wait past UpstreamTimeout included; past it the outcome is unknown.
	DefaultUpstreamWaitLimit = 10 * time.Minute
	// DefaultMaxBufferedBodies bounds the bytes of the request bodies of protected
	// requests that the proxy holds at once, all connections together.
	DefaultMaxBufferedBodies = 64 << 20
	// DefaultUpstreamIdleTimeout is how long an idle connection to the upstream is
	// kept: less than Node.js's default keep-alive of 5 s, so that the proxy never
	// sends a request on a connection the upstream is closing.
	DefaultUpstreamIdleTimeout = 4 * time.Second
	// DefaultUpstreamResends bounds how often a protected request that the upstream
	// provably did not process is sent again (Config.UpstreamResends).
	DefaultUpstreamResends = 3
	// DefaultHealthTimeout bounds the checks of the health path.
	DefaultHealthTimeout = 2 * time.Second
	// DefaultAuthPrincipalHeader is the header of an auth endpoint's 2xx answer that
	// names the principal.
	DefaultAuthPrincipalHeader = "X-Principal"
	// DefaultAuthTimeout bounds a question to the auth endpoint, connecting included.
	DefaultAuthTimeout = 5 * time.Second
	// DefaultMinUploadRate is the least a protected request's body must arrive at,
	// in bytes per second over each UploadRateWindow, until it ends.
	DefaultMinUploadRate = 1 << 10
	// UploadRateWindow is the window over which MinUploadRate is measured: a body
	// must bring MinUploadRate × 10 s every 10 s until it ends.
	UploadRateWindow = 10 * time.Second
)

// DefaultAuthHeaders returns the request headers sent to the auth endpoint:
// Authorization and Cookie. It returns a new slice each time.
func DefaultAuthHeaders() []string { return []string{"Authorization", "Cookie"} }

// SharedScope is the scope of every record when [Config.SharedScope] is set.
const SharedScope = "shared"

// UpstreamKeyStep is the step whose derived key ([idem.Handle.DerivedKey]) the
// upstream receives: the same for every forward of one request, whether the record
// was taken over, released or lost (SPEC §17).
const UpstreamKeyStep = "upstream"

// The codes of the proxy's own errors, written in the middleware's profile with the
// seed type "api_error".
const (
	// CodeUpstreamUnavailable (502): the request provably never reached the upstream
	// (the connection could not be made, or failed before the request was written).
	// The key is released: a retry executes once, afresh.
	CodeUpstreamUnavailable = "upstream_unavailable"
	// CodeUpstreamTimeout (504, Retry-After): the upstream's response headers did not
	// come within Config.UpstreamTimeout. The upstream may have acted: a protected
	// request's record is kept while the proxy waits on (Config.UpstreamWaitLimit) and
	// stores the upstream's answer, which the retry gets.
	CodeUpstreamTimeout = "upstream_timeout"
	// CodeUpstreamReplyLost (502, Retry-After), under the policy take_over: the request
	// was written to the upstream and its reply was lost. The record is kept: the
	// retry is forwarded again under the same derived key. (Under the policy unknown
	// the answer is 500 outcome_unknown.)
	CodeUpstreamReplyLost = "upstream_reply_lost"
	// CodeMethodNotAllowed (405): a TRACE on a route of RequireKey, which the proxy
	// does not forward (Go's transport would re-send it by itself).
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeAuthUnavailable (503, Retry-After): the auth endpoint (Config.AuthURL) could
	// not be reached, did not answer within Config.AuthTimeout, or allowed the request
	// without naming its principal. Nothing was claimed, replayed or forwarded.
	CodeAuthUnavailable = "auth_unavailable"
	// CodeUploadTooSlow (408, Connection: close): a protected request's body arrived
	// slower than Config.MinUploadRate; nothing was claimed or forwarded.
	CodeUploadTooSlow = "upload_too_slow"
	// CodeProxyBusy (503, Retry-After): the request bodies the proxy holds at once
	// reached Config.MaxBufferedBodies; nothing was claimed or forwarded.
	CodeProxyBusy = "proxy_busy"
)

// DefaultMethods returns the methods whose keyed requests are protected by default:
// POST and PATCH. It returns a new slice each time.
func DefaultMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// Config configures a [Proxy]. Upstream and Idem.Store are required.
type Config struct {
	// Upstream is the base URL of the API behind the proxy: http or https, with a
	// host, optionally a path that prefixes every request's, no query. Required.
	Upstream *url.URL

	// Idem configures the middleware in front of the upstream: Store (required), TTL,
	// Lease, StoreTimeout, InFlightWait, ReplayCacheSize, Profile, KeyHeader,
	// MaxBodyBytes, StoredHeaders, Observer and so on, with the middleware's defaults.
	// The proxy sets Scope (from ScopeHeader), MaxResponseBytes (MaxStoredBody) and
	// Logger (when nil, Logger); Methods is unused: Methods and RequireKey below choose
	// the protected requests.
	Idem idem.Config

	// ScopeHeader names the request header whose value is the principal: the scope of
	// a key is the hex SHA-256 of its value (its values joined by a newline when it is
	// repeated), so that no token is stored or logged. A keyed request without it, or
	// whose every value is empty, is refused 401 scope_required. Defaults to
	// [DefaultScopeHeader].
	ScopeHeader string
	// ScopeCookie, when set, names the cookie whose value is the principal instead of
	// ScopeHeader: the scope is the hex SHA-256 of that one cookie's value, whatever
	// other cookies the request carries (an analytics cookie that changes is not a new
	// principal). A keyed request without it, with it empty, or with two of it, is
	// refused 401 scope_required. Defaults to "" (ScopeHeader).
	ScopeCookie string
	// SharedScope puts every record in one scope, [SharedScope], and ignores
	// ScopeHeader: for an upstream without principals, or one whose clients cannot
	// see each other's keys anyway. The bounds per principal of Idem
	// (MaxInFlightPerScope, MaxStoredBytesPerScope) are then off, since they would
	// bound every client together; the share of the body budget is per address.
	// Defaults to false.
	SharedScope bool

	// AuthURL, when set, is the forward authentication endpoint (nginx auth_request,
	// Traefik ForwardAuth, Envoy ext_authz): every keyed request of a protected route
	// is asked about, in a GET carrying its AuthHeaders and X-Forwarded-Method, -Uri,
	// -Host, -Proto and -For, before anything is claimed, replayed or buffered. A 2xx
	// answer names the principal in AuthPrincipalHeader, whose hex SHA-256 is the
	// scope (ScopeHeader, ScopeCookie and SharedScope are then unused); any other
	// answer goes to the client as it is (status, body up to 64 KiB, and its
	// Content-Type, Content-Language, WWW-Authenticate, Location, Set-Cookie,
	// Retry-After and Cache-Control); an endpoint that fails, or is slower than
	// AuthTimeout, gets the client 503 auth_unavailable with Retry-After. Revoked
	// credentials then get no replays, and a rotated credential keeps its principal's
	// keys. Requests without a key are not asked about: the upstream authenticates
	// them. Defaults to nil (no forward authentication).
	AuthURL *url.URL
	// AuthHeaders are the request headers sent to the auth endpoint. Defaults to
	// [DefaultAuthHeaders] (Authorization, Cookie).
	AuthHeaders []string
	// AuthPrincipalHeader is the header of the auth endpoint's 2xx answer that names
	// the principal; a 2xx without it is 503 auth_unavailable (logged at error level).
	// Defaults to [DefaultAuthPrincipalHeader] (X-Principal).
	AuthPrincipalHeader string
	// AuthTimeout bounds each question to the auth endpoint, connecting included.
	// Defaults to [DefaultAuthTimeout].
	AuthTimeout time.Duration
	// AuthTransport sends the questions to the auth endpoint. Defaults to an
	// http.Transport dialling within AuthTimeout.
	AuthTransport http.RoundTripper

	// Methods are the methods whose requests are protected when they carry a key; a
	// request of another method, or without a key, is forwarded untouched. An empty,
	// non-nil slice protects no method (only the RequireKey routes). Defaults to
	// [DefaultMethods] (POST, PATCH).
	Methods []string
	// RequireKey are net/http ServeMux patterns ("POST /v1/charges",
	// "POST /v1/orders/{id}/pay", "/v1/transfers/") of routes whose requests must carry
	// a key (400 key_required without one), whatever their method. A request matches a
	// pattern when its path does, or any of the variants that common routers send to
	// the same handler: letter case ignored, a trailing slash removed, ";params" of a
	// segment removed, %2F decoded (so that none sidesteps the key). Defaults to none.
	RequireKey []string
	// Routes are ServeMux patterns that name the protected requests in metrics and
	// logs (the RouteOptions.Name of the middleware, the route label): a protected
	// request is named by the first RequireKey or Routes pattern it matches, else by
	// its method. Defaults to none.
	Routes []string
	// NoStoreBody are ServeMux patterns, matched as RequireKey's are, of routes that
	// keep outcomes only (idem.RouteOptions.NoStoreBody, SPEC §19): a response to
	// store is recorded by its status alone, and its repeats get 409
	// response_not_stored, never a second execution. For routes whose responses mint
	// secrets (a card's token, an API key). Defaults to none.
	NoStoreBody []string

	// UpstreamKeyHeader names the header that carries the derived key to the upstream
	// (it replaces a header of that name that the client sent, such as the client's
	// own key under the default name). Defaults to [DefaultUpstreamKeyHeader].
	UpstreamKeyHeader string
	// OmitUpstreamKey sends the upstream no derived key. Defaults to false.
	OmitUpstreamKey bool

	// TakeOverOnLapse says what a retry does that finds its key's holder (a proxy that
	// died mid-forward) gone after its lease: when false, the default, it is answered
	// 500 outcome_unknown, stored, until an operator resolves the key (`idem keys
	// resolve`), since the upstream may or may not have acted ([idem.LapseUnknown]);
	// when true it forwards the request again under the same derived key
	// ([idem.LapseTakeOver]), which is safe only for an upstream that deduplicates by
	// that key.
	TakeOverOnLapse bool

	// MaxStoredBody is the largest response body stored. A response whose
	// Content-Length is larger passes through from its first byte, and one that grows
	// larger (a chunked one) passes through from then on; either releases the key.
	// Defaults to [DefaultMaxStoredBody].
	MaxStoredBody int64

	// UpstreamTimeout is how long a client waits for the upstream's response headers:
	// past it the client gets 504 upstream_timeout with Retry-After. An unprotected
	// request is then cancelled; a protected one's exchange goes on (the upstream may
	// have acted), its record in flight, until the upstream answers (its answer is
	// stored, and the retry gets it) or UpstreamWaitLimit passes. Defaults to
	// [DefaultUpstreamTimeout].
	UpstreamTimeout time.Duration
	// UpstreamWaitLimit bounds a protected request's whole exchange with the upstream,
	// headers and body: past it, or when the proxy shuts down while waiting past
	// UpstreamTimeout, the outcome is unknown (TakeOverOnLapse says what a retry
	// gets). It must not be shorter than UpstreamTimeout. Defaults to
	// [DefaultUpstreamWaitLimit].
	UpstreamWaitLimit time.Duration
	// MaxBufferedBodies bounds the bytes of request bodies that protected requests
	// hold at once, all connections together (each body is bounded by
	// Idem.MaxBodyBytes, and grows with the bytes received): a request whose body
	// would pass it gets 503 proxy_busy with Retry-After, claiming nothing. Defaults to
	// [DefaultMaxBufferedBodies].
	MaxBufferedBodies int64
	// MaxBufferedBodiesPerClient bounds the bytes of request bodies one client holds
	// at once, within MaxBufferedBodies: a client is a principal (the scope: the auth
	// endpoint's principal, the scope header's or cookie's value) and, apart, an
	// address (ClientAddressHeader, or the connection's peer), and a request is
	// charged to both; past either share it gets 503 proxy_busy, so that a flood from
	// one principal or one source leaves the others served. Behind a load balancer
	// every request comes from its address: set ClientAddressHeader, or raise this.
	// Defaults to a quarter of MaxBufferedBodies.
	MaxBufferedBodiesPerClient int64
	// ClientAddressHeader names the request header that carries the client's address,
	// as a load balancer in front of the proxy sets it: X-Forwarded-For (its last
	// address, the one the nearest proxy added) or a header of one address such as
	// X-Real-IP. Only the address a trusted proxy sets may be used: a client can send
	// any header. Defaults to "" (the connection's peer address).
	ClientAddressHeader string
	// MinUploadRate is the least rate, in bytes per second over each
	// [UploadRateWindow] (10 s), at which a protected request's body must arrive
	// until it ends: a slower one is cut off with 408 upload_too_slow (Connection:
	// close), nothing claimed, and its bytes leave the budget. Negative: no minimum.
	// Defaults to [DefaultMinUploadRate] (1 KiB/s: 10 KiB every 10 s).
	MinUploadRate int64
	// UpstreamIdleTimeout is how long an idle connection to the upstream is kept for
	// the next request; keep it below the upstream's own keep-alive timeout. Defaults
	// to [DefaultUpstreamIdleTimeout].
	UpstreamIdleTimeout time.Duration
	// UpstreamTLS configures TLS to an https upstream (its roots, a client
	// certificate for mutual TLS) for the default Transport (`idem proxy
	// --upstream-ca`, `--upstream-cert`, `--upstream-key`). Defaults to nil: the
	// system's roots (which SSL_CERT_FILE and SSL_CERT_DIR extend), no client
	// certificate.
	UpstreamTLS *tls.Config
	// UpstreamH2C speaks HTTP/2 without TLS (h2c, with prior knowledge) to an http
	// upstream, as gRPC gateways and some service meshes' sidecars expect, through the
	// default Transport. Defaults to false: HTTP/1.1 to an http upstream (and HTTP/2
	// or HTTP/1.1 to an https one, as TLS negotiates).
	UpstreamH2C bool
	// UpstreamResends bounds how often a protected request that the upstream provably
	// did not process is sent again, under the same derived key, by the default
	// Transport: an HTTP/2 stream the upstream refused (REFUSED_STREAM, RFC 9113
	// §8.7) or that a GOAWAY's last stream id left out (§6.8), or a request nothing of
	// which was written. Each is counted (Hooks.Resent) and logged; nothing else is
	// ever sent again. Negative: never. Defaults to [DefaultUpstreamResends].
	UpstreamResends int
	// NotForwardedHeader names a response header by which a trusted gateway between
	// the proxy and the application (nginx, HAProxy, Envoy: docs/proxy.md) says that
	// its 5xx answer never reached the application (it could not connect, had no live
	// server): such an answer releases the key, as a failure to connect does, instead
	// of keeping the record as unknown, and the header is not passed on. Set it only
	// to a header the gateway sets on exactly those answers. Defaults to "" (a
	// gateway's 502 and 504 are unknown).
	NotForwardedHeader string
	// Transport sends the requests to the upstream. Defaults to an http.Transport with
	// UpstreamWaitLimit as its ResponseHeaderTimeout, UpstreamIdleTimeout, up to 256
	// idle connections, no compression of its own and no proxy from the environment,
	// speaking HTTP/2 to an https upstream that negotiates it through
	// golang.org/x/net/http2 (or h2c, with UpstreamH2C). It must call the request's
	// httptrace.ClientTrace WroteHeaders hook (as http.Transport does): a protected
	// request whose exchange failed before it is taken never to have reached the
	// upstream. A Transport of one's own gets no re-send of UpstreamResends.
	Transport http.RoundTripper

	// Hooks, when set, are told of every upstream exchange and pass-through, for
	// metrics. Defaults to nil.
	Hooks *Hooks

	// AccessLog logs one line per request at info level to AccessLogger (never
	// summarised): method, route, status, outcome (forwarded, replayed, answered by
	// idem, not_sent, outcome_unknown, upstream_timeout), duration, bytes and the
	// key's short hash. Defaults to false.
	AccessLog bool
	// AccessLogger receives the access log's lines, at info level: give it a logger
	// that shows info when Logger shows only warnings (as `idem proxy` does at its
	// default --log-level info). Defaults to Logger.
	AccessLogger *slog.Logger

	// HealthPath, when set, is a path the proxy answers itself on GET and HEAD instead
	// of forwarding it: 200 when the store answers (and the upstream, with
	// UpstreamHealthPath), 503 otherwise, within [DefaultHealthTimeout]. Defaults to ""
	// (none; `idem proxy` sets /healthz).
	HealthPath string
	// UpstreamHealthPath, when set, is a path of the upstream that HealthPath also
	// GETs: it must answer 2xx or 3xx. Defaults to "" (the upstream is not checked).
	UpstreamHealthPath string

	// Logger receives the proxy's warnings (a response passed through unstored, a
	// failed upstream exchange, a keyed upgrade) and, unless Idem.Logger is set, the
	// middleware's. Keys appear as a short hash. A warning repeated within
	// [idem.DefaultLogSummaryInterval] is counted, not written again
	// ([idem.NewLogSummaryHandler]). Defaults to [slog.Default].
	Logger *slog.Logger
}

// Hooks are told what the proxy does with the upstream, for metrics (`idem proxy
// --metrics-addr`); a nil func is not called. They are called from the requests'
// goroutines and must not block.
type Hooks struct {
	// UpstreamResponse is told of each upstream response's headers: the request's
	// route (as [Proxy.Route] names it), the status and how long they took to come.
	UpstreamResponse func(route string, status int, took time.Duration)
	// PassThrough is told of a protected response that passes through as it comes:
	// "event_stream" (stored when it ends within MaxStoredBody), "trailers" or
	// "too_large" (completed as response_not_stored).
	PassThrough func(route, reason string)
	// UpstreamFailed is told of an upstream exchange that failed: "not_sent" (the key
	// is released), "unknown" (the request was written: the record is kept),
	// "timeout" (the client got 504 and the proxy waits on), "gateway" (the upstream
	// answered 502 or 504: the record is kept), "not_forwarded" (a gateway's 5xx
	// marked with NotForwardedHeader: the key is released), or, for a defect below the proxy,
	// "resend_refused" (the transport tried to send a written request again and was
	// stopped) or "resent" (it did: both keep the record, outcome unknown).
	UpstreamFailed func(route, outcome string)
	// AuthRefused is told of a keyed request the auth endpoint did not allow: its
	// status (503 when the endpoint could not be asked).
	AuthRefused func(route string, status int)
	// Resent is told of a protected request the proxy sent once more by its own
	// decision: "not_written" (nothing of it was written on a kept-alive connection
	// that turned out to be closed), or "not_processed" (the transport found that the
	// upstream did not process it: an HTTP/2 stream refused or left out by a GOAWAY).
	Resent func(route, reason string)
}

// Proxy is an http.Handler that forwards requests to the upstream, protecting keyed
// ones with idem's middleware. Build one with [New]; it is safe for concurrent use.
type Proxy struct {
	upstream          *url.URL
	rp                *httputil.ReverseProxy
	transport         http.RoundTripper
	store             idemstore.Store
	mw                *idem.Middleware // AnswerNow, TeeStream
	profile           idem.Profile
	keyHeader         string // canonical
	scopeHeader       string // canonical; "" for SharedScope
	upstreamKeyHeader string // canonical; "" with OmitUpstreamKey
	maxStored         int64
	upstreamTimeout   time.Duration
	waitLimit         time.Duration
	onLapse           idem.LapsePolicy
	scopeCookie       string
	seal              *seal.Keyring // Config.Idem.Seal: keys the scope
	hooks             Hooks
	budget            *bodyBudget
	auth              *authenticator // nil without AuthURL
	clientAddrHeader  string         // canonical; "" for the peer's address
	access            *slog.Logger   // the access log; nil without AccessLog
	healthPath        string
	upstreamHealth    string
	logger            *slog.Logger
	// ownTransport: transport is the default one, whose calls of GetBody say that the
	// upstream did not process a request (send.go); resends bounds the re-sends of
	// such requests; notForwarded is NotForwardedHeader, canonical ("" for none).
	ownTransport bool
	resends      int
	notForwarded string

	// forward forwards a request without the middleware; byMethod holds the
	// middleware's routes of the protected methods (key optional), required its routes
	// of RequireKey by pattern, and requiredMux matches the patterns (nil without), in
	// lower case (matchPattern); named and namedMux are the same for Routes, whose
	// routes are those of the protected methods under the pattern's name.
	forward     http.Handler
	byMethod    map[string]http.Handler
	required    map[string]http.Handler
	requiredMux *http.ServeMux
	named       map[string]http.Handler
	namedMux    *http.ServeMux
	// noStore holds, by route name, the twin of every protected route that keeps
	// outcomes only, for the requests that noStoreMux matches (nil without NoStoreBody).
	noStore    map[string]http.Handler
	noStoreMux *http.ServeMux

	// closing is set once Shutdown's grace ended; waiting holds the protected
	// exchanges under way, so that Shutdown waits for them and then settles them, and
	// idle is closed (and replaced) whenever none is left.
	closing   atomic.Bool
	waitingMu sync.Mutex
	waiting   map[*exchange]struct{}
	idle      chan struct{}
}

// New returns a Proxy for cfg, or the error of [Config.Validate], or of idem.New's
// validation of cfg.Idem.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Idem.Store == nil {
		return nil, errors.New("proxy: Config.Idem.Store is required")
	}
	p := &Proxy{upstream: cfg.Upstream, store: cfg.Idem.Store, profile: cfg.Idem.Profile,
		healthPath: cfg.HealthPath, upstreamHealth: cfg.UpstreamHealthPath, logger: cfg.Logger,
		maxStored:       withDefault(cfg.MaxStoredBody, DefaultMaxStoredBody),
		upstreamTimeout: withDefault(cfg.UpstreamTimeout, DefaultUpstreamTimeout),
		waitLimit:       withDefault(cfg.UpstreamWaitLimit, DefaultUpstreamWaitLimit),
		scopeCookie:     cfg.ScopeCookie, seal: cfg.Idem.Seal,
		budget: newBodyBudget(withDefault(cfg.MaxBufferedBodies, DefaultMaxBufferedBodies),
			withDefault(cfg.MaxBufferedBodiesPerClient, withDefault(cfg.MaxBufferedBodies, DefaultMaxBufferedBodies)/4),
			withDefault(cfg.Idem.MaxBodyBytes, idem.DefaultMaxBodyBytes), withDefault(cfg.MinUploadRate, DefaultMinUploadRate)),
		auth:     newAuthenticator(cfg),
		byMethod: map[string]http.Handler{}, waiting: map[*exchange]struct{}{}, idle: make(chan struct{})}
	if cfg.Hooks != nil {
		p.hooks = *cfg.Hooks
	}
	if p.logger == nil {
		p.logger = slog.Default()
	}
	if cfg.AccessLog {
		p.access = cfg.AccessLogger
		if p.access == nil {
			p.access = p.logger
		}
	}
	// A failing upstream fails every request alike: one line and a count per interval,
	// as the middleware's own lines.
	p.logger = slog.New(logsummary.New(p.logger.Handler(), 0))
	p.keyHeader, _ = headerName("", cfg.Idem.KeyHeader, idem.DefaultKeyHeader)
	if !cfg.SharedScope {
		p.scopeHeader, _ = headerName("", cfg.ScopeHeader, DefaultScopeHeader)
	}
	if !cfg.OmitUpstreamKey {
		p.upstreamKeyHeader, _ = headerName("", cfg.UpstreamKeyHeader, DefaultUpstreamKeyHeader)
	}
	if cfg.ClientAddressHeader != "" {
		p.clientAddrHeader, _ = headerName("", cfg.ClientAddressHeader, "")
	}
	if cfg.NotForwardedHeader != "" {
		p.notForwarded, _ = headerName("", cfg.NotForwardedHeader, "")
	}
	p.transport = cfg.Transport
	if p.transport == nil {
		t, err := newTransport(p.upstreamTimeout, p.waitLimit, withDefault(cfg.UpstreamIdleTimeout, DefaultUpstreamIdleTimeout), cfg.UpstreamTLS, cfg.UpstreamH2C)
		if err != nil {
			return nil, err
		}
		p.transport, p.ownTransport = t, true
		p.resends = max(withDefault(cfg.UpstreamResends, DefaultUpstreamResends), 0)
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      onceTransport{p},
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.upstreamFailed,
		// ReverseProxy's own log lines (a failed copy of a body) go to the logger.
		ErrorLog: slog.NewLogLogger(p.logger.Handler(), slog.LevelWarn),
	}
	p.forward = http.HandlerFunc(p.serveForward)

	if cfg.SharedScope && cfg.AuthURL == nil {
		// Every client is the one shared scope: bounds per principal would bound the
		// whole proxy.
		cfg.Idem.MaxInFlightPerScope, cfg.Idem.MaxStoredBytesPerScope = -1, -1
	}
	mw, err := newMiddleware(cfg.Idem, p)
	if err != nil {
		return nil, err
	}
	p.mw = mw
	p.onLapse = idem.LapseUnknown
	if cfg.TakeOverOnLapse {
		p.onLapse = idem.LapseTakeOver
	}
	methods := cfg.Methods
	if methods == nil {
		methods = DefaultMethods()
	}
	for _, m := range methods {
		m = strings.ToUpper(m)
		p.byMethod[m] = mw.Route(idem.RouteOptions{Name: m, Requirement: idem.KeyOptional, OnLapse: p.onLapse})(p.forward)
	}
	p.requiredMux, p.required = p.routes(mw, cfg.RequireKey, idem.KeyRequired)
	p.namedMux, p.named = p.routes(mw, cfg.Routes, idem.KeyOptional)
	if len(cfg.NoStoreBody) > 0 {
		p.noStoreMux, p.noStore = http.NewServeMux(), map[string]http.Handler{}
		for _, pattern := range cfg.NoStoreBody {
			_ = handlePattern(p.noStoreMux, pattern) // Validate registered them once already
		}
		twin := func(name string, req idem.Requirement) {
			p.noStore[name] = mw.Route(idem.RouteOptions{Name: name, Requirement: req, OnLapse: p.onLapse, NoStoreBody: true})(p.forward)
		}
		for m := range p.byMethod {
			twin(m, idem.KeyOptional)
		}
		for _, pattern := range cfg.RequireKey {
			twin(pattern, idem.KeyRequired)
		}
		for _, pattern := range cfg.Routes {
			twin(pattern, idem.KeyOptional)
		}
	}
	return p, nil
}

// routes returns the middleware's routes of patterns, by pattern, and a mux that
// matches them (nil without patterns).
func (p *Proxy) routes(mw *idem.Middleware, patterns []string, req idem.Requirement) (*http.ServeMux, map[string]http.Handler) {
	if len(patterns) == 0 {
		return nil, nil
	}
	mux, byPattern := http.NewServeMux(), map[string]http.Handler{}
	for _, pattern := range patterns {
		_ = handlePattern(mux, pattern) // Validate registered them once already
		byPattern[pattern] = mw.Route(idem.RouteOptions{Name: pattern, Requirement: req, OnLapse: p.onLapse})(p.forward)
	}
	return mux, byPattern
}

// Validate reports the first field of c that New would refuse, in an error naming it
// ("proxy: Config.RequireKey: …"). Of c.Idem it checks only KeyHeader: idem.New
// validates the rest when New builds the middleware.
func (c Config) Validate() error {
	if err := checkUpstream(c.Upstream); err != nil {
		return err
	}
	switch {
	case c.MaxStoredBody < 0:
		return fmt.Errorf("proxy: Config.MaxStoredBody must not be negative, got %d", c.MaxStoredBody)
	case c.UpstreamTimeout < 0:
		return fmt.Errorf("proxy: Config.UpstreamTimeout must not be negative, got %v", c.UpstreamTimeout)
	case c.UpstreamIdleTimeout < 0:
		return fmt.Errorf("proxy: Config.UpstreamIdleTimeout must not be negative, got %v", c.UpstreamIdleTimeout)
	case c.UpstreamWaitLimit < 0:
		return fmt.Errorf("proxy: Config.UpstreamWaitLimit must not be negative, got %v", c.UpstreamWaitLimit)
	case withDefault(c.UpstreamWaitLimit, DefaultUpstreamWaitLimit) < withDefault(c.UpstreamTimeout, DefaultUpstreamTimeout):
		return fmt.Errorf("proxy: Config.UpstreamWaitLimit (%v) must not be shorter than Config.UpstreamTimeout (%v)",
			withDefault(c.UpstreamWaitLimit, DefaultUpstreamWaitLimit), withDefault(c.UpstreamTimeout, DefaultUpstreamTimeout))
	case c.MaxBufferedBodies < 0:
		return fmt.Errorf("proxy: Config.MaxBufferedBodies must not be negative, got %d", c.MaxBufferedBodies)
	case c.MaxBufferedBodiesPerClient < 0:
		return fmt.Errorf("proxy: Config.MaxBufferedBodiesPerClient must not be negative, got %d", c.MaxBufferedBodiesPerClient)
	case c.AuthTimeout < 0:
		return fmt.Errorf("proxy: Config.AuthTimeout must not be negative, got %v", c.AuthTimeout)
	case c.AuthURL != nil && ((c.AuthURL.Scheme != "http" && c.AuthURL.Scheme != "https") || c.AuthURL.Host == "" || c.AuthURL.User != nil || c.AuthURL.Fragment != ""):
		return fmt.Errorf("proxy: Config.AuthURL %q: want http://host:port/path or https://host/path, without a user or a fragment", c.AuthURL.Redacted())
	case c.ScopeCookie != "" && c.SharedScope:
		return errors.New("proxy: Config.ScopeCookie and Config.SharedScope exclude each other")
	case c.ScopeCookie != "" && !validCookieName(c.ScopeCookie):
		return fmt.Errorf("proxy: Config.ScopeCookie is not a cookie name: %q", c.ScopeCookie)
	case c.HealthPath != "" && !strings.HasPrefix(c.HealthPath, "/"):
		return fmt.Errorf("proxy: Config.HealthPath must start with /, got %q", c.HealthPath)
	case c.UpstreamHealthPath != "" && !strings.HasPrefix(c.UpstreamHealthPath, "/"):
		return fmt.Errorf("proxy: Config.UpstreamHealthPath must start with /, got %q", c.UpstreamHealthPath)
	case c.UpstreamH2C && c.Upstream.Scheme != "http":
		return fmt.Errorf("proxy: Config.UpstreamH2C is HTTP/2 without TLS, for an http:// upstream; %s negotiates HTTP/2 over TLS by itself", c.Upstream.Redacted())
	case c.UpstreamH2C && c.Transport != nil:
		return errors.New("proxy: Config.UpstreamH2C configures the default Transport; a Transport of one's own speaks what it speaks")
	}
	for _, h := range [...]struct{ field, name, def string }{
		{"Config.Idem.KeyHeader", c.Idem.KeyHeader, idem.DefaultKeyHeader},
		{"Config.ScopeHeader", c.ScopeHeader, DefaultScopeHeader},
		{"Config.UpstreamKeyHeader", c.UpstreamKeyHeader, DefaultUpstreamKeyHeader},
		{"Config.AuthPrincipalHeader", c.AuthPrincipalHeader, DefaultAuthPrincipalHeader},
		{"Config.ClientAddressHeader", c.ClientAddressHeader, "X-Forwarded-For"},
		{"Config.NotForwardedHeader", c.NotForwardedHeader, "X-Idem-Not-Forwarded"},
	} {
		if _, err := headerName(h.field, h.name, h.def); err != nil {
			return err
		}
	}
	for _, h := range c.AuthHeaders {
		if _, err := headerName("Config.AuthHeaders", h, "-"); err != nil || h == "" {
			return fmt.Errorf("proxy: Config.AuthHeaders: %q is not a header name", h)
		}
	}
	for _, m := range c.Methods {
		if m == "" || strings.ContainsFunc(m, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return fmt.Errorf("proxy: Config.Methods: %q is not a method", m)
		}
		if strings.EqualFold(m, http.MethodTrace) || strings.EqualFold(m, http.MethodConnect) {
			return fmt.Errorf("proxy: Config.Methods: %s cannot be protected (it has no effect to protect, and Go's HTTP client re-sends a TRACE by itself)", strings.ToUpper(m))
		}
	}
	for _, list := range [...]struct {
		field    string
		patterns []string
	}{{"Config.RequireKey", c.RequireKey}, {"Config.Routes", c.Routes}, {"Config.NoStoreBody", c.NoStoreBody}} {
		mux, seen := http.NewServeMux(), map[string]bool{}
		for _, pattern := range list.patterns {
			if seen[pattern] {
				return fmt.Errorf("proxy: %s: %q is given twice", list.field, pattern)
			}
			seen[pattern] = true
			if err := handlePattern(mux, pattern); err != nil {
				return fmt.Errorf("proxy: %s: %w", list.field, err)
			}
		}
	}
	return nil
}

// validCookieName reports whether name is a cookie's name (an RFC 7230 token).
func validCookieName(name string) bool {
	return name != "" && !strings.ContainsFunc(name, func(r rune) bool {
		return r <= ' ' || r >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
	})
}

// withDefault returns v, or def when v is zero.
func withDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// newMiddleware builds the middleware of the proxy's routes; a configuration that
// idem.New refuses (it panics, naming the field) is returned as an error.
func newMiddleware(c idem.Config, p *Proxy) (mw *idem.Middleware, err error) {
	c.Scope = p.scope
	c.MaxResponseBytes = p.maxStored
	c.Methods = nil
	if c.Logger == nil {
		c.Logger = p.logger
	}
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("proxy: Config.Idem: %v", v)
		}
	}()
	return idem.New(c), nil
}

// handlePattern registers pattern in mux, in lower case (matchPattern matches
// requests in lower case), which panics on a pattern it cannot parse or that
// conflicts with another; the panic is returned as an error.
func handlePattern(mux *http.ServeMux, pattern string) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	mux.Handle(lowerPattern(pattern), patternHandler(pattern)) // only matched, never served
	return nil
}

// patternHandler is the handler a pattern is registered with: it names the pattern as
// written, for matchPattern.
type patternHandler string

func (patternHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) { http.NotFound(w, nil) }

// lowerPattern is pattern with its path in lower case, its method and host as they
// are: ServeMux matches paths case-sensitively, and matchPattern matches lower-case
// variants of a request's path.
func lowerPattern(pattern string) string {
	i := strings.IndexByte(pattern, '/')
	if i < 0 {
		return pattern
	}
	return pattern[:i] + strings.ToLower(pattern[i:])
}

// matchPattern returns the pattern (as written) of mux that r's path matches, or any
// of the variants that common routers send to the same handler: letter case ignored
// (Express's default), a trailing slash removed (Express's default, and many
// others'), ";params" of a segment removed (Java servlet containers), %2F decoded.
// Matching more than the upstream routes only asks for a key more often: a key
// requirement must not be sidestepped by how a path is spelled.
func matchPattern(mux *http.ServeMux, r *http.Request) (string, bool) {
	if mux == nil {
		return "", false
	}
	for _, path := range pathVariants(r.URL) {
		probe := &http.Request{Method: r.Method, Host: r.Host, URL: &url.URL{Path: path}, Header: r.Header}
		if h, pattern := mux.Handler(probe); pattern != "" {
			if named, ok := h.(patternHandler); ok {
				return string(named), true
			}
		}
	}
	return "", false
}

// pathVariants returns the lower-case spellings of u's path that matchPattern tries.
func pathVariants(u *url.URL) []string {
	base := strings.ToLower(u.Path)
	variants := []string{base}
	if clean := path.Clean(base); clean != base && clean != "." {
		variants = append(variants, clean) // ServeMux would redirect to it
	}
	add := func(v string) {
		if v != "" && !slices.Contains(variants, v) {
			variants = append(variants, v)
		}
	}
	if raw := strings.ToLower(u.EscapedPath()); strings.Contains(raw, "%2f") {
		if dec, err := url.PathUnescape(raw); err == nil {
			add(dec)
		}
	}
	for _, v := range slices.Clone(variants) {
		if strings.Contains(v, ";") {
			segs := strings.Split(v, "/")
			for i, seg := range segs {
				if j := strings.IndexByte(seg, ';'); j >= 0 {
					segs[i] = seg[:j]
				}
			}
			add(strings.Join(segs, "/"))
		}
	}
	for _, v := range slices.Clone(variants) {
		if len(v) > 1 && strings.HasSuffix(v, "/") {
			add(strings.TrimRight(v, "/"))
		}
	}
	for _, v := range slices.Clone(variants) {
		if trimmed, ok := trimFormat(v); ok {
			add(trimmed)
		}
	}
	return variants
}

// trimFormat returns path without the format suffix of its last segment
// ("/v1/charges.json": "/v1/charges"), which Rails, Django REST framework and others
// route to the same action as the path without it: a dot and 1 to 10 letters or digits
// ending a segment that has something before the dot.
func trimFormat(path string) (string, bool) {
	seg := path[strings.LastIndexByte(path, '/')+1:]
	dot := strings.LastIndexByte(seg, '.')
	ext := seg[dot+1:]
	if dot <= 0 || len(ext) == 0 || len(ext) > 10 || strings.ContainsFunc(ext, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < '0' || r > '9')
	}) {
		return "", false
	}
	return path[:len(path)-len(seg)+dot], true
}

// checkUpstream refuses an upstream URL that is not http(s) with a host, or that has a
// query, a fragment or a user.
func checkUpstream(u *url.URL) error {
	switch {
	case u == nil:
		return errors.New("proxy: Config.Upstream is required")
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.RawQuery != "", u.Fragment != "", u.User != nil:
		return fmt.Errorf("proxy: Config.Upstream %q: want http://host:port or https://host[:port][/path], without a query, a fragment or a user", u.Redacted())
	}
	return nil
}

// headerName returns name, or def when it is empty, in canonical form; a name that is
// not a header's is an error naming field.
func headerName(field, name, def string) (string, error) {
	if name == "" {
		name = def
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return "", fmt.Errorf("proxy: %s is not a header name: %q", field, name)
		}
	}
	return http.CanonicalHeaderKey(name), nil
}

// newTransport is the default Transport: a connection is dialled within timeout (at
// least a second, a SYN's retransmission; at most 10 s); every request goes to one
// host, so many idle connections are kept for it, never longer than idle; the upstream's response
// headers must come within waitLimit (the exchange answers the client at timeout);
// the body is passed on as the upstream encoded it. HTTP/2, over TLS as the upstream
// negotiates it or as h2c, is golang.org/x/net/http2's client, whose re-sends are
// exactly the streams the upstream provably did not process (send.go).
func newTransport(timeout, waitLimit, idle time.Duration, tlsConfig *tls.Config, h2c bool) (http.RoundTripper, error) {
	dialer := &net.Dialer{Timeout: min(max(timeout, time.Second), 10*time.Second), KeepAlive: 30 * time.Second}
	if h2c {
		return &http2.Transport{
			AllowHTTP: true,
			DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
				return dialer.DialContext(ctx, network, addr)
			},
			IdleConnTimeout:    idle,
			DisableCompression: true,
		}, nil
	}
	t := &http.Transport{
		TLSClientConfig:       tlsConfig,
		DialContext:           dialer.DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       idle,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: waitLimit,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
	if t.TLSClientConfig != nil {
		t.TLSClientConfig = t.TLSClientConfig.Clone()
	}
	if _, err := http2.ConfigureTransports(t); err != nil {
		return nil, fmt.Errorf("proxy: HTTP/2 to the upstream: %w", err)
	}
	return t, nil
}

// ServeHTTP answers the health path, forwards WebSocket upgrades and unprotected
// requests untouched, and runs protected ones through the middleware.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.healthPath != "" && r.URL.Path == p.healthPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		p.health(w, r)
		return
	}
	h, route := p.route(r)
	if route != routeUpgrade {
		ignoreUpgradeOffer(r)
	}
	if p.access != nil {
		p.logAccess(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.serve(h, route, w, r) }), w, r, route)
		return
	}
	p.serve(h, route, w, r)
}

// serve serves r through h, its route's handler, bounding the bodies of protected
// requests.
func (p *Proxy) serve(h http.Handler, route string, w http.ResponseWriter, r *http.Request) {
	switch {
	case route == routeUpgrade:
		if len(r.Header[p.keyHeader]) > 0 {
			p.logger.WarnContext(r.Context(), "idem proxy: a WebSocket upgrade carries an idempotency key; it is forwarded without idempotency (an upgraded connection has no response to store)",
				"method", r.Method, "path", r.URL.Path)
		}
	case route == routePassThrough && len(r.Header[p.keyHeader]) > 0 && !safeMethod(r.Method):
		// A client that sends a key expects it honoured: a keyed PUT or DELETE (any
		// method with effects that --methods does not protect) is forwarded without
		// idempotency, and said once per interval.
		p.logger.WarnContext(r.Context(), "idem proxy: a "+r.Method+" request carries an idempotency key, but its method is not protected (--methods, --require-key); it is forwarded without idempotency",
			"method", r.Method, "path", r.URL.Path)
	case route != routePassThrough && len(r.Header[p.keyHeader]) > 0 && r.Method != http.MethodTrace:
		// Who is asking, before anything is claimed, replayed or buffered: the auth
		// endpoint's principal, or the scope header's (a keyed request without one is
		// refused here, before its body is read).
		if p.auth != nil {
			if r = p.authorize(w, r); r == nil {
				return
			}
		}
		scope, err := p.scope(r)
		if err != nil {
			w.Header()[p.keyHeader] = slices.Clone(r.Header[p.keyHeader])
			p.mw.WriteError(w, r, idem.CodeScopeRequired, "")
			return
		}
		// A protected request's body is held until its exchange ends: bound them all,
		// and each client's share (its principal's, its address's).
		owners := []string{"address " + p.clientAddress(r)}
		if p.auth != nil || p.scopeHeader != "" || p.scopeCookie != "" {
			owners = append(owners, "principal "+scope) // not the one scope every client shares
		}
		release, ok, slow := p.budget.buffer(http.NewResponseController(w), r, owners...)
		defer release()
		if hb, held := r.Body.(*heldBody); held {
			r = r.WithContext(context.WithValue(r.Context(), heldBodyKey{}, hb))
		}
		switch {
		case slow:
			p.logger.WarnContext(r.Context(), "idem proxy: a request body arrived slower than the minimum upload rate (--min-upload-rate); answering 408",
				"method", r.Method, "path", r.URL.Path, "min_upload_rate", p.budget.minRate)
			w.Header().Set("Connection", "close")
			idem.WriteProblem(w, r, p.profile, &idem.Problem{Status: http.StatusRequestTimeout, Code: CodeUploadTooSlow, Type: "api_error",
				Detail: "The request body arrived too slowly; nothing was executed."})
			return
		case !ok:
			p.logger.WarnContext(r.Context(), "idem proxy: the request bodies held at once reached the limit of all clients (--max-buffered-bodies) or of this client (--max-buffered-bodies-per-client); answering 503",
				"method", r.Method, "path", r.URL.Path, "max_buffered_bodies", p.budget.limit, "per_client", p.budget.perClient)
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Connection", "close")
			idem.WriteProblem(w, r, p.profile, &idem.Problem{Status: http.StatusServiceUnavailable, Code: CodeProxyBusy, Type: "api_error",
				Detail: "The proxy holds as many request bodies as it may; retry later."})
			return
		}
	}
	h.ServeHTTP(w, r)
}

// clientAddress is the address a client's requests are charged to: the
// ClientAddressHeader's (X-Forwarded-For: its last address), or the connection's peer.
func (p *Proxy) clientAddress(r *http.Request) string {
	if p.clientAddrHeader != "" {
		if v := r.Header.Values(p.clientAddrHeader); len(v) > 0 {
			last := v[len(v)-1]
			if i := strings.LastIndexByte(last, ','); i >= 0 {
				last = last[i+1:]
			}
			if a := strings.TrimSpace(last); a != "" {
				return a
			}
		}
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// safeMethod reports whether method is safe (RFC 9110 §9.2.1): a keyed request of it
// that passes through unprotected is not worth a warning.
func safeMethod(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// Names of the routes that are not a pattern of RequireKey or Routes, or a protected
// method.
const (
	routeUpgrade     = "upgrade"
	routePassThrough = "passthrough"
	routeHealth      = "healthz"
)

// Route returns the name of r's route, for metrics: the RequireKey or Routes pattern
// it matches, its method when it is a protected method ("POST"), "upgrade" for a
// WebSocket upgrade, "healthz" for the health path, or "passthrough".
func (p *Proxy) Route(r *http.Request) string {
	if p.healthPath != "" && r.URL.Path == p.healthPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		return routeHealth
	}
	_, route := p.route(r)
	return route
}

// route returns the handler of r and its route's name.
func (p *Proxy) route(r *http.Request) (http.Handler, string) {
	h, name := p.routeOf(r)
	if p.noStoreMux != nil && p.noStore[name] != nil && r.Method != http.MethodTrace {
		if _, ok := matchPattern(p.noStoreMux, r); ok {
			return p.noStore[name], name // the same route, keeping its outcome only
		}
	}
	return h, name
}

// routeOf is route without NoStoreBody.
func (p *Proxy) routeOf(r *http.Request) (http.Handler, string) {
	if pattern, ok := matchPattern(p.requiredMux, r); ok {
		if r.Method == http.MethodTrace {
			// Go's transport re-sends a TRACE by itself, and a TRACE must not carry
			// the body object that stops it (send.go): it is not forwarded.
			return http.HandlerFunc(p.refuseTrace), pattern
		}
		// A route that requires a key has no WebSocket endpoint to bypass it: an
		// upgrade offer there is ignored, and the request wants its key.
		return p.required[pattern], pattern
	}
	if isWebSocketUpgrade(r) {
		// An upgraded connection has no response to store: it is forwarded as is,
		// claiming nothing (the middleware's capture refuses Hijack).
		return p.forward, routeUpgrade
	}
	h, ok := p.byMethod[r.Method]
	if !ok {
		return p.forward, routePassThrough
	}
	if pattern, ok := matchPattern(p.namedMux, r); ok {
		return p.named[pattern], pattern
	}
	return h, r.Method
}

// refuseTrace answers a TRACE on a route that requires a key: 405, nothing forwarded.
func (p *Proxy) refuseTrace(w http.ResponseWriter, r *http.Request) {
	idem.WriteProblem(w, r, p.profile, &idem.Problem{Status: http.StatusMethodNotAllowed, Code: CodeMethodNotAllowed, Type: "api_error",
		Detail: "TRACE is not forwarded on a route that requires an idempotency key."})
}

// isWebSocketUpgrade reports whether r can switch protocols here: a GET asking for
// WebSocket (its Connection header lists "upgrade", as ReverseProxy decides) on a
// route that does not require a key. Nothing else bypasses the middleware.
func isWebSocketUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet && connectionHas(r.Header, "upgrade") && strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// ignoreUpgradeOffer removes from r the upgrade offer of a request that is not
// forwarded as an upgrade: an h2c offer (Upgrade: h2c, HTTP2-Settings, which curl
// --http2 adds to every http:// request), or a WebSocket offer on a route that requires
// a key, is ignored, as Go's own server ignores h2c, so that the request is protected
// like any other and the upstream is not asked to switch either.
func ignoreUpgradeOffer(r *http.Request) {
	if r.Header.Get("Upgrade") == "" && !connectionHas(r.Header, "upgrade") {
		return
	}
	r.Header.Del("Upgrade")
	r.Header.Del("Http2-Settings")
	var kept []string
	for _, v := range r.Header["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if t := strings.TrimSpace(tok); t != "" && !strings.EqualFold(t, "upgrade") && !strings.EqualFold(t, "http2-settings") {
				kept = append(kept, t)
			}
		}
	}
	if len(kept) == 0 {
		r.Header.Del("Connection")
		return
	}
	r.Header["Connection"] = []string{strings.Join(kept, ", ")}
}

// connectionHas reports whether h's Connection header lists token.
func connectionHas(h http.Header, token string) bool {
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), token) {
				return true
			}
		}
	}
	return false
}

// scope is the middleware's Scope: the hex SHA-256 of the principal the auth endpoint
// named, of the scope cookie's value, or of the scope header's values, normalised
// (normalizeCredential). A header whose every value is empty, or a credential without
// a token ("Bearer" alone), is missing.
func (p *Proxy) scope(r *http.Request) (string, error) {
	if p.auth != nil {
		if principal, ok := r.Context().Value(principalKey{}).(string); ok && principal != "" {
			return p.hashScope(principal), nil
		}
		return "", errNoScope
	}
	if p.scopeCookie != "" {
		return cookieScope(r, p.scopeCookie, p.hashScope)
	}
	if p.scopeHeader == "" {
		return SharedScope, nil
	}
	var values []string
	for _, v := range r.Header[p.scopeHeader] {
		if strings.TrimSpace(v) == "" {
			continue
		}
		n, ok := normalizeCredential(v)
		if !ok {
			return "", errNoScope
		}
		values = append(values, n)
	}
	if len(values) == 0 {
		return "", errNoScope
	}
	return p.hashScope(strings.Join(values, "\n")), nil
}

// cookieScope is the scope of the one cookie named name: missing, empty or repeated,
// there is none.
func cookieScope(r *http.Request, name string, hashScope func(string) string) (string, error) {
	var value string
	n := 0
	for _, c := range r.CookiesNamed(name) {
		value = c.Value
		n++
	}
	if n != 1 || value == "" {
		return "", errNoScope
	}
	return hashScope(value), nil
}

// hashScope is the scope of a principal, the one place a scope is made: its hex
// SHA-256, or with a keyring (Config.Idem.Seal) its keyed hash (an HMAC, SPEC §19),
// which nobody without the key recomputes from a guessed credential; so that no token
// is stored or logged.
func (p *Proxy) hashScope(principal string) string {
	if k := p.seal; k != nil {
		return k.Scope(principal)
	}
	sum := sha256.Sum256([]byte(principal))
	return hex.EncodeToString(sum[:])
}

var errNoScope = errors.New("proxy: no scope header")

// heldBodyKey is the context key of a protected request's heldBody.
type heldBodyKey struct{}

// serveForward forwards r to the upstream through an exchange, which watches what
// crosses the network (and, under the middleware's claim, decides how the response is
// stored).
func (p *Proxy) serveForward(w http.ResponseWriter, r *http.Request) {
	x := &exchange{p: p, h: idem.FromContext(r.Context()), w: w, r: r}
	x.forward()
}

// rewrite is the ReverseProxy's Rewrite: the request goes to the upstream as the
// client sent it (its Host included), with X-Forwarded-For extended by the client's
// address, X-Forwarded-Host, X-Forwarded-Proto and Forwarded as the client sent them
// (set by this hop when absent), and, under a claim, the derived key.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(p.upstream)
	pr.Out.Host = pr.In.Host
	in, out := pr.In.Header, pr.Out.Header
	if v, ok := in["X-Forwarded-For"]; ok {
		out["X-Forwarded-For"] = v
	}
	pr.SetXForwarded()
	for _, name := range [...]string{"X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"} {
		if v, ok := in[name]; ok {
			out[name] = v
		}
	}
	h := idem.FromContext(pr.In.Context())
	if h == nil {
		return
	}
	if x := exchangeOf(pr.In.Context()); x != nil && pr.Out.Body != nil {
		// The body the budget read, not the middleware's pooled copy (heldBody).
		hb, _ := pr.In.Context().Value(heldBodyKey{}).(*heldBody)
		body, ok := []byte(nil), false
		if hb != nil {
			body, ok = hb.forwardable(p.budget.maxBody)
		}
		if !ok || int64(len(body)) != pr.Out.ContentLength {
			// Not read through the budget (it always is: the middleware refuses a
			// body it could not read whole): a private copy, read now.
			body, _ = io.ReadAll(pr.Out.Body)
		}
		// Each attempt gets its own reader of it, and never GetBody (send.go).
		x.body = body
	}
	pr.Out.Body, pr.Out.GetBody = nil, nil
	// A protected request must never be re-sent by the transport once written. But
	// http.Transport takes a request with an Idempotency-Key or X-Idempotency-Key
	// header for replayable (a body-less POST too), and re-sends it by itself when a
	// kept-alive connection breaks after the request was written (send.go). So the
	// client's key fields are dropped, and the derived key goes under its name in
	// lower case, which the transport does not see as that header and every server
	// reads as it (field names are case-insensitive, RFC 9110 §5.1).
	delete(out, "Idempotency-Key")
	delete(out, "X-Idempotency-Key")
	delete(out, p.keyHeader)
	if p.upstreamKeyHeader != "" {
		delete(out, p.upstreamKeyHeader)
		out[strings.ToLower(p.upstreamKeyHeader)] = []string{h.DerivedKey(UpstreamKeyStep)}
	}
}

// upstreamFailed is the ReverseProxy's ErrorHandler. What the answer and the key
// become depends on what crossed the network (SPEC §17):
//
//   - the request provably never reached the upstream (nothing was written: a dial
//     failure, a refused connection): 502 upstream_unavailable, which releases a
//     protected request's key, so that its retry executes once, afresh;
//   - an unprotected request whose headers did not come within UpstreamTimeout: 504;
//   - a protected request that was written (a reset, an EOF, the wait limit, the
//     proxy shutting down): the outcome is unknown, the record is kept
//     (Handle.SetOutcomeUnknown) and the client is told so: 500 outcome_unknown, or
//     502 upstream_reply_lost under take_over. Nothing more when the client was
//     answered 504 already.
func (p *Proxy) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	x := exchangeOf(r.Context())
	if x != nil {
		// No early 504 from now on: the timer must not answer the client while this
		// goroutine writes the failure's answer (to the client, or, once it was
		// answered early, to the capture only: what the record gets).
		x.mu.Lock()
		x.headers = true
		x.mu.Unlock()
		x.timer.Stop()
	}
	level := slog.LevelWarn
	if r.Context().Err() != nil && (x == nil || x.leaseLost()) {
		// The client went away, or the lease was lost (which the middleware answers
		// 503): nothing went wrong upstream.
		level = slog.LevelDebug
	}
	// A lost lease does not change what crossed the network: a request written before
	// it is unknown too (and never released, whoever holds the key now).
	if x == nil || x.h == nil || !x.wrote.Load() {
		status, code, detail := http.StatusBadGateway, CodeUpstreamUnavailable, "The upstream service could not be reached; retry later."
		if x != nil && errors.Is(context.Cause(r.Context()), errHeaderTimeout) {
			status, code, detail = http.StatusGatewayTimeout, CodeUpstreamTimeout, "The upstream service did not answer in time; it may have acted."
		}
		outcome := "not_sent"
		if x != nil && x.wrote.Load() {
			outcome = "unknown"
		}
		if x != nil {
			p.upstreamFailedHook(x, outcome)
			note(r.Context(), x, outcome)
		}
		p.logger.Log(r.Context(), level, "idem proxy: the upstream exchange failed", "method", r.Method, "path", r.URL.Path,
			"status", status, "sent", outcome != "not_sent", "error", err)
		idem.WriteProblem(w, r, p.profile, &idem.Problem{Status: status, Code: code, Type: "api_error", Detail: detail})
		return
	}
	x.h.SetOutcomeUnknown()
	p.upstreamFailedHook(x, "unknown")
	note(r.Context(), x, "outcome_unknown")
	cause := context.Cause(r.Context())
	if cause == nil || errors.Is(cause, context.Canceled) {
		cause = err
	}
	p.logger.Log(r.Context(), level, "idem proxy: the request reached the upstream and its reply was lost; the outcome is unknown and the record is kept",
		x.attrs(slog.Any("error", err), slog.Any("cause", cause), slog.String("on_lapse", p.onLapse.String()))...)
	if !x.waitingInBackground() {
		x.writeUnknown(w)
	}
}

// track and untrack keep the protected exchanges under way, for Shutdown.
func (p *Proxy) track(x *exchange) {
	p.waitingMu.Lock()
	p.waiting[x] = struct{}{}
	p.waitingMu.Unlock()
}

func (p *Proxy) untrack(x *exchange) {
	p.waitingMu.Lock()
	delete(p.waiting, x)
	if len(p.waiting) == 0 {
		close(p.idle)
		p.idle = make(chan struct{})
	}
	p.waitingMu.Unlock()
}

// Shutdown ends the proxy's protected exchanges within grace, for a server that
// begins to shut down (call it from http.Server.RegisterOnShutdown, before waiting for
// the handlers to return): the exchanges under way, those whose clients got 504 and
// that wait for the upstream's answer past UpstreamTimeout included, go on for up to
// grace, so that a deploy lets slow upstreams answer and their answers be stored; what
// is still under way then is cancelled and settled as a lost reply is (its outcome
// unknown, its record kept for the lapse policy; a request never written is
// released). It returns once it settled them, or at once when none was left. Grace 0
// settles them at once.
func (p *Proxy) Shutdown(grace time.Duration) {
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		p.waitingMu.Lock()
		n := len(p.waiting)
		idle := p.idle
		p.waitingMu.Unlock()
		if n == 0 {
			return
		}
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-idle:
		case <-t.C:
		}
		t.Stop()
	}
	p.closing.Store(true)
	p.waitingMu.Lock()
	defer p.waitingMu.Unlock()
	for x := range p.waiting {
		x.cancel(errShutdown)
	}
}

// observeUpstream and upstreamFailedHook call the Hooks.
func (p *Proxy) observeUpstream(x *exchange, status int) {
	if f := p.hooks.UpstreamResponse; f != nil {
		f(p.Route(x.r), status, time.Since(x.start))
	}
}

func (p *Proxy) upstreamFailedHook(x *exchange, outcome string) {
	if f := p.hooks.UpstreamFailed; f != nil {
		f(p.Route(x.r), outcome)
	}
}

// health answers the health path: 200 {"status":"ok"} when the store answers a ping
// (and the upstream its health path), 503 naming what failed otherwise.
func (p *Proxy) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), DefaultHealthTimeout)
	defer cancel()
	status, body := http.StatusOK, `{"status":"ok"}`
	if err := p.store.Ping(ctx); err != nil {
		p.logger.WarnContext(ctx, "idem proxy: healthz: store ping failed", "error", err)
		status, body = http.StatusServiceUnavailable, `{"status":"unavailable","failing":"store"}`
	} else if p.upstreamHealth != "" {
		if err := p.checkUpstream(ctx); err != nil {
			p.logger.WarnContext(ctx, "idem proxy: healthz: upstream check failed", "error", err)
			status, body = http.StatusServiceUnavailable, `{"status":"unavailable","failing":"upstream"}`
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = io.WriteString(w, body+"\n")
	}
}

// checkUpstream GETs the upstream's health path and wants 2xx or 3xx.
func (p *Proxy) checkUpstream(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.upstream.JoinPath(p.upstreamHealth).String(), nil)
	if err != nil {
		return err
	}
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 399 {
		return fmt.Errorf("GET %s answered %d", p.upstreamHealth, resp.StatusCode)
	}
	return nil
}

// keyHash identifies a key in logs without revealing it, as the middleware's lines do.
func keyHash(scope, key string) string {
	sum := sha256.Sum256([]byte(scope + "\x00" + key))
	return hex.EncodeToString(sum[:6])
}
