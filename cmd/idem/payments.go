package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/internal/payments"
)

const paymentsSynopsis = `[--addr 127.0.0.1:8080] [--store URL] [--db URL] [--ttl 24h]
                     [--retention 0s] [--lock-timeout 30s]
                     [--processor-latency 0s | --processor-url URL]
                     [--processor-timeout 10s] [--completer-interval 10s]
                     [--charge-on-lapse take_over|unknown]
                     [--profile seed|ietf]
                     [--disable-idempotency] [--replay-cache 0] [--metrics-addr ADDR]
                     [--log-format text|json] [--log-level info]
                     [--store-timeout 5s] [--migrate-timeout 1m]
                     [--read-header-timeout 10s] [--read-timeout 30s]
                     [--idle-timeout 60s] [--max-header-bytes 32768]

Serves the reference payments API (POST/GET /v1/charges, /v1/orders, GET /healthz),
and with --metrics-addr its Prometheus metrics (GET /metrics) on a listener of its own.
It migrates the store's and the payments schema on start (safe when several processes
start at once), cleans expired records in the background (keeping them --retention
after they expire; Redis expires them itself), and shuts down gracefully on
SIGINT/SIGTERM.

Store URLs: sqlite:PATH or sqlite://PATH (sqlite:///abs/path), postgres://… or
postgresql://… (pgx's URL; pool_max_conns=N overrides the pool size),
redis://[user:password@]host:port[/db] or rediss://… (TLS) for one Redis, and
redis+cluster://host:port?addr=host:port&addr=… (rediss+cluster:// for TLS) for a
Redis Cluster; go-redis options go in the query (dial_timeout=1s, max_retries=-1).
A Redis store needs --db, an SQL database for charges and orders, whose unique
(principal, key) constraint keeps a charge single even when Redis loses a record
(docs/redis.md). Pools: SQLite 8
connections (WAL: readers run beside the one writer), PostgreSQL 32; the simulated card
processor holds no connection, so far more requests can be in flight.

Bounds (docs/operations.md): a store that stops answering costs a keyed request at
most --store-timeout before it is answered 503 store_unavailable with Retry-After, a
GET of charges or orders as long before 503 db_unavailable, and GET /healthz at most
2 s before 503; a migration at start that cannot finish within --migrate-timeout (a
lock held by a stuck process, a database that stopped answering) exits 1; a client holds a connection no longer than the
read and idle timeouts allow, and request-body memory that grows with the bytes it
sent, never with the Content-Length it announced.

--log-level debug adds a log line per request. Every flag can also be set by its
environment variable (IDEM_STORE, IDEM_DB, …), so that passwords need not appear on
a command line; the flag wins.`

// Shutdown bounds.
const (
	// shutdownGrace bounds how long in-flight requests may take to finish after
	// SIGINT/SIGTERM, on top of --processor-latency.
	shutdownGrace = 15 * time.Second
	// minLease is the shortest --lock-timeout: the lease is renewed every third of it.
	minLease = 100 * time.Millisecond
)

// paymentsFlags are the flags of `idem payments`.
type paymentsFlags struct {
	addr, store, db, profile string
	// processorURL is the card processor's base URL (idem processor); empty: none.
	processorURL     string
	processorTimeout time.Duration
	// completerInterval is the pause between passes of the completer (SPEC §13).
	completerInterval time.Duration
	// chargeOnLapse is the policy of a charge whose key's holder died (SPEC §5.3).
	chargeOnLapse       lapseFlag
	ttl, lease, latency time.Duration
	// retention keeps expired records this long before the cleaner deletes them.
	retention          time.Duration
	disableIdempotency bool
	replayCache        int
	log                logFlags
	// Bounds on a stalled store (SPEC §9) and on what a client can hold (SPEC §15).
	storeTimeout, migrateTimeout                time.Duration
	readHeaderTimeout, readTimeout, idleTimeout time.Duration
	maxHeaderBytes                              int
	// metricsAddr is the metrics listener's address; empty: no metrics listener.
	metricsAddr string
}

// Calls to the card processor (--processor-url).
const (
	// defaultProcessorTimeout bounds each attempt of a call to the processor.
	defaultProcessorTimeout = 10 * time.Second
	// processorAttempts is the most attempts of one processor call; the client
	// package's budget and the request's lease bound them too. With the Transport's
	// backoff (100 ms doubling to 5 s, full jitter) eight attempts wait 11 s at most.
	processorAttempts = 8
)

