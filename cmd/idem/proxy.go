package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/internal/proxy"
)

const proxySynopsis = `--upstream URL [--addr 127.0.0.1:8081] [--store URL]
                  [--scope-header Authorization] [--key-header Idempotency-Key]
                  [--methods POST,PATCH] [--require-key 'METHOD PATTERN']...
                  [--upstream-key-header Idempotency-Key] [--on-lapse unknown|take_over]
                  [--ttl 24h] [--lock-timeout 30s] [--profile seed|ietf] [--replay-cache 0]
                  [--max-stored-body 1048576] [--stored-header NAME]...
                  [--scope-cookie NAME] [--route 'METHOD PATTERN']...
                  [--upstream-timeout 60s] [--upstream-wait-limit 10m]
                  [--max-buffered-bodies 67108864] [--max-buffered-bodies-per-client N]
                  [--client-address-header NAME] [--min-upload-rate 1024]
                  [--auth-url URL] [--auth-header NAME]... [--auth-principal-header X-Principal]
                  [--auth-timeout 5s] [--max-in-flight-per-principal 256]
                  [--max-stored-bytes-per-principal 268435456] [--quota-window 10m]
                  [--shutdown-grace 25s] [--access-log] [--health-path /healthz]
                  [--upstream-ca FILE] [--upstream-cert FILE --upstream-key FILE]
                  [--upstream-h2c] [--upstream-resends 3] [--not-forwarded-header NAME]
                  [--metrics-addr ADDR] ...

Serves as a reverse proxy in front of an HTTP API written in any language, and gives it
idempotency keys (SPEC §17): a POST or PATCH that carries an Idempotency-Key is claimed
in the store before it is forwarded; the upstream's response is stored (SPEC §6: 2xx,
3xx and most 4xx; 5xx but 502 and 504, and 400, 401, 403, 404, 408, 409, 413, 415, 422, 425, 429 release
the key) and replayed byte for byte with Idempotent-Replayed: true; a duplicate in
flight gets 409 request_in_progress, the same key with another body 409 key_reused.
Every other request, and a WebSocket upgrade on a route that does not require a key,
is forwarded untouched.

The upstream gets the request as sent (its Host, body and headers; X-Forwarded-For
extended) with Idempotency-Key replaced by a key derived from the scope, the key and
the request's fingerprint: the same for every proxy that takes the record over, and for
the retry of a released or lost record, so that an upstream that deduplicates by it
runs one request once (a key the upstream's own 500 released is retried under the same
derived key). The scope of a key is the hex SHA-256 of the --scope-header's value,
normalised ('bearer  x' is 'Bearer x'), or of the --scope-cookie; a keyed request
without it, with only empty values, or with a scheme alone ('Bearer'), gets 401
scope_required. With --auth-url, an auth endpoint is asked about every keyed request
first (nginx auth_request, Traefik ForwardAuth, Envoy ext_authz): its 2xx names the
principal, whose hash is the scope; its refusal goes to the client as it is; an
endpoint down or slow is 503 auth_unavailable, never a replay.

Nothing below the proxy re-sends a protected request: Go's HTTP transport would
re-send a keyed GET whose reply was lost on a kept-alive connection, and its HTTP/2
client a stream reset after the upstream acted; the proxy sends each once. What the
upstream provably did not process (an HTTP/2 stream refused with REFUSED_STREAM, or
above a GOAWAY's last stream id, as nginx sends past keepalive_requests and at a
reload) the proxy sends again itself, up to --upstream-resends times, under the same
derived key, counted; past that the key is released. Behind a gateway (nginx,
HAProxy), --not-forwarded-header names the header by which it marks a 5xx that never
reached the application, which then releases the key; docs/proxy.md has the
gateways' configurations (the read timeout above --upstream-wait-limit, no re-sends
of their own).

Not knowing is not failure: a key is released only when the request provably never
reached the upstream (the connection could not be made, or failed before the request
was written: 502 upstream_unavailable, and the retry executes once) or when the
upstream answered a releasing status. Everything else keeps the record and its derived
key:
  - an upstream that answers 502 or 504 (a gateway in front of it lost or timed out
    the reply): the client gets the answer, and the record is kept as below;
  - an upstream slower than --upstream-timeout: the client gets 504 upstream_timeout
    with Retry-After, and the proxy waits on (up to --upstream-wait-limit) and stores
    the answer; a retry meanwhile gets 409 request_in_progress, then the answer;
  - a reply lost after the request was written (a reset, an EOF, a body broken after
    the status, the wait limit, a shutdown while waiting): the outcome is unknown.
    By default (--on-lapse unknown) the client and every retry get 500
    outcome_unknown until an operator resolves the key ('idem keys resolve');
    --on-lapse take_over answers 502 upstream_reply_lost and forwards the retry again
    under the same derived key, which is safe only for an upstream that deduplicates
    by it. A proxy that dies mid-forward is the same, after its lease (--lock-timeout);
  - a response that cannot be stored whole (trailers, a body over --max-stored-body)
    passes through as it comes; repeats get 409 response_not_stored, never a second
    execution. An event stream (text/event-stream) passes through as it comes and is
    stored when it ends within --max-stored-body, so that a retry gets the same events.
A WebSocket upgrade (a GET with Upgrade: websocket) is forwarded untouched; any other
upgrade offer (h2c, as curl --http2 sends) is ignored and the request protected.
--require-key patterns match the path's common variants too (letter case, a trailing
slash, ;params, %2F, a format suffix such as .json), so that none sidesteps the key; a
WebSocket offer on such a route is ignored (the request wants its key).

One client cannot starve the rest: each principal, and each address, holds at most
--max-buffered-bodies-per-client of the body budget, a body slower than
--min-upload-rate is cut off (408), and a principal past --max-in-flight-per-principal
or --max-stored-bytes-per-principal per --quota-window gets 429 quota_exceeded with
Retry-After, nothing claimed. These bounds are per process.

It migrates the store's schema on start, cleans expired records in the background,
answers GET --health-path itself (200 when the store answers, and the upstream's
--upstream-health-path when set), serves Prometheus metrics on --metrics-addr, and
shuts down gracefully on SIGINT/SIGTERM, letting protected requests in flight finish
for up to --shutdown-grace (25s), those already answered 504 that wait for a slow
upstream included, so that a deploy stores their answers; what still waits then is
settled as outcome unknown. --store takes sqlite:PATH (sqlite:idem.db by default, in the
working directory; sqlite:/abs/path.db too), postgres://… or redis://…, as 'idem payments' does. Every flag can also be set by its
environment variable; the flag wins. docs/proxy.md shows the sidecar setup.`

