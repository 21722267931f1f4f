package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/idem-go/idem"
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
	// DefaultUpstreamTimeout bounds the wait for the upstream's response headers.
	DefaultUpstreamTimeout = 60 * time.Second
	// DefaultUpstreamIdleTimeout is how long an idle connection to the upstream is
	// kept: less than Node.js's default keep-alive of 5 s, so that the proxy never
	// sends a request on a connection the upstream is closing.
	DefaultUpstreamIdleTimeout = 4 * time.Second
	// DefaultHealthTimeout bounds the checks of the health path.
	DefaultHealthTimeout = 2 * time.Second
)

// SharedScope is the scope of every record when [Config.SharedScope] is set.
const SharedScope = "shared"

// ForeignKeyStep is the step whose foreign key ([idem.Handle.ForeignKey]) the
// upstream receives: the derived key is hex SHA-256(record id ‖ "upstream").
const ForeignKeyStep = "upstream"

// The codes of the proxy's own errors, written in the middleware's profile with the
// seed type "api_error". Both are 5xx, so the key is released.
const (
	// CodeUpstreamUnavailable (502): the upstream could not be reached, or broke the
	// exchange before its response headers.
	CodeUpstreamUnavailable = "upstream_unavailable"
	// CodeUpstreamTimeout (504): the upstream's response headers did not come within
	// Config.UpstreamTimeout. The upstream may have acted.
	CodeUpstreamTimeout = "upstream_timeout"
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
	// repeated), so that no token is stored or logged. A keyed request without it is
	// refused 401 scope_required. Defaults to [DefaultScopeHeader].
	ScopeHeader string
	// SharedScope puts every record in one scope, [SharedScope], and ignores
	// ScopeHeader: for an upstream without principals, or one whose clients cannot
	// see each other's keys anyway. Defaults to false.
	SharedScope bool

	// Methods are the methods whose requests are protected when they carry a key; a
	// request of another method, or without a key, is forwarded untouched. An empty,
	// non-nil slice protects no method (only the RequireKey routes). Defaults to
	// [DefaultMethods] (POST, PATCH).
	Methods []string
	// RequireKey are net/http ServeMux patterns ("POST /v1/charges",
	// "POST /v1/orders/{id}/pay", "/v1/transfers/") of routes whose requests must carry
	// a key (400 key_required without one), whatever their method. Defaults to none.
	RequireKey []string

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

	// UpstreamTimeout bounds the wait for the upstream's response headers (its body
	// streams as long as the upstream sends it); past it the client gets 504
	// upstream_timeout. Defaults to [DefaultUpstreamTimeout].
	UpstreamTimeout time.Duration
	// UpstreamIdleTimeout is how long an idle connection to the upstream is kept for
	// the next request; keep it below the upstream's own keep-alive timeout. Defaults
	// to [DefaultUpstreamIdleTimeout].
	UpstreamIdleTimeout time.Duration
	// Transport sends the requests to the upstream. Defaults to an http.Transport with
	// UpstreamTimeout as its ResponseHeaderTimeout, UpstreamIdleTimeout, up to 256 idle
	// connections, no compression of its own and no proxy from the environment.
	Transport http.RoundTripper

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

// Proxy is an http.Handler that forwards requests to the upstream, protecting keyed
// ones with idem's middleware. Build one with [New]; it is safe for concurrent use.
type Proxy struct {
	upstream          *url.URL
	rp                *httputil.ReverseProxy
	transport         http.RoundTripper
	store             idem.Store
	profile           idem.Profile
	keyHeader         string // canonical
	scopeHeader       string // canonical; "" for SharedScope
	upstreamKeyHeader string // canonical; "" with OmitUpstreamKey
	maxStored         int64
	healthPath        string
	upstreamHealth    string
	logger            *slog.Logger

	// forward forwards a request without the middleware; byMethod holds the
	// middleware's routes of the protected methods (key optional), required its routes
	// of RequireKey by pattern, and requiredMux matches the patterns (nil without).
	forward     http.Handler
	byMethod    map[string]http.Handler
	required    map[string]http.Handler
	requiredMux *http.ServeMux
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
		maxStored: withDefault(cfg.MaxStoredBody, DefaultMaxStoredBody), byMethod: map[string]http.Handler{}}
	if p.logger == nil {
		p.logger = slog.Default()
	}
	// A failing upstream fails every request alike: one line and a count per interval,
	// as the middleware's own lines.
	p.logger = slog.New(idem.NewLogSummaryHandler(p.logger.Handler(), 0))
	p.keyHeader, _ = headerName("", cfg.Idem.KeyHeader, idem.DefaultKeyHeader)
	if !cfg.SharedScope {
		p.scopeHeader, _ = headerName("", cfg.ScopeHeader, DefaultScopeHeader)
	}
	if !cfg.OmitUpstreamKey {
		p.upstreamKeyHeader, _ = headerName("", cfg.UpstreamKeyHeader, DefaultUpstreamKeyHeader)
	}
	p.transport = cfg.Transport
	if p.transport == nil {
		p.transport = newTransport(withDefault(cfg.UpstreamTimeout, DefaultUpstreamTimeout),
			withDefault(cfg.UpstreamIdleTimeout, DefaultUpstreamIdleTimeout))
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      p.transport,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.upstreamFailed,
		// ReverseProxy's own log lines (a failed copy of a body) go to the logger.
		ErrorLog: slog.NewLogLogger(p.logger.Handler(), slog.LevelWarn),
	}
	p.forward = http.HandlerFunc(p.serveForward)

	mw, err := newMiddleware(cfg.Idem, p)
	if err != nil {
		return nil, err
	}
	onLapse := idem.LapseUnknown
	if cfg.TakeOverOnLapse {
		onLapse = idem.LapseTakeOver
	}
	methods := cfg.Methods
	if methods == nil {
		methods = DefaultMethods()
	}
	for _, m := range methods {
		m = strings.ToUpper(m)
		p.byMethod[m] = mw.Route(idem.RouteOptions{Name: m, Requirement: idem.KeyOptional, OnLapse: onLapse})(p.forward)
	}
	if len(cfg.RequireKey) > 0 {
		p.required = map[string]http.Handler{}
		p.requiredMux = http.NewServeMux()
		for _, pattern := range cfg.RequireKey {
			_ = handlePattern(p.requiredMux, pattern) // Validate registered them once already
			p.required[pattern] = mw.Route(idem.RouteOptions{Name: pattern, Requirement: idem.KeyRequired, OnLapse: onLapse})(p.forward)
		}
	}
	return p, nil
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
	case c.HealthPath != "" && !strings.HasPrefix(c.HealthPath, "/"):
		return fmt.Errorf("proxy: Config.HealthPath must start with /, got %q", c.HealthPath)
	case c.UpstreamHealthPath != "" && !strings.HasPrefix(c.UpstreamHealthPath, "/"):
		return fmt.Errorf("proxy: Config.UpstreamHealthPath must start with /, got %q", c.UpstreamHealthPath)
	}
	for _, h := range [...]struct{ field, name, def string }{
		{"Config.Idem.KeyHeader", c.Idem.KeyHeader, idem.DefaultKeyHeader},
		{"Config.ScopeHeader", c.ScopeHeader, DefaultScopeHeader},
		{"Config.UpstreamKeyHeader", c.UpstreamKeyHeader, DefaultUpstreamKeyHeader},
	} {
		if _, err := headerName(h.field, h.name, h.def); err != nil {
			return err
		}
	}
	for _, m := range c.Methods {
		if m == "" || strings.ContainsFunc(m, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			return fmt.Errorf("proxy: Config.Methods: %q is not a method", m)
		}
	}
	mux, seen := http.NewServeMux(), map[string]bool{}
	for _, pattern := range c.RequireKey {
		if seen[pattern] {
			return fmt.Errorf("proxy: Config.RequireKey: %q is given twice", pattern)
		}
		seen[pattern] = true
		if err := handlePattern(mux, pattern); err != nil {
			return err
		}
	}
	return nil
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