// processorClient returns the http.Client of the calls to the card processor: the
// client package's Transport (retries with backoff, Retry-After and a budget, the key
// and body kept across attempts) over connections whose every attempt must be
// answered within timeout.
func processorClient(timeout time.Duration, logger *slog.Logger) *http.Client {
	return client.NewClient(&client.Transport{
		Base: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
			ResponseHeaderTimeout: timeout,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       30 * time.Second,
		},
		MaxAttempts: processorAttempts,
		Logger:      logger,
	})
}

// Defaults of the server's bounds on clients (SPEC §15).
const (
	// defaultReadHeaderTimeout bounds reading a request's headers.
	defaultReadHeaderTimeout = 10 * time.Second
	// defaultReadTimeout bounds reading a whole request, body included: a 1 MiB body
	// at 50 kB/s arrives in about 20 s.
	defaultReadTimeout = 30 * time.Second
	// defaultIdleTimeout bounds how long a kept-alive connection waits for its next
	// request.
	defaultIdleTimeout = 60 * time.Second
	// defaultMaxHeaderBytes bounds a request's header block (an API's headers are a
	// few hundred bytes; net/http's own default is 1 MiB).
	defaultMaxHeaderBytes = 32 << 10
	// defaultMigrateTimeout bounds the migrations at start, waiting for another
	// process's migration included: they take milliseconds, or the time of another
	// process's migration, unless something is stuck.
	defaultMigrateTimeout = time.Minute
)