// defaultShutdownGrace is --shutdown-grace's default: a few seconds under Kubernetes'
// default terminationGracePeriodSeconds (30 s), after which the pod is SIGKILLed.
const defaultShutdownGrace = 25 * time.Second

// proxyFlags are the flags of `idem proxy`.
type proxyFlags struct {
	recordFlags
	serverFlags
	upstream                                  string
	scopeHeader, keyHeader, upstreamKeyHeader string
	scopeCookie                               string
	methods, requireKey, storedHeaders        listFlag
	allowStoredHeaders                        listFlag
	routes                                    listFlag
	noStoreBody, fingerprintExcept            listFlag
	onLapse                                   lapseFlag
	inFlightWait                              time.Duration
	maxBodyBytes, maxStoredBody               int64
	maxBufferedBodies                         int64
	upstreamTimeout, upstreamIdleTimeout      time.Duration
	upstreamWaitLimit                         time.Duration
	healthPath, upstreamHealthPath            string
	accessLog                                 bool
	shutdownGrace                             time.Duration
	authURL, authPrincipalHeader              string
	authHeaders                               listFlag
	authTimeout                               time.Duration
	maxBufferedPerClient, minUploadRate       int64
	clientAddressHeader                       string
	maxInFlightPerPrincipal                   int
	maxStoredBytesPerPrincipal                int64
	quotaWindow                               time.Duration
	upstreamCA, upstreamCert, upstreamKey     string
	upstreamH2C                               bool
	upstreamResends                           int
	notForwardedHeader                        string
}