// handlePattern registers pattern in mux, which panics on a pattern it cannot parse or
// that conflicts with another; the panic is returned as an error.
func handlePattern(mux *http.ServeMux, pattern string) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("proxy: Config.RequireKey: %v", v)
		}
	}()
	mux.Handle(pattern, http.NotFoundHandler()) // only matched, never served
	return nil
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

// newTransport is the default Transport: every request goes to one host, so many
// idle connections are kept for it, never longer than idle; the upstream's response
// headers must come within timeout; the body is passed on as the upstream encoded it.
func newTransport(timeout, idle time.Duration) *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: min(timeout, 10*time.Second), KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       idle,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: timeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
}

// ServeHTTP answers the health path, forwards protocol upgrades and unprotected
// requests untouched, and runs protected ones through the middleware.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.healthPath != "" && r.URL.Path == p.healthPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		p.health(w, r)
		return
	}
	h, route := p.route(r)
	if route == routeUpgrade && len(r.Header[p.keyHeader]) > 0 {
		p.logger.WarnContext(r.Context(), "idem proxy: a protocol upgrade carries an idempotency key; it is forwarded without idempotency (an upgraded connection has no response to store)",
			"method", r.Method, "path", r.URL.Path, "upgrade", upgradeType(r.Header))
	}
	h.ServeHTTP(w, r)
}