func runPayments(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "idem payments"
	var f paymentsFlags
	fs := newFlagSet("payments", paymentsSynopsis)
	f.log.register(fs)
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8080", "`host:port` to listen on (port 0 picks a free one; the start line logs it)")
	fs.StringVar(&f.store, "store", defaultStore, "idempotency store `URL`")
	fs.StringVar(&f.db, "db", "", "`URL` of the SQL database keeping charges and orders (default: the --store URL when it is SQL; required with Redis)")
	fs.DurationVar(&f.ttl, "ttl", idem.DefaultTTL, "how long an idempotency record lives after its creation (longer than --lock-timeout)")
	fs.DurationVar(&f.retention, "retention", idem.DefaultRetention, "how long the background cleaner keeps a record after it expired (for audits: inspect old keys with 'idem keys'); an expired record never answers a request, kept or not")
	fs.DurationVar(&f.lease, "lock-timeout", idem.DefaultLease, "lease of a claimed key: after it lapses without renewal another request may take the key over (at least 100ms)")
	fs.DurationVar(&f.latency, "processor-latency", 0, "simulated card-processor call: POST /v1/charges sleeps this long after the claim, holding no transaction or connection")
	fs.StringVar(&f.processorURL, "processor-url", "", "base `URL` of a card processor (idem processor, e.g. http://127.0.0.1:8090) that POST /v1/charges charges through, with recovery points (SPEC §13); exclusive with --processor-latency")
	fs.DurationVar(&f.processorTimeout, "processor-timeout", defaultProcessorTimeout, "bound on each attempt of a call to the card processor (--processor-url)")
	fs.DurationVar(&f.completerInterval, "completer-interval", idem.DefaultCompleterInterval, "with --processor-url, the pause between passes of the completer, which finishes charges whose client gave up after they were recorded pending (a charge waits at most --lock-timeout plus this)")
	fs.Var(&f.chargeOnLapse, "charge-on-lapse", "`policy` of a charge without --processor-url that finds its key's holder died: take_over (charge again) or unknown (answer 500 outcome_unknown until 'idem keys resolve', for a processor that cannot deduplicate a charge)")
	fs.StringVar(&f.profile, "profile", "seed", "shape of the middleware's errors: seed (Stripe's) or ietf (RFC 9457 problem details)")
	fs.BoolVar(&f.disableIdempotency, "disable-idempotency", false, "serve the same API without the idempotency middleware (to measure its cost)")
	fs.IntVar(&f.replayCache, "replay-cache", 0, "keep up to `N` completed responses in memory so that replays skip the store (idem.Config.ReplayCacheSize; 0, the default, is off: the library's default)")
	fs.DurationVar(&f.storeTimeout, "store-timeout", idem.DefaultStoreTimeout, "bound on each store call before the handler runs (claim, in-flight polls): past it the request gets 503 store_unavailable with Retry-After; also bounds each read of the payments database by GET /v1/charges and /v1/orders/{id} (503 db_unavailable), connecting to PostgreSQL and Redis and each Redis read and write, unless the URL sets connect_timeout, dial_timeout, read_timeout or write_timeout")
	fs.DurationVar(&f.migrateTimeout, "migrate-timeout", defaultMigrateTimeout, "bound on the migrations of the store and the payments tables at start, waiting for another process's migration included: past it the command exits 1")
	fs.DurationVar(&f.readHeaderTimeout, "read-header-timeout", defaultReadHeaderTimeout, "bound on reading a request's headers; past it the connection is closed")
	fs.DurationVar(&f.readTimeout, "read-timeout", defaultReadTimeout, "bound on reading a whole request, body included; past it the connection is closed and the request is not served (a keyed request is refused 400 body_unreadable, storing nothing)")
	fs.DurationVar(&f.idleTimeout, "idle-timeout", defaultIdleTimeout, "how long a kept-alive connection may wait for its next request before it is closed")
	fs.IntVar(&f.maxHeaderBytes, "max-header-bytes", defaultMaxHeaderBytes, "largest request header block, in `bytes`; a larger one is refused with 431")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "`host:port` of a listener of its own serving Prometheus metrics at GET /metrics, such as 127.0.0.1:9090 (default: none, no metrics are served). It has no authentication: keep it on loopback or a private network")
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	storeURL, dbURL, profile, err := f.validate()
	if err != nil {
		return usageError(stderr, fs, err.Error())
	}

	level := f.log.level
	logger := f.log.logger(stderr, level)
	// Libraries log at warn and above unless debugging, so that the start line is the
	// only line a healthy start prints.
	libLevel := slog.LevelWarn
	if level <= slog.LevelDebug {
		libLevel = level
	}
	libLogger := f.log.logger(stderr, libLevel)

	// The store's own cleaner deletes expired records in the background, keeping them
	// --retention past their expiry; a Redis store expires them itself.
	var cleaner *idem.CleanerConfig
	if !f.disableIdempotency {
		cleaner = &idem.CleanerConfig{Retention: f.retention, Logger: libLogger}
	}
	st, err := openStore(ctx, storeURL, libLogger, cleaner, false)
	if err != nil {
		return failure(stderr, name, err)
	}
	defer st.close()
	db, closeDB, err := openDB(ctx, dbURL, st)
	if err != nil {
		return failure(stderr, name, err)
	}
	defer closeDB()
	if err := migrateAtStart(ctx, f.migrateTimeout, st, db, storeURL, dbURL); err != nil {
		return failure(stderr, name, err)
	}

	// Metrics cost nothing unless served: without --metrics-addr the middleware has
	// no observer and the API no instrumentation.
	var m *metrics
	var observer *idem.Observer
	if f.metricsAddr != "" {
		m = newMetrics()
		observer = m.observer()
	}
	api := payments.New(payments.Config{
		Store: st.store, DB: db, Profile: profile, TTL: f.ttl, Lease: f.lease,
		ProcessorLatency: f.latency, ProcessorURL: f.processorURL, ProcessorClient: processorClient(f.processorTimeout, libLogger),
		ChargeOnLapse: idem.LapsePolicy(f.chargeOnLapse), DisableIdempotency: f.disableIdempotency, Logger: libLogger,
		ReplayCacheSize: f.replayCache, StoreTimeout: f.storeTimeout, DBReadTimeout: f.storeTimeout, Observer: observer,
	})
	apiHandler := api.Handler()
	if m != nil {
		apiHandler = m.instrument(api.Pattern, apiHandler)
	}
	newServer := func(h http.Handler) *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: f.readHeaderTimeout,
			ReadTimeout:       f.readTimeout,
			IdleTimeout:       f.idleTimeout,
			MaxHeaderBytes:    f.maxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(libLogger.Handler(), slog.LevelWarn),
			BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		}
	}
	var listening []any // the start line's attributes of the listeners
	apiL := listener{srv: newServer(apiHandler)}
	if apiL.ln, err = net.Listen("tcp", f.addr); err != nil {
		return failure(stderr, name, err)
	}
	defer apiL.ln.Close()
	listening = append(listening, "addr", apiL.ln.Addr().String())
	var metrics listener
	if m != nil {
		metrics.srv = newServer(m.handler())
		if metrics.ln, err = net.Listen("tcp", f.metricsAddr); err != nil {
			return failure(stderr, name, fmt.Errorf("--metrics-addr: %w", err))
		}
		defer metrics.ln.Close()
	}

	if f.processorURL != "" && !f.disableIdempotency {
		// Finishes the charges whose client gave up after they were recorded pending.
		completerCtx, stopCompleter := context.WithCancel(context.WithoutCancel(ctx))
		defer stopCompleter()
		go idem.NewCompleter(api.Guard(), idem.CompleterConfig{Interval: f.completerInterval, Logger: libLogger}).Run(completerCtx)
	}

	idempotency := "on"
	if f.disableIdempotency {
		idempotency = "off"
	}
	listening = append(listening, "store", storeURL.String(), "db", dbURL.String(),
		"profile", profile.String(), "idempotency", idempotency)
	if f.processorURL != "" {
		listening = append(listening, "processor", redact(f.processorURL))
	}
	if metrics.ln != nil {
		listening = append(listening, "metrics", metrics.ln.Addr().String())
	}
	logger.Info("idem payments listening", listening...)
	return serve(ctx, name, apiL, metrics, shutdownGrace+f.latency, logger, stderr)
}