func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "idem proxy"
	f := proxyFlags{onLapse: lapseFlag(idem.LapseUnknown), methods: listFlag{values: proxy.DefaultMethods()},
		authHeaders: listFlag{values: proxy.DefaultAuthHeaders()}}
	fs := newFlagSet("proxy", proxySynopsis)
	f.serverFlags.register(fs, "127.0.0.1:8081")
	f.recordFlags.register(fs,
		"bound on each store call before a request is forwarded (claim, in-flight polls): past it the request gets 503 store_unavailable with Retry-After; also bounds connecting to PostgreSQL and Redis and each Redis read and write, unless the URL sets connect_timeout, dial_timeout, read_timeout or write_timeout",
		"bound on the store's migrations at start, waiting for another process's migration included: past it the command exits 1")
	fs.StringVar(&f.upstream, "upstream", "", "base `URL` of the API behind the proxy, http://host:port or https://host[:port][/path] (required)")
	fs.StringVar(&f.scopeHeader, "scope-header", proxy.DefaultScopeHeader, "request `header` whose value is the principal: a key's scope is the hex SHA-256 of it, and a keyed request without it gets 401 scope_required. '' puts every key in one scope, \"shared\", with no header needed (for an upstream without principals)")
	fs.StringVar(&f.scopeCookie, "scope-cookie", "", "`name` of the cookie whose value is the principal, instead of --scope-header: the scope is the hex SHA-256 of that one cookie (other cookies, such as an analytics id, do not change it); a keyed request without it, with it empty or twice gets 401 scope_required")
	fs.StringVar(&f.keyHeader, "key-header", idem.DefaultKeyHeader, "request `header` that carries the idempotency key")
	fs.Var(&f.methods, "methods", "`methods` whose requests are protected when they carry a key, comma-separated ('' for none: only the --require-key routes)")
	fs.Var(&f.requireKey, "require-key", "a route whose requests must carry a key (400 key_required without one), as a net/http ServeMux `pattern`: 'POST /v1/charges', 'POST /v1/orders/{id}/pay', '/v1/transfers/' (repeatable; several comma-separated)")
	fs.Var(&f.routes, "route", "a route that names protected requests in metrics and logs, as a net/http ServeMux `pattern` such as 'POST /v1/charges' (repeatable; several comma-separated; the --require-key patterns name their routes too; other protected requests are named by their method)")
	fs.StringVar(&f.upstreamKeyHeader, "upstream-key-header", proxy.DefaultUpstreamKeyHeader, "`header` that carries the derived key (SPEC §13: from the scope, key, fingerprint and step \"upstream\") to the upstream, replacing one the client sent ('' sends none)")
	fs.Var(&f.onLapse, "on-lapse", "`policy` of a retry that finds its key's holder (a proxy that died mid-forward) gone after its lease: unknown (answer 500 outcome_unknown until 'idem keys resolve': the upstream may or may not have acted) or take_over (forward again under the same derived key, for an upstream that deduplicates by it)")
	fs.DurationVar(&f.inFlightWait, "in-flight-wait", idem.DefaultInFlightWait, "how long a duplicate of a request still in flight waits for it to finish and gets its replay, before it answers 409 request_in_progress (0: answer at once)")
	fs.Int64Var(&f.maxBodyBytes, "max-body-bytes", idem.DefaultMaxBodyBytes, "largest request body of a protected request, in `bytes`: a larger one is refused 413 body_too_large (other requests are forwarded as they come)")
	fs.Int64Var(&f.maxStoredBody, "max-stored-body", proxy.DefaultMaxStoredBody, "largest response body stored, in `bytes`: a larger one is passed through, and repeats of its key get 409 response_not_stored (an event stream is stored when it ends within it)")
	fs.Int64Var(&f.maxBufferedBodies, "max-buffered-bodies", proxy.DefaultMaxBufferedBodies, "bound on the `bytes` of request bodies that protected requests hold at once, all connections together: a request whose body would pass it gets 503 proxy_busy with Retry-After")
	fs.Var(&f.storedHeaders, "stored-header", "a response `header` stored and replayed besides Content-Type, Content-Encoding, Content-Language, Content-Disposition, Location, ETag, Last-Modified, Link, Cache-Control and Vary (repeatable; several comma-separated; never a credential (Authorization, Cookie, Set-Cookie, X-Api-Key, WWW-Authenticate…), Date or hop-by-hop headers; a name holding token, auth, key, secret, session, csrf or cookie only with --allow-stored-header)")
	fs.Var(&f.allowStoredHeaders, "allow-stored-header", "a `header` whose name looks like a credential's (X-Auth-Token, Api-Key, X-CSRF-Token…) that --stored-header may store and replay nonetheless: it is not one (repeatable; several comma-separated)")
	fs.Var(&f.noStoreBody, "no-store-body", "a route whose responses mint secrets (a card's token, an API key) and keep their outcome only, as a net/http ServeMux `pattern` such as 'POST /v1/api_keys': its response goes to the client and only its status is stored; a retry gets 409 response_not_stored and is never forwarded again (repeatable; several comma-separated)")
	fs.Var(&f.fingerprintExcept, "fingerprint-except", "a JSON member of the request body left out of its fingerprint, by `name` (top-level), dotted path (card.number) or JSON Pointer (/card/number), so that card fields need not enter it; the rest of the body, the method, path and query still do (repeatable; several comma-separated)")
	fs.DurationVar(&f.upstreamTimeout, "upstream-timeout", proxy.DefaultUpstreamTimeout, "how long a client waits for the upstream's response headers: past it the client gets 504 upstream_timeout with Retry-After, and a protected request's exchange goes on (its record in flight) until the upstream answers, whose answer is stored for the retry, or --upstream-wait-limit passes")
	fs.DurationVar(&f.upstreamWaitLimit, "upstream-wait-limit", proxy.DefaultUpstreamWaitLimit, "bound on a protected request's whole exchange with the upstream, its wait past --upstream-timeout included: past it the outcome is unknown (--on-lapse says what a retry gets)")
	fs.DurationVar(&f.upstreamIdleTimeout, "upstream-idle-timeout", proxy.DefaultUpstreamIdleTimeout, "how long an idle connection to the upstream is kept; keep it below the upstream's keep-alive timeout (Node.js: 5s)")
	fs.DurationVar(&f.shutdownGrace, "shutdown-grace", defaultShutdownGrace, "how long a shutdown (SIGTERM, SIGINT) lets protected requests under way finish, those answered 504 that wait for a slow upstream past --upstream-timeout included, so that their answers are stored: what is still waiting then is settled as outcome unknown. Keep it a few seconds under the orchestrator's kill timeout (Kubernetes: terminationGracePeriodSeconds, 30s)")
	fs.StringVar(&f.authURL, "auth-url", "", "forward authentication endpoint (nginx auth_request, Traefik ForwardAuth, Envoy ext_authz): every keyed request's --auth-header fields go to this `URL` in a GET, with X-Forwarded-Method, -Uri, -Host, -Proto and -For, before anything is claimed, replayed or buffered; a 2xx names the principal in --auth-principal-header, which becomes the scope (--scope-header and --scope-cookie are then unused); any other answer goes to the client as it is; an endpoint down or slower than --auth-timeout gets 503 auth_unavailable (default: none)")
	fs.Var(&f.authHeaders, "auth-header", "a request `header` sent to --auth-url (repeatable; several comma-separated; default Authorization,Cookie)")
	fs.StringVar(&f.authPrincipalHeader, "auth-principal-header", proxy.DefaultAuthPrincipalHeader, "`header` of the auth endpoint's 2xx answer that names the principal")
	fs.DurationVar(&f.authTimeout, "auth-timeout", proxy.DefaultAuthTimeout, "bound on each question to --auth-url, connecting included: past it the client gets 503 auth_unavailable with Retry-After")
	fs.Int64Var(&f.maxBufferedPerClient, "max-buffered-bodies-per-client", 0, "bound on the `bytes` of request bodies one client holds at once within --max-buffered-bodies: a request is charged to its principal and, apart, to its address (--client-address-header), and past either share gets 503 proxy_busy (default: a quarter of --max-buffered-bodies)")
	fs.StringVar(&f.clientAddressHeader, "client-address-header", "", "request `header` that carries the client's address, as a load balancer in front of the proxy sets it (X-Forwarded-For: its last address; X-Real-IP), for --max-buffered-bodies-per-client; only one that a trusted proxy sets (default: the connection's peer address)")
	fs.Int64Var(&f.minUploadRate, "min-upload-rate", proxy.DefaultMinUploadRate, "least rate, in `bytes` per second over each 10 s, at which a protected request's body must arrive until it ends: a slower one is cut off with 408 upload_too_slow, nothing claimed (-1: no minimum)")
	fs.IntVar(&f.maxInFlightPerPrincipal, "max-in-flight-per-principal", idem.DefaultMaxInFlightPerScope, "bound on the keyed `requests` of one principal under way in this process at once: past it 429 quota_exceeded with Retry-After, nothing claimed (-1: none; per process: N proxies allow N times as many)")
	fs.Int64Var(&f.maxStoredBytesPerPrincipal, "max-stored-bytes-per-principal", idem.DefaultMaxStoredBytesPerScope, "bound on the `bytes` of responses one principal stores in this process per --quota-window: past it its new keys get 429 quota_exceeded with Retry-After (the rest of the window), nothing claimed, its retries still replayed (-1: none; per process)")
	fs.DurationVar(&f.quotaWindow, "quota-window", idem.DefaultQuotaWindow, "the window of --max-stored-bytes-per-principal")
	fs.BoolVar(&f.accessLog, "access-log", false, "log one line per request, at info level (shown at the default --log-level info): method, route, status, outcome (forwarded, replayed, answered, not_sent, outcome_unknown, upstream_timeout), duration, bytes and the key's short hash, never the key or a credential")
	fs.StringVar(&f.healthPath, "health-path", "/healthz", "`path` the proxy answers itself on GET and HEAD: 200 when the store answers (and the upstream, with --upstream-health-path), 503 otherwise ('' forwards every path)")
	fs.StringVar(&f.upstreamHealthPath, "upstream-health-path", "", "`path` of the upstream that --health-path also GETs, wanting 2xx or 3xx, over the protocol the proxy speaks to it, so that an upstream speaking another (h2c without --upstream-h2c) fails it (default: the upstream is not checked)")
	fs.StringVar(&f.upstreamCA, "upstream-ca", "", "PEM `file` of the certificates that an https upstream's certificate must chain to, instead of the system's roots (a private CA)")
	fs.StringVar(&f.upstreamCert, "upstream-cert", "", "PEM `file` of the client certificate the proxy presents to an https upstream (mutual TLS, as service meshes require), with --upstream-key")
	fs.StringVar(&f.upstreamKey, "upstream-key", "", "PEM `file` of the private key of --upstream-cert")
	fs.BoolVar(&f.upstreamH2C, "upstream-h2c", false, "speak HTTP/2 without TLS (h2c, prior knowledge) to an http:// upstream, such as a gRPC gateway or a sidecar that only speaks h2c (default: HTTP/1.1; an https upstream negotiates HTTP/2 by itself)")
	fs.IntVar(&f.upstreamResends, "upstream-resends", proxy.DefaultUpstreamResends, "how often a protected request that the upstream provably did not process (an HTTP/2 stream refused, or above a GOAWAY's last stream id) is sent again, under the same derived key, before its key is released (-1: never; it is released at once)")
	fs.StringVar(&f.notForwardedHeader, "not-forwarded-header", "", "response `header` by which a trusted gateway in front of the application marks a 5xx it answered without forwarding the request (it could not connect, no live server): such an answer releases the key instead of keeping it unknown, and the header is not passed on; docs/proxy.md has nginx's and HAProxy's configurations (default: none)")
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	storeURL, cfg, err := f.validate()
	if err != nil {
		return usageError(stderr, fs, err.Error())
	}
	logger, libLogger := f.loggers(stderr)
	// What the standard library logs itself (http.Transport's line about an
	// unsolicited response quotes the upstream's bytes) goes through the same handler,
	// in --log-format, rather than raw to stderr.
	slog.SetDefault(libLogger)

	st, err := openStore(ctx, storeURL, libLogger, &idem.CleanerConfig{Retention: f.retention, Logger: libLogger}, false)
	if err != nil {
		return failure(stderr, name, err)
	}
	defer st.close()
	if err := migrateWithin(ctx, f.migrateTimeout, migration{"the store " + storeURL.String(), st.migrate}); err != nil {
		return failure(stderr, name, err)
	}
	if _, err := st.check(ctx, f.migrateTimeout); err != nil {
		return failure(stderr, name, err)
	}
	var m *metrics
	if f.metricsAddr != "" {
		m = newMetrics()
		cfg.Idem.Observer = m.observer()
		cfg.Hooks = m.proxyHooks()
	}
	ring, closeKeys, err := f.keyring(ctx, st.store, logger)
	if err != nil {
		return failure(stderr, name, err)
	}
	defer closeKeys()
	// The access log's lines are at info level: they go to the command's logger, at
	// --log-level (info by default), not the library's (warn unless debug).
	cfg.Idem.Store, cfg.Idem.Seal, cfg.Idem.SealingOff, cfg.Logger, cfg.AccessLogger = st.store, ring, f.sealingOff, libLogger, logger
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
	// Protected requests under way, those answered 504 that wait past
	// --upstream-timeout included, get --shutdown-grace; then they are settled.
	apiL.srv.RegisterOnShutdown(func() { p.Shutdown(f.shutdownGrace) })

	listening := []any{"addr", apiL.ln.Addr().String(), "upstream", cfg.Upstream.String(), "store", storeURL.String(),
		"on_lapse", idem.LapsePolicy(f.onLapse).String(), "profile", cfg.Idem.Profile.String()}
	listening = append(listening, st.startAttrs(ctx)...)
	if metricsL.ln != nil {
		listening = append(listening, "metrics", metricsL.ln.Addr().String())
	}
	listening = append(listening, f.sealedAttrs(ring)...)
	logger.Info("idem proxy listening", listening...)
	return serve(ctx, name, apiL, metricsL, f.shutdownGrace+shutdownGrace, logger, stderr)
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
	"proxy: Config.Routes", "--route",
	"proxy: Config.NoStoreBody", "--no-store-body",
	"proxy: Config.ScopeCookie", "--scope-cookie",
	"proxy: Config.HealthPath", "--health-path",
	"proxy: Config.AuthURL", "--auth-url",
	"proxy: Config.AuthHeaders", "--auth-header",
	"proxy: Config.AuthPrincipalHeader", "--auth-principal-header",
	"proxy: Config.ClientAddressHeader", "--client-address-header",
	"proxy: Config.UpstreamHealthPath", "--upstream-health-path",
	"proxy: Config.UpstreamH2C", "--upstream-h2c",
	"proxy: Config.NotForwardedHeader", "--not-forwarded-header",
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
	for _, h := range f.storedHeaders.values {
		if err := admin.StoredHeaderError(h, f.allowStoredHeaders.values...); err != nil {
			return store, proxy.Config{}, fmt.Errorf("--stored-header: %w", err)
		}
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
	case f.upstreamWaitLimit < f.upstreamTimeout:
		return store, proxy.Config{}, fmt.Errorf("--upstream-wait-limit (%v) must not be shorter than --upstream-timeout (%v)", f.upstreamWaitLimit, f.upstreamTimeout)
	case f.authTimeout <= 0:
		return store, proxy.Config{}, fmt.Errorf("--auth-timeout must be positive, got %v", f.authTimeout)
	case f.maxBufferedPerClient < 0:
		return store, proxy.Config{}, fmt.Errorf("--max-buffered-bodies-per-client must not be negative, got %d", f.maxBufferedPerClient)
	case f.minUploadRate == 0:
		return store, proxy.Config{}, errors.New("--min-upload-rate must be positive, or -1 for no minimum")
	case f.maxInFlightPerPrincipal == 0 || f.maxStoredBytesPerPrincipal == 0:
		return store, proxy.Config{}, errors.New("--max-in-flight-per-principal and --max-stored-bytes-per-principal must be positive, or -1 for no bound")
	case f.quotaWindow <= 0:
		return store, proxy.Config{}, fmt.Errorf("--quota-window must be positive, got %v", f.quotaWindow)
	case f.authURL != "" && f.scopeCookie != "":
		return store, proxy.Config{}, errors.New("--auth-url and --scope-cookie exclude each other: the auth endpoint names the principal")
	case f.shutdownGrace < 0:
		return store, proxy.Config{}, fmt.Errorf("--shutdown-grace must not be negative, got %v", f.shutdownGrace)
	case f.maxBufferedBodies <= 0:
		return store, proxy.Config{}, fmt.Errorf("--max-buffered-bodies must be positive, got %d", f.maxBufferedBodies)
	case f.scopeCookie != "" && f.scopeHeader == "":
		return store, proxy.Config{}, errors.New("--scope-cookie and --scope-header '' exclude each other: a cookie's principal, or one shared scope")
	case f.upstreamResends == 0:
		return store, proxy.Config{}, errors.New("--upstream-resends must be positive, or -1 for no re-send")
	}
	var authURL *url.URL
	if f.authURL != "" {
		if err := checkBaseURL("--auth-url", f.authURL, "the auth endpoint"); err != nil {
			return store, proxy.Config{}, err
		}
		authURL, _ = url.Parse(f.authURL)
	}
	upstream, _ := url.Parse(f.upstream) // checkBaseURL parsed it
	upstreamTLS, err := f.upstreamTLS(upstream)
	if err != nil {
		return store, proxy.Config{}, err
	}
	cfg := proxy.Config{
		Upstream: upstream,
		Idem: idem.Config{
			TTL: f.ttl, Lease: f.lease, Retention: f.retention, StoreTimeout: f.storeTimeout, InFlightWait: f.inFlightWait,
			ReplayCacheSize: f.replayCache, Profile: profile, KeyHeader: f.keyHeader, MaxBodyBytes: f.maxBodyBytes,
			StoredHeaders:       f.storedHeaders.values,
			MaxInFlightPerScope: f.maxInFlightPerPrincipal, MaxStoredBytesPerScope: f.maxStoredBytesPerPrincipal, QuotaWindow: f.quotaWindow,
		},
		AuthURL: authURL, AuthHeaders: f.authHeaders.values, AuthPrincipalHeader: f.authPrincipalHeader, AuthTimeout: f.authTimeout,
		MaxBufferedBodiesPerClient: f.maxBufferedPerClient, ClientAddressHeader: f.clientAddressHeader, MinUploadRate: f.minUploadRate,
		ScopeHeader: f.scopeHeader, SharedScope: f.scopeHeader == "", ScopeCookie: f.scopeCookie,
		Methods: f.methods.values, RequireKey: f.requireKey.values, Routes: f.routes.values,
		UpstreamWaitLimit: f.upstreamWaitLimit, MaxBufferedBodies: f.maxBufferedBodies,
		UpstreamKeyHeader: f.upstreamKeyHeader, OmitUpstreamKey: f.upstreamKeyHeader == "",
		TakeOverOnLapse: idem.LapsePolicy(f.onLapse) == idem.LapseTakeOver,
		MaxStoredBody:   f.maxStoredBody, UpstreamTimeout: f.upstreamTimeout, UpstreamIdleTimeout: f.upstreamIdleTimeout,
		HealthPath: f.healthPath, UpstreamHealthPath: f.upstreamHealthPath, AccessLog: f.accessLog,
		UpstreamTLS: upstreamTLS, UpstreamH2C: f.upstreamH2C, UpstreamResends: f.upstreamResends,
		NotForwardedHeader: f.notForwardedHeader,
	}
	if f.keyHeader == "" {
		return store, cfg, errors.New("--key-header must not be empty")
	}
	cfg.NoStoreBody = f.noStoreBody.values
	if len(f.fingerprintExcept.values) > 0 {
		fp, err := fingerprintExcept(f.fingerprintExcept.values)
		if err != nil {
			return store, cfg, err
		}
		cfg.Idem.Fingerprint = fp
	}
	if err := cfg.Validate(); err != nil {
		return store, cfg, errors.New(proxyFlagNames.Replace(err.Error()))
	}
	return store, cfg, nil
}

