package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/proxy"
)

const proxySynopsis = `--upstream URL [--addr 127.0.0.1:8081] [--store URL]
                  [--scope-header Authorization] [--key-header Idempotency-Key]
                  [--methods POST,PATCH] [--require-key 'METHOD PATTERN']...
                  [--upstream-key-header Idempotency-Key] [--on-lapse unknown|take_over]
                  [--ttl 24h] [--lock-timeout 30s] [--profile seed|ietf] [--replay-cache 0]
                  [--max-stored-body 1048576] [--stored-header NAME]...
                  [--upstream-timeout 60s] [--health-path /healthz] [--metrics-addr ADDR] ...

Serves as a reverse proxy in front of an HTTP API written in any language, and gives it
idempotency keys (SPEC §17): a POST or PATCH that carries an Idempotency-Key is claimed
in the store before it is forwarded; the upstream's response is stored (SPEC §6: 2xx,
3xx and most 4xx; 5xx and 400, 401, 403, 404, 408, 409, 413, 415, 422, 425, 429 release
the key) and replayed byte for byte with Idempotent-Replayed: true; a duplicate in
flight gets 409 request_in_progress, the same key with another body 409 key_reused.
Every other request, and every protocol upgrade (WebSocket), is forwarded untouched.

The upstream gets the request as sent (its Host, body and headers; X-Forwarded-For
extended) with Idempotency-Key replaced by a key derived from the record, hex
SHA-256(record id ‖ "upstream"): the same for every proxy that takes the record over,
new when a key is released or expires. The scope of a key is the hex SHA-256 of the
--scope-header's value; a keyed request without it gets 401 scope_required.

A proxy that dies mid-forward cannot know whether the upstream acted. By default
(--on-lapse unknown) a retry after its lease (--lock-timeout) gets 500 outcome_unknown,
stored, until an operator resolves the key ('idem keys resolve'); --on-lapse take_over
forwards it again under the same derived key, which is safe only for an upstream that
deduplicates by that key.

A response that cannot be stored whole (text/event-stream, trailers, a body over
--max-stored-body) is passed through as it comes and the key released (a warning says
so): a retry executes again. An upstream that is down answers 502
upstream_unavailable, one whose headers do not come within --upstream-timeout 504
upstream_timeout (it may have acted); both release the key.

It migrates the store's schema on start, cleans expired records in the background,
answers GET --health-path itself (200 when the store answers, and the upstream's
--upstream-health-path when set), serves Prometheus metrics on --metrics-addr, and
shuts down gracefully on SIGINT/SIGTERM, letting requests in flight finish for up to
--upstream-timeout plus 15 s. Store URLs as for 'idem payments' (SQLite by default, in
the working directory; PostgreSQL; Redis). Every flag can also be set by its
environment variable; the flag wins. docs/proxy.md shows the sidecar setup.`

// proxyFlags are the flags of `idem proxy`.
type proxyFlags struct {
	recordFlags
	serverFlags
	upstream                                  string
	scopeHeader, keyHeader, upstreamKeyHeader string
	methods, requireKey, storedHeaders        listFlag
	onLapse                                   lapseFlag
	inFlightWait                              time.Duration
	maxBodyBytes, maxStoredBody               int64
	upstreamTimeout, upstreamIdleTimeout      time.Duration
	healthPath, upstreamHealthPath            string
}

