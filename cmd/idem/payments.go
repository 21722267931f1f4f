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
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/seal"
)

const paymentsSynopsis = `[--addr 127.0.0.1:8080] [--store URL] [--db URL] [--ttl 24h]
                     [--retention 0s] [--lock-timeout 30s]
                     [--processor-latency 0s | --processor-url URL]
                     [--processor-timeout 10s] [--completer-interval 10s]
                     [--unfinished-warn-after 5m] [--charge-on-lapse take_over|unknown]
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
Redis Cluster, and redis+sentinel://[user:password@]host:port,host:port…/db?master=NAME
(rediss+sentinel:// for TLS; sentinel_password=… for the Sentinels' own) for the
master that Sentinels watch; go-redis options go in the query (dial_timeout=1s,
max_retries=-1), and wait_replicas=1 makes each claim wait for a replica's
acknowledgement (docs/redis.md#sentinel).
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
	recordFlags
	serverFlags
	db string
	// processorURL is the card processor's base URL (idem processor); empty: none.
	processorURL     string
	processorTimeout time.Duration
	// completerInterval is the pause between passes of the completer (SPEC §13).
	completerInterval time.Duration
	// unfinishedWarnAfter is the age of a pending charge past which the completer
	// that cannot finish it logs a WARN.
	unfinishedWarnAfter time.Duration
	// chargeOnLapse is the policy of a charge whose key's holder died (SPEC §5.3).
	chargeOnLapse      lapseFlag
	latency            time.Duration
	disableIdempotency bool
}

// completerMaxBackoff is the longest wait, in completer intervals, between two
// attempts at a charge the processor could not finish: a pending charge is finished at
// most about this long after the processor is back (a minute at the default interval),
// and a processor that is down gets one call per pending charge per this long.
const completerMaxBackoff = 6

// completerConfig is the completer of --processor-url (SPEC §13): a pass every
// --completer-interval; a charge whose resume failed is tried again one interval
// later, the wait doubling up to completerMaxBackoff intervals, for as long as it is
// pending; one older than --unfinished-warn-after that it cannot finish is logged at
// WARN.
func (f *paymentsFlags) completerConfig(logger *slog.Logger) idem.CompleterConfig {
	return idem.CompleterConfig{
		Interval:        f.completerInterval,
		RetryBackoff:    f.completerInterval,
		MaxRetryBackoff: completerMaxBackoff * f.completerInterval,
		WarnAfter:       f.unfinishedWarnAfter,
		Logger:          logger,
	}
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
// and body kept across attempts) whose every attempt must be answered within timeout
// (AttemptTimeout, and the dial and the response's headers too), and which waits for a
// processor that refuses connections no longer than timeout (MaxWait), so that the
// charge answers 503 processor_unavailable rather than hold its client.
func processorClient(timeout time.Duration, logger *slog.Logger) *http.Client {
	return client.NewClient(&client.Transport{
		Base: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
			ResponseHeaderTimeout: timeout,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       30 * time.Second,
		},
		MaxAttempts:    processorAttempts,
		AttemptTimeout: timeout,
		MaxWait:        timeout,
		Logger:         logger,
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
	f.serverFlags.register(fs, "127.0.0.1:8080")
	f.recordFlags.register(fs,
		"bound on each store call before the handler runs (claim, in-flight polls): past it the request gets 503 store_unavailable with Retry-After; also bounds each read of the payments database by GET /v1/charges and /v1/orders/{id} (503 db_unavailable), connecting to PostgreSQL and Redis and each Redis read and write, unless the URL sets connect_timeout, dial_timeout, read_timeout or write_timeout",
		"bound on the migrations of the store and the payments tables at start, waiting for another process's migration included: past it the command exits 1")
	fs.StringVar(&f.db, "db", "", "`URL` of the SQL database keeping charges and orders (default: the --store URL when it is SQL; required with Redis)")
	fs.DurationVar(&f.latency, "processor-latency", 0, "simulated card-processor call: POST /v1/charges sleeps this long after the claim, holding no transaction or connection")
	fs.StringVar(&f.processorURL, "processor-url", "", "base `URL` of a card processor (idem processor, e.g. http://127.0.0.1:8090) that POST /v1/charges charges through, with recovery points (SPEC §13); exclusive with --processor-latency")
	fs.DurationVar(&f.processorTimeout, "processor-timeout", defaultProcessorTimeout, "bound on each attempt of a call to the card processor (--processor-url)")
	fs.DurationVar(&f.completerInterval, "completer-interval", idem.DefaultCompleterInterval, "with --processor-url, the pause between passes of the completer, which finishes charges whose client gave up after they were recorded pending (a charge waits at most --lock-timeout plus this); a charge the processor could not finish is tried again one interval later, the wait doubling up to six intervals, for as long as it is pending")
	fs.DurationVar(&f.unfinishedWarnAfter, "unfinished-warn-after", idem.DefaultCompleterWarnAfter, "with --processor-url, the age past which a charge still pending (an unfinished operation, SPEC §13) that the completer cannot finish is logged once at WARN; idem_unfinished_oldest_age_seconds says the same to an alert")
	fs.Var(&f.chargeOnLapse, "charge-on-lapse", "`policy` of a charge without --processor-url that finds its key's holder died: take_over (charge again) or unknown (answer 500 outcome_unknown until 'idem keys resolve', for a processor that cannot deduplicate a charge)")
	fs.BoolVar(&f.disableIdempotency, "disable-idempotency", false, "serve the same API without the idempotency middleware (to measure its cost)")
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	storeURL, dbURL, profile, err := f.validate()
	if err != nil {
		return usageError(stderr, fs, err.Error())
	}

	logger, libLogger := f.loggers(stderr)

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
	db, closeDB, err := openDB(ctx, dbURL, st, libLogger)
	if err != nil {
		return failure(stderr, name, err)
	}
	defer closeDB()
	if err := migrateAtStart(ctx, f.migrateTimeout, st, db, storeURL, dbURL); err != nil {
		return failure(stderr, name, err)
	}
	if _, err := st.check(ctx, f.migrateTimeout); err != nil {
		return failure(stderr, name, err)
	}

	var ring *seal.Keyring
	if !f.disableIdempotency {
		r, closeKeys, err := f.keyring(ctx, st.store, logger)
		if err != nil {
			return failure(stderr, name, err)
		}
		defer closeKeys()
		ring = r
	}

	// Metrics cost nothing unless served: without --metrics-addr the middleware has
	// no observer and the API no instrumentation.
	var m *metrics
	var observer *observe.Observer
	if f.metricsAddr != "" {
		m = newMetrics()
		observer = m.observer()
	}
	api := payments.New(payments.Config{
		Store: st.store, DB: db, Profile: profile, TTL: f.ttl, Lease: f.lease,
		ProcessorLatency: f.latency, ProcessorURL: f.processorURL, ProcessorClient: processorClient(f.processorTimeout, libLogger),
		ChargeOnLapse: idem.LapsePolicy(f.chargeOnLapse), DisableIdempotency: f.disableIdempotency, Logger: libLogger,
		ReplayCacheSize: f.replayCache, StoreTimeout: f.storeTimeout, DBReadTimeout: f.storeTimeout, Observer: observer,
		Seal: ring, SealingOff: f.sealingOff,
	})
	apiHandler := api.Handler()
	if m != nil {
		apiHandler = m.instrument(api.Pattern, apiHandler)
	}
	apiL, metrics, err := f.listen(ctx, apiHandler, m, libLogger)
	if err != nil {
		return failure(stderr, name, err)
	}
	defer apiL.close()
	defer metrics.close()

	if f.processorURL != "" && !f.disableIdempotency {
		// Finishes the charges whose client gave up after they were recorded pending.
		completerCtx, stopCompleter := context.WithCancel(context.WithoutCancel(ctx))
		defer stopCompleter()
		go idem.NewCompleter(api.Guard(), f.completerConfig(libLogger)).Run(completerCtx)
	}

	idempotency := "on"
	if f.disableIdempotency {
		idempotency = "off"
	}
	listening := []any{"addr", apiL.ln.Addr().String(), "store", storeURL.String(), "db", dbURL.String(),
		"profile", profile.String(), "idempotency", idempotency}
	if f.processorURL != "" {
		listening = append(listening, "processor", redact(f.processorURL))
	}
	listening = append(listening, f.sealedAttrs(ring)...)
	listening = append(listening, st.startAttrs(ctx)...)
	if metrics.ln != nil {
		listening = append(listening, "metrics", metrics.ln.Addr().String())
	}
	logger.Info("idem payments listening", listening...)
	return serve(ctx, name, apiL, metrics, shutdownGrace+f.latency, logger, stderr)
}

// migrateAtStart migrates the store and then the payments tables, within timeout.
func migrateAtStart(ctx context.Context, timeout time.Duration, st *openedStore, db *payments.DB, storeURL, dbURL storeURL) error {
	return migrateWithin(ctx, timeout,
		migration{"the store " + storeURL.String(), st.migrate},
		migration{"the payments schema in " + dbURL.String(), func(ctx context.Context) error {
			_, err := db.Migrate(ctx)
			return err
		}})
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
	if store, profile, err = f.recordFlags.validate(); err != nil {
		return store, db, profile, err
	}
	switch {
	case f.db != "":
		if db, err = parseStoreURL(f.db); err != nil {
			return store, db, profile, fmt.Errorf("--db: %w", err)
		}
		if db.kind == kindMySQL {
			return store, db, profile, fmt.Errorf("--db %q: %s", db, errNoMySQLPayments)
		}
		if !db.sql() {
			return store, db, profile, fmt.Errorf("--db %q: the payments data needs an SQL database (sqlite: or postgres://)", db)
		}
	case store.sql():
		db = store
	case store.kind == kindMySQL:
		return store, db, profile, fmt.Errorf("--db is required with a MySQL store: %s", errNoMySQLPayments)
	default:
		return store, db, profile, errors.New("--db is required with a Redis store (sqlite:PATH or postgres://…)")
	}
	db.timeout = f.storeTimeout
	switch {
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
	case f.unfinishedWarnAfter <= 0:
		err = fmt.Errorf("--unfinished-warn-after must be positive, got %v", f.unfinishedWarnAfter)
	case f.processorURL != "" && !f.disableIdempotency && (!store.sql() || db.raw != store.raw):
		// A charge's pending row and its record's recovery point commit in one
		// transaction (SPEC §13): one SQL database keeps both.
		err = errors.New("--processor-url needs an SQL --store that also keeps the payments data (no other --db): a charge and its record's recovery point commit together")
	default:
		err = f.serverFlags.validate()
	}
	if err == nil && f.processorURL != "" {
		err = checkBaseURL("--processor-url", f.processorURL, "the processor's base URL")
	}
	return store, db, profile, err
}

// checkBaseURL refuses a base URL (of flag name) that is not an absolute http(s) URL of
// a host, or that has a query, a fragment or a user; what says what it is for.
func checkBaseURL(name, raw, what string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("%s %q: want http://host:port or https://host:port (%s)", name, redact(raw), what)
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