// upstreamTLS is the TLS configuration of --upstream-ca, --upstream-cert and
// --upstream-key for an https upstream, or nil when none is set; errors name the flag.
func (f *proxyFlags) upstreamTLS(upstream *url.URL) (*tls.Config, error) {
	if f.upstreamCA == "" && f.upstreamCert == "" && f.upstreamKey == "" {
		return nil, nil
	}
	if upstream.Scheme != "https" {
		return nil, fmt.Errorf("--upstream-ca, --upstream-cert and --upstream-key configure TLS to an https:// upstream; --upstream is %s", upstream.Redacted())
	}
	c := &tls.Config{}
	if f.upstreamCA != "" {
		pem, err := os.ReadFile(f.upstreamCA)
		if err != nil {
			return nil, fmt.Errorf("--upstream-ca: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--upstream-ca %s: no PEM certificate in it", f.upstreamCA)
		}
	}
	if (f.upstreamCert == "") != (f.upstreamKey == "") {
		return nil, errors.New("--upstream-cert and --upstream-key go together: a client certificate and its private key")
	}
	if f.upstreamCert != "" {
		cert, err := tls.LoadX509KeyPair(f.upstreamCert, f.upstreamKey)
		if err != nil {
			return nil, fmt.Errorf("--upstream-cert, --upstream-key: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
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

// fingerprintExcept is idem.FingerprintJSONExcept of --fingerprint-except's names, or
// the error of a name it refuses.
func fingerprintExcept(names []string) (fp idem.FingerprintFunc, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("--fingerprint-except: %s", strings.TrimPrefix(fmt.Sprint(v), "idem: FingerprintJSONExcept: "))
		}
	}()
	return idem.FingerprintJSONExcept(names...), nil
}