func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "idem proxy"
	f := proxyFlags{onLapse: lapseFlag(idem.LapseUnknown), methods: listFlag{values: proxy.DefaultMethods()}}
	fs := newFlagSet("proxy", proxySynopsis)
	f.serverFlags.register(fs, "127.0.0.1:8081")
	f.recordFlags.register(fs,
		"bound on each store call before a request is forwarded (claim, in-flight polls): past it the request gets 503 store_unavailable with Retry-After; also bounds connecting to PostgreSQL and Redis and each Redis read and write, unless the URL sets connect_timeout, dial_timeout, read_timeout or write_timeout",
		"bound on the store's migrations at start, waiting for another process's migration included: past it the command exits 1")
	fs.StringVar(&f.upstream, "upstream", "", "base `URL` of the API behind the proxy, http://host:port or https://host[:port][/path] (required)")
	fs.StringVar(&f.scopeHeader, "scope-header", proxy.DefaultScopeHeader, "request `header` whose value is the principal: a key's scope is the hex SHA-256 of it, and a keyed request without it gets 401 scope_required. '' puts every key in one scope, \"shared\", with no header needed (for an upstream without principals)")
	fs.StringVar(&f.keyHeader, "key-header", idem.DefaultKeyHeader, "request `header` that carries the idempotency key")
	fs.Var(&f.methods, "methods", "`methods` whose requests are protected when they carry a key, comma-separated ('' for none: only the --require-key routes)")
	fs.Var(&f.requireKey, "require-key", "a route whose requests must carry a key (400 key_required without one), as a net/http ServeMux `pattern`: 'POST /v1/charges', 'POST /v1/orders/{id}/pay', '/v1/transfers/' (repeatable; several comma-separated)")
	fs.StringVar(&f.upstreamKeyHeader, "upstream-key-header", proxy.DefaultUpstreamKeyHeader, "`header` that carries the derived key, hex SHA-256(record id ‖ \"upstream\"), to the upstream, replacing one the client sent ('' sends none)")
	fs.Var(&f.onLapse, "on-lapse", "`policy` of a retry that finds its key's holder (a proxy that died mid-forward) gone after its lease: unknown (answer 500 outcome_unknown until 'idem keys resolve': the upstream may or may not have acted) or take_over (forward again under the same derived key, for an upstream that deduplicates by it)")
	fs.DurationVar(&f.inFlightWait, "in-flight-wait", idem.DefaultInFlightWait, "how long a duplicate of a request still in flight waits for it to finish and gets its replay, before it answers 409 request_in_progress (0: answer at once)")
	fs.Int64Var(&f.maxBodyBytes, "max-body-bytes", idem.DefaultMaxBodyBytes, "largest request body of a protected request, in `bytes`: a larger one is refused 413 body_too_large (other requests are forwarded as they come)")
	fs.Int64Var(&f.maxStoredBody, "max-stored-body", proxy.DefaultMaxStoredBody, "largest response body stored, in `bytes`: a larger one is passed through and the key released")
	fs.Var(&f.storedHeaders, "stored-header", "a response `header` stored and replayed besides Content-Type, Content-Encoding, Content-Language, Content-Disposition, Location, ETag, Last-Modified, Link, Cache-Control and Vary (repeatable; several comma-separated; never Set-Cookie, Date or hop-by-hop headers)")
	fs.DurationVar(&f.upstreamTimeout, "upstream-timeout", proxy.DefaultUpstreamTimeout, "bound on the wait for the upstream's response headers: past it the client gets 504 upstream_timeout and the key is released (the body then streams as long as the upstream sends it)")
	fs.DurationVar(&f.upstreamIdleTimeout, "upstream-idle-timeout", proxy.DefaultUpstreamIdleTimeout, "how long an idle connection to the upstream is kept; keep it below the upstream's keep-alive timeout (Node.js: 5s)")
	fs.StringVar(&f.healthPath, "health-path", "/healthz", "`path` the proxy answers itself on GET and HEAD: 200 when the store answers (and the upstream, with --upstream-health-path), 503 otherwise ('' forwards every path)")
	fs.StringVar(&f.upstreamHealthPath, "upstream-health-path", "", "`path` of the upstream that --health-path also GETs, wanting 2xx or 3xx (default: the upstream is not checked)")
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	storeURL, cfg, err := f.validate()
	if err != nil {
		return usageError(stderr, fs, err.Error())
	}
	logger, libLogger := f.loggers(stderr)

	st, err := openStore(ctx, storeURL, libLogger, &idem.CleanerConfig{Retention: f.retention, Logger: libLogger}, false)
	if err != nil {
		return failure(stderr, name, err)
	}
	defer st.close()
	if err := migrateWithin(ctx, f.migrateTimeout, migration{"the store " + storeURL.String(), st.migrate}); err != nil {
		return failure(stderr, name, err)
	}
	var m *metrics
	if f.metricsAddr != "" {
		m = newMetrics()
		cfg.Idem.Observer = m.observer()
	}
	cfg.Idem.Store, cfg.Logger = st.store, libLogger
	p, err := proxy.New(cfg)
	if err != nil { // what Validate does not see: the middleware's own checks
		return usageError(stderr, fs, proxyFlagNames.Replace(err.Error()))
	}
	var h http.Handler = p
	if m != nil {
		h = m.instrument(p.Route, h)
	}
	apiL, metricsL, err := f.listen(ctx, h, m, libLogger)
	if err != nil {
		return failure(stderr, name, err)
	}
	defer apiL.close()
	defer metricsL.close()

	listening := []any{"addr", apiL.ln.Addr().String(), "upstream", cfg.Upstream.String(), "store", storeURL.String(),
		"on_lapse", idem.LapsePolicy(f.onLapse).String(), "profile", cfg.Idem.Profile.String()}
	if metricsL.ln != nil {
		listening = append(listening, "metrics", metricsL.ln.Addr().String())
	}
	logger.Info("idem proxy listening", listening...)
	return serve(ctx, name, apiL, metricsL, shutdownGrace+f.upstreamTimeout, logger, stderr)
}