// Names of the routes that are not a pattern of RequireKey or a protected method.
const (
	routeUpgrade     = "upgrade"
	routePassThrough = "passthrough"
	routeHealth      = "healthz"
)

// Route returns the name of r's route, for metrics: the RequireKey pattern it
// matches, its method when it is a protected method ("POST"), "upgrade" for a protocol
// upgrade, "healthz" for the health path, or "passthrough".
func (p *Proxy) Route(r *http.Request) string {
	if p.healthPath != "" && r.URL.Path == p.healthPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		return routeHealth
	}
	_, route := p.route(r)
	return route
}

// route returns the handler of r and its route's name.
func (p *Proxy) route(r *http.Request) (http.Handler, string) {
	if upgradeType(r.Header) != "" {
		// An upgraded connection has no response to store: it is forwarded as is,
		// claiming nothing (the middleware's capture refuses Hijack).
		return p.forward, routeUpgrade
	}
	if p.requiredMux != nil {
		// The pattern of the cleaned path too (a request for //v1/charges, which
		// ServeMux would redirect), so that an unclean path does not dodge the key.
		if _, pattern := p.requiredMux.Handler(r); pattern != "" {
			if h, ok := p.required[pattern]; ok {
				return h, pattern
			}
		}
	}
	if h, ok := p.byMethod[r.Method]; ok {
		return h, r.Method
	}
	return p.forward, routePassThrough
}

// upgradeType returns the protocol a request asks to switch to, or "": its Upgrade
// header when its Connection header lists "upgrade" (as ReverseProxy decides).
func upgradeType(h http.Header) string {
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return h.Get("Upgrade")
			}
		}
	}
	return ""
}

// scope is the middleware's Scope: the hex SHA-256 of the scope header's value.
func (p *Proxy) scope(r *http.Request) (string, error) {
	if p.scopeHeader == "" {
		return SharedScope, nil
	}
	v := r.Header[p.scopeHeader]
	if len(v) == 0 || (len(v) == 1 && v[0] == "") {
		return "", errNoScope
	}
	sum := sha256.Sum256([]byte(strings.Join(v, "\n")))
	return hex.EncodeToString(sum[:]), nil
}

var errNoScope = errors.New("proxy: no scope header")

// serveForward forwards r to the upstream. Under the middleware's claim (a protected
// request with its key acquired) the response goes through an exchange, which decides
// whether it can be stored whole.
func (p *Proxy) serveForward(w http.ResponseWriter, r *http.Request) {
	h := idem.FromContext(r.Context())
	if h == nil {
		p.rp.ServeHTTP(w, r)
		return
	}
	x := &exchange{p: p, h: h, w: w, r: r}
	p.rp.ServeHTTP(x, r.WithContext(context.WithValue(r.Context(), exchangeKey{}, x)))
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
	if p.upstreamKeyHeader != "" {
		if h := idem.FromContext(pr.In.Context()); h != nil {
			out.Set(p.upstreamKeyHeader, h.ForeignKey(ForeignKeyStep))
		}
	}
}

// upstreamFailed is the ReverseProxy's ErrorHandler: 504 upstream_timeout when the
// upstream's headers did not come in time, 502 upstream_unavailable otherwise. Under a
// claim both release the key (SPEC §6: every 5xx).
func (p *Proxy) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	status, code, detail := http.StatusBadGateway, CodeUpstreamUnavailable, "The upstream service could not be reached; retry later."
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		status, code, detail = http.StatusGatewayTimeout, CodeUpstreamTimeout, "The upstream service did not answer in time; it may have acted."
	}
	level := slog.LevelWarn
	if r.Context().Err() != nil {
		// The client went away (or, under a claim, the lease was lost, which the
		// middleware answers 503): nothing went wrong upstream.
		level = slog.LevelDebug
	}
	p.logger.Log(r.Context(), level, "idem proxy: the upstream exchange failed", "method", r.Method, "path", r.URL.Path,
		"status", status, "error", err)
	idem.WriteProblem(w, r, p.profile, &idem.Problem{Status: status, Code: code, Type: "api_error", Detail: detail})
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
