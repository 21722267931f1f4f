package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/processor"
)

const processorSynopsis = `[--addr 127.0.0.1:8090] [--store URL] [--latency 0s]
                      [--fail-rate 0] [--lost-reply-rate 0] [--ttl 24h]
                      [--lock-timeout 30s] [--store-timeout 5s]
                      [--log-format text|json] [--log-level info]

Serves a fake card processor for 'idem payments --processor-url' (SPEC §10, §13):
POST /v1/processor/charges {"amount", "currency"} (Idempotency-Key required) makes a
charge, 201 {"id": "pch_…", "object": "processor_charge", …}; GET
/v1/processor/charges?limit=N&starting_after=ID lists every charge it made, newest
first; GET /healthz. It keeps its charges in its own SQL database (--store: SQLite by
default, or PostgreSQL), protected by idem: a charge and its idempotency record commit
together, so a retry with the same key gets the same charge. It has no authentication.

Faults: --latency is spent on each charge while its key is held; --fail-rate answers
that share of charges 503 before doing anything; --lost-reply-rate commits that share
of charges and then drops the connection without answering, so that the caller cannot
know the charge happened. It shuts down gracefully on SIGINT/SIGTERM.`

// processorFlags are the flags of `idem processor`.
type processorFlags struct {
	addr, store                string
	latency, ttl, lease, bound time.Duration
	failRate, lostReplyRate    float64
	log                        logFlags
}

func runProcessor(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "idem processor"
	var f processorFlags
	fs := newFlagSet("processor", processorSynopsis)
	f.log.register(fs)
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8090", "`host:port` to listen on (port 0 picks a free one; the start line logs it)")
	fs.StringVar(&f.store, "store", "sqlite:processor.db", "`URL` of the processor's SQL database, which also keeps its idempotency records: sqlite:PATH or postgres://…")
	fs.DurationVar(&f.latency, "latency", 0, "time spent on each charge after its key is claimed, holding no transaction or connection")
	fs.Float64Var(&f.failRate, "fail-rate", 0, "share of charge requests, 0 to 1, answered 503 processor_unavailable before anything is done")
	fs.Float64Var(&f.lostReplyRate, "lost-reply-rate", 0, "share of charges, 0 to 1, committed and then left unanswered: the connection is dropped")
	fs.DurationVar(&f.ttl, "ttl", idem.DefaultTTL, "how long a charge's idempotency record lives (longer than --lock-timeout)")
	fs.DurationVar(&f.lease, "lock-timeout", idem.DefaultLease, "lease of a claimed key (at least 100ms)")
	fs.DurationVar(&f.bound, "store-timeout", idem.DefaultStoreTimeout, "bound on each store call before a charge runs: past it the request gets 503 store_unavailable")
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	u, err := f.validate()
	if err != nil {
		return usageError(stderr, fs, err.Error())
	}
	logger := f.log.logger(stderr, f.log.level)
	libLogger := f.log.logger(stderr, max(f.log.level, slog.LevelWarn))

	// The store's own cleaner deletes expired records in the background.
	st, err := openStore(ctx, u, libLogger, &idem.CleanerConfig{Logger: libLogger}, false)
	if err != nil {
		return failure(stderr, name, err)
	}
	defer st.close()
	if err := st.migrate(ctx); err != nil {
		return failure(stderr, name, fmt.Errorf("migrating the store %s: %w", u, err))
	}
	if _, err := st.check(ctx, u.connTimeout()); err != nil {
		return failure(stderr, name, err)
	}
	db := processor.SQLite(st.sqlite)
	if st.pg != nil {
		db = processor.Postgres(st.pg)
	}
	if err := db.Migrate(ctx); err != nil {
		return failure(stderr, name, fmt.Errorf("migrating the processor's schema in %s: %w", u, err))
	}
	p := processor.New(processor.Config{
		DB: db, Latency: f.latency, FailRate: f.failRate, LostReplyRate: f.lostReplyRate,
		TTL: f.ttl, Lease: f.lease, StoreTimeout: f.bound, Logger: libLogger,
	})
	api := listener{srv: &http.Server{
		Handler:           p.Handler(),
		ReadHeaderTimeout: defaultReadHeaderTimeout,
		ReadTimeout:       defaultReadTimeout,
		IdleTimeout:       defaultIdleTimeout,
		MaxHeaderBytes:    defaultMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(libLogger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}}
	if api.ln, err = net.Listen("tcp", f.addr); err != nil {
		return failure(stderr, name, err)
	}
	defer api.ln.Close()
	logger.Info("idem processor listening", "addr", api.ln.Addr().String(), "store", u.String(),
		"latency", f.latency, "fail_rate", f.failRate, "lost_reply_rate", f.lostReplyRate)
	return serve(ctx, name, api, listener{}, shutdownGrace+f.latency, logger, stderr)
}

// validate checks the flags and parses the store URL; errors name the flag.
func (f *processorFlags) validate() (storeURL, error) {
	u, err := parseStoreURL(f.store)
	switch {
	case err != nil:
		return u, fmt.Errorf("--store: %w", err)
	case !u.sql():
		return u, fmt.Errorf("--store %q: the processor keeps its charges in an SQL database (sqlite: or postgres://)", u)
	case f.addr == "":
		return u, errors.New("--addr must not be empty")
	case f.latency < 0:
		return u, fmt.Errorf("--latency must not be negative, got %v", f.latency)
	case !(f.failRate >= 0 && f.failRate <= 1):
		return u, fmt.Errorf("--fail-rate must be between 0 and 1, got %v", f.failRate)
	case !(f.lostReplyRate >= 0 && f.lostReplyRate <= 1):
		return u, fmt.Errorf("--lost-reply-rate must be between 0 and 1, got %v", f.lostReplyRate)
	case f.lease < minLease:
		return u, fmt.Errorf("--lock-timeout must be at least %v, got %v", minLease, f.lease)
	case recordTTLError(f.ttl, f.lease) != nil:
		return u, recordTTLError(f.ttl, f.lease)
	case f.bound <= 0:
		return u, fmt.Errorf("--store-timeout must be positive, got %v", f.bound)
	}
	u.timeout = f.bound
	return u, nil
}