// migrateAtStart migrates the store and then the payments tables, within timeout (a
// lock that a stuck process holds, or a database that stopped answering, must not
// hang the start).
func migrateAtStart(ctx context.Context, timeout time.Duration, st *openedStore, db *payments.DB, storeURL, dbURL storeURL) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	explain := func(what string, err error) error {
		if ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("migrating %s did not finish within --migrate-timeout %v (another process holds the migration lock, or the database does not answer): %w", what, timeout, err)
		}
		return fmt.Errorf("migrating %s: %w", what, err)
	}
	if err := st.migrate(ctx); err != nil {
		return explain("the store "+storeURL.String(), err)
	}
	if _, err := db.Migrate(ctx); err != nil {
		return explain("the payments schema in "+dbURL.String(), err)
	}
	return nil
}

// listener is a server and the listener it serves; a zero listener serves nothing.
type listener struct {
	srv *http.Server
	ln  net.Listener
}

// serve serves the API of the command name ("idem payments") on api, and the metrics
// on metrics when it is set, until ctx ends (SIGINT/SIGTERM). Then the API stops accepting and lets in-flight requests
// finish within grace, while metrics can still be scraped; the metrics listener stops
// last. When either server fails, both stop.
func serve(ctx context.Context, name string, api, metrics listener, grace time.Duration, logger *slog.Logger, stderr io.Writer) int {
	running := []listener{api}
	if metrics.ln != nil {
		running = append(running, metrics)
	}
	errc := make(chan error, len(running))
	for _, l := range running {
		go func() { errc <- l.srv.Serve(l.ln) }()
	}
	closeAll := func() {
		for _, l := range running {
			_ = l.srv.Close()
		}
	}
	select {
	case err := <-errc:
		closeAll()
		return failure(stderr, name, err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	code := exitOK
	for _, l := range running {
		if err := l.srv.Shutdown(shutdownCtx); err != nil {
			logger.Warn(name+": in-flight requests did not finish in time", "err", err)
			closeAll()
			return exitFailure
		}
	}
	for range running {
		if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
			code = failure(stderr, name, err)
		}
	}
	if code == exitOK {
		logger.Info(name + " stopped")
	}
	return code
}

// validate checks the flags and parses the URLs; errors name the flag.
func (f *paymentsFlags) validate() (store, db storeURL, profile idem.Profile, err error) {
	if store, err = parseStoreURL(f.store); err != nil {
		return store, db, profile, fmt.Errorf("--store: %w", err)
	}
	switch {
	case f.db != "":
		if db, err = parseStoreURL(f.db); err != nil {
			return store, db, profile, fmt.Errorf("--db: %w", err)
		}
		if !db.sql() {
			return store, db, profile, fmt.Errorf("--db %q: the payments data needs an SQL database (sqlite: or postgres://)", db)
		}
	case store.sql():
		db = store
	default:
		return store, db, profile, errors.New("--db is required with a Redis store (sqlite:PATH or postgres://…)")
	}
	if profile, err = idem.ParseProfile(f.profile); err != nil {
		return store, db, profile, fmt.Errorf("--profile %q: want seed or ietf", f.profile)
	}
	switch {
	case f.ttl <= 0:
		err = fmt.Errorf("--ttl must be positive, got %v", f.ttl)
	case f.retention < 0:
		err = fmt.Errorf("--retention must not be negative, got %v", f.retention)
	case f.lease < minLease:
		err = fmt.Errorf("--lock-timeout must be at least %v, got %v", minLease, f.lease)
	case recordTTLError(f.ttl, f.lease) != nil:
		err = recordTTLError(f.ttl, f.lease)
	case f.replayCache < 0:
		err = fmt.Errorf("--replay-cache must not be negative, got %d", f.replayCache)
	case f.latency < 0:
		err = fmt.Errorf("--processor-latency must not be negative, got %v", f.latency)
	case f.processorURL != "" && f.latency != 0:
		err = errors.New("--processor-latency simulates a processor: it cannot go with --processor-url")
	case f.processorTimeout <= 0:
		err = fmt.Errorf("--processor-timeout must be positive, got %v", f.processorTimeout)
	case f.processorURL != "" && idem.LapsePolicy(f.chargeOnLapse) == idem.LapseUnknown:
		err = errors.New("--charge-on-lapse unknown is for charges without --processor-url: through the processor a lapsed charge resumes under its derived key (SPEC §13)")
	case f.completerInterval <= 0:
		err = fmt.Errorf("--completer-interval must be positive, got %v", f.completerInterval)
	case f.processorURL != "" && !f.disableIdempotency && (!store.sql() || db.raw != store.raw):
		// A charge's pending row and its record's recovery point commit in one
		// transaction (SPEC §13): one SQL database keeps both.
		err = errors.New("--processor-url needs an SQL --store that also keeps the payments data (no other --db): a charge and its record's recovery point commit together")
	case f.addr == "":
		err = errors.New("--addr must not be empty")
	case f.storeTimeout <= 0:
		err = fmt.Errorf("--store-timeout must be positive, got %v", f.storeTimeout)
	case f.migrateTimeout <= 0:
		err = fmt.Errorf("--migrate-timeout must be positive, got %v", f.migrateTimeout)
	case f.readHeaderTimeout <= 0:
		err = fmt.Errorf("--read-header-timeout must be positive, got %v", f.readHeaderTimeout)
	case f.readTimeout <= 0:
		err = fmt.Errorf("--read-timeout must be positive, got %v", f.readTimeout)
	case f.idleTimeout <= 0:
		err = fmt.Errorf("--idle-timeout must be positive, got %v", f.idleTimeout)
	case f.maxHeaderBytes < 1<<10:
		err = fmt.Errorf("--max-header-bytes must be at least 1024, got %d", f.maxHeaderBytes)
	}
	if err == nil && f.processorURL != "" {
		err = checkProcessorURL(f.processorURL)
	}
	if _, _, e := net.SplitHostPort(f.metricsAddr); err == nil && f.metricsAddr != "" && e != nil {
		err = fmt.Errorf("--metrics-addr %q: want host:port, such as 127.0.0.1:9090", f.metricsAddr)
	}
	store.timeout, db.timeout = f.storeTimeout, f.storeTimeout
	return store, db, profile, err
}

// checkProcessorURL refuses a --processor-url that is not an absolute http(s) URL of a
// host, without a query or a fragment.
func checkProcessorURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("--processor-url %q: want http://host:port or https://host:port (the processor's base URL)", redact(raw))
	}
	return nil
}

// lapseFlag is the value of --charge-on-lapse: an idem.LapsePolicy by its name.
type lapseFlag idem.LapsePolicy

func (l *lapseFlag) String() string { return idem.LapsePolicy(*l).String() }

func (l *lapseFlag) Set(s string) error {
	for _, p := range []idem.LapsePolicy{idem.LapseTakeOver, idem.LapseUnknown} {
		if s == p.String() {
			*l = lapseFlag(p)
			return nil
		}
	}
	return errors.New("want take_over or unknown")
}

// recordTTLError says why --ttl cannot be the TTL of records leased for --lock-timeout
// lease: a record that expires before its lease can end is completed expired at birth,
// and a retry executes again (idem.Config.TTL); one past idem.MaxTTL is an expiry that
// not every store represents.
func recordTTLError(ttl, lease time.Duration) error {
	switch {
	case ttl <= lease:
		return fmt.Errorf("--ttl (%v) must be longer than --lock-timeout (%v)", ttl, lease)
	case ttl > idem.MaxTTL:
		return fmt.Errorf("--ttl (%v) is longer than %v (idem.MaxTTL, about 100 years), the longest expiry every store represents", ttl, idem.MaxTTL)
	}
	return nil
}