// proxyFlagNames turns the fields that proxy.Config.Validate and idem.New name into
// the flags that set them.
var proxyFlagNames = strings.NewReplacer(
	"proxy: Config.Idem: idem: Config.StoredHeaders", "--stored-header",
	"proxy: Config.Idem.KeyHeader", "--key-header",
	"proxy: Config.UpstreamKeyHeader", "--upstream-key-header",
	"proxy: Config.ScopeHeader", "--scope-header",
	"proxy: Config.Methods", "--methods",
	"proxy: Config.RequireKey", "--require-key",
	"proxy: Config.HealthPath", "--health-path",
	"proxy: Config.UpstreamHealthPath", "--upstream-health-path",
	"proxy: Config.Idem: ", "",
)

// validate checks the flags and returns the store's URL and the proxy's Config
// without its store, logger and observer; errors name the flag.
func (f *proxyFlags) validate() (storeURL, proxy.Config, error) {
	store, profile, err := f.recordFlags.validate()
	if err != nil {
		return store, proxy.Config{}, err
	}
	if err := f.serverFlags.validate(); err != nil {
		return store, proxy.Config{}, err
	}
	if f.upstream == "" {
		return store, proxy.Config{}, errors.New("--upstream is required: the base URL of the API behind the proxy, such as http://127.0.0.1:3000")
	}
	if err := checkBaseURL("--upstream", f.upstream, "the API's base URL, optionally with a path"); err != nil {
		return store, proxy.Config{}, err
	}
	switch {
	case f.inFlightWait < 0:
		return store, proxy.Config{}, fmt.Errorf("--in-flight-wait must not be negative, got %v", f.inFlightWait)
	case f.maxBodyBytes <= 0:
		return store, proxy.Config{}, fmt.Errorf("--max-body-bytes must be positive, got %d", f.maxBodyBytes)
	case f.maxStoredBody <= 0:
		return store, proxy.Config{}, fmt.Errorf("--max-stored-body must be positive, got %d", f.maxStoredBody)
	case f.upstreamTimeout <= 0:
		return store, proxy.Config{}, fmt.Errorf("--upstream-timeout must be positive, got %v", f.upstreamTimeout)
	case f.upstreamIdleTimeout <= 0:
		return store, proxy.Config{}, fmt.Errorf("--upstream-idle-timeout must be positive, got %v", f.upstreamIdleTimeout)
	}
	upstream, _ := url.Parse(f.upstream) // checkBaseURL parsed it
	cfg := proxy.Config{
		Upstream: upstream,
		Idem: idem.Config{
			TTL: f.ttl, Lease: f.lease, Retention: f.retention, StoreTimeout: f.storeTimeout, InFlightWait: f.inFlightWait,
			ReplayCacheSize: f.replayCache, Profile: profile, KeyHeader: f.keyHeader, MaxBodyBytes: f.maxBodyBytes,
			StoredHeaders: f.storedHeaders.values,
		},
		ScopeHeader: f.scopeHeader, SharedScope: f.scopeHeader == "",
		Methods: f.methods.values, RequireKey: f.requireKey.values,
		UpstreamKeyHeader: f.upstreamKeyHeader, OmitUpstreamKey: f.upstreamKeyHeader == "",
		TakeOverOnLapse: idem.LapsePolicy(f.onLapse) == idem.LapseTakeOver,
		MaxStoredBody:   f.maxStoredBody, UpstreamTimeout: f.upstreamTimeout, UpstreamIdleTimeout: f.upstreamIdleTimeout,
		HealthPath: f.healthPath, UpstreamHealthPath: f.upstreamHealthPath,
	}
	if f.keyHeader == "" {
		return store, cfg, errors.New("--key-header must not be empty")
	}
	if err := cfg.Validate(); err != nil {
		return store, cfg, errors.New(proxyFlagNames.Replace(err.Error()))
	}
	return store, cfg, nil
}

// listFlag is a repeatable flag whose every value may list several items,
// comma-separated; its first value replaces the default.
type listFlag struct {
	values []string
	set    bool
}

func (l *listFlag) String() string { return strings.Join(l.values, ",") }

func (l *listFlag) Set(s string) error {
	if !l.set {
		l.values, l.set = []string{}, true
	}
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			l.values = append(l.values, v)
		}
	}
	return nil
}
