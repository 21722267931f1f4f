package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/seal"
)

// What `idem payments` and `idem proxy` share: the flags of their idempotency records
// and of their HTTP servers, under the same names and with the same meaning, and how
// they log, listen and stop.

// recordFlags are the flags of a serving subcommand's idempotency records.
type recordFlags struct {
	store, profile string
	ttl, lease     time.Duration
	// retention keeps expired records this long before the cleaner deletes them.
	retention   time.Duration
	replayCache int
	// Bounds on a stalled store (SPEC §9): each store call before the handler, and
	// the migrations at start.
	storeTimeout, migrateTimeout time.Duration
	// keys seal the records (--encryption-key, SPEC §19); sealingOff lets a process
	// without them serve a store whose sealing began (--sealing-off, SPEC §20), and
	// sealing is the store's sealing state as the start found it.
	keys       keyURLs
	sealingOff bool
	sealing    idem.SealingState
}

// register adds the record flags to fs; storeTimeoutUsage and migrateTimeoutUsage
// explain --store-timeout and --migrate-timeout, whose reach differs by subcommand.
func (f *recordFlags) register(fs *flag.FlagSet, storeTimeoutUsage, migrateTimeoutUsage string) {
	fs.StringVar(&f.store, "store", defaultStore, "idempotency store `URL`")
	fs.DurationVar(&f.ttl, "ttl", idem.DefaultTTL, "how long an idempotency record lives after its creation (longer than --lock-timeout)")
	fs.DurationVar(&f.retention, "retention", idem.DefaultRetention, "how long the background cleaner keeps a record after it expired (for audits: inspect old keys with 'idem keys'); an expired record never answers a request, kept or not")
	fs.DurationVar(&f.lease, "lock-timeout", idem.DefaultLease, "lease of a claimed key: after it lapses without renewal another request may take the key over (at least 100ms)")
	fs.StringVar(&f.profile, "profile", "seed", "shape of the middleware's errors: seed (Stripe's) or ietf (RFC 9457 problem details)")
	fs.IntVar(&f.replayCache, "replay-cache", 0, "keep up to `N` completed responses in memory so that replays skip the store (idem.Config.ReplayCacheSize; 0, the default, is off: the library's default)")
	fs.DurationVar(&f.storeTimeout, "store-timeout", idem.DefaultStoreTimeout, storeTimeoutUsage)
	fs.DurationVar(&f.migrateTimeout, "migrate-timeout", defaultMigrateTimeout, migrateTimeoutUsage)
	f.keys.register(fs)
	fs.BoolVar(&f.sealingOff, "sealing-off", false, "serve without --encryption-key a store whose records are being sealed: sealing is being turned off "+
		"(after idem keys seal --end; docs/security.md). Sealed records still fail closed (500 record_unreadable); records under a keyed scope are not found. "+
		"Without it, a process without a key refuses to start on such a store")
}

// keyring opens --encryption-key and the store's keyring within --migrate-timeout (nil
// without --encryption-key, after a WARN that records are stored in clear), and checks
// the store's sealing state (SPEC §20): a process without a key refuses a store whose
// sealing began unless --sealing-off; one with a key on a store whose sealing has not
// begun says that it writes in clear. close closes the keys.
func (f *recordFlags) keyring(ctx context.Context, store idemstore.Store, logger *slog.Logger) (ring *seal.Keyring, close func(), err error) {
	ctx, cancel := context.WithTimeout(ctx, f.migrateTimeout)
	defer cancel()
	ring, close, err = f.keys.keyring(ctx, store, logger)
	if err != nil {
		return nil, nil, err
	}
	if f.sealing, err = checkSealing(ctx, store, ring, f.sealingOff, logger); err != nil {
		close()
		return nil, nil, err
	}
	return ring, close, nil
}

// sealedAttrs are the start line's attributes of the records' sealing: the keyring's
// (sealedAttrs) and the process's sealing mode (sealingMode), none without a key on a
// store whose sealing never began.
func (f *recordFlags) sealedAttrs(ring *seal.Keyring) []any {
	mode := sealingMode(f.sealing, ring)
	if mode == "off" {
		return nil
	}
	return append(sealedAttrs(ring), "sealing", mode)
}

// validate parses --store and --profile and checks the other record flags; errors name
// the flag.
func (f *recordFlags) validate() (store storeURL, profile idem.Profile, err error) {
	if store, err = parseStoreURL(f.store); err != nil {
		return store, profile, fmt.Errorf("--store: %w", err)
	}
	store.timeout = f.storeTimeout
	if profile, err = idem.ParseProfile(f.profile); err != nil {
		return store, profile, fmt.Errorf("--profile %q: want seed or ietf", f.profile)
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
	case f.storeTimeout <= 0:
		err = fmt.Errorf("--store-timeout must be positive, got %v", f.storeTimeout)
	case f.migrateTimeout <= 0:
		err = fmt.Errorf("--migrate-timeout must be positive, got %v", f.migrateTimeout)
	}
	return store, profile, err
}

// serverFlags are the flags of a serving subcommand's HTTP servers: its address, the
// bounds on what a client can hold (SPEC §15), the metrics listener and the logs.
type serverFlags struct {
	addr                                        string
	log                                         logFlags
	readHeaderTimeout, readTimeout, idleTimeout time.Duration
	maxHeaderBytes                              int
	// metricsAddr is the metrics listener's address; empty: no metrics listener.
	metricsAddr string
}

// register adds the server flags to fs, --addr defaulting to addr.
func (f *serverFlags) register(fs *flag.FlagSet, addr string) {
	f.log.register(fs)
	fs.StringVar(&f.addr, "addr", addr, "`host:port` to listen on (port 0 picks a free one; the start line logs it)")
	fs.DurationVar(&f.readHeaderTimeout, "read-header-timeout", defaultReadHeaderTimeout, "bound on reading a request's headers; past it the connection is closed")
	fs.DurationVar(&f.readTimeout, "read-timeout", defaultReadTimeout, "bound on reading a whole request, body included; past it the connection is closed and the request is not served (a keyed request is refused 400 body_unreadable, storing nothing)")
	fs.DurationVar(&f.idleTimeout, "idle-timeout", defaultIdleTimeout, "how long a kept-alive connection may wait for its next request before it is closed")
	fs.IntVar(&f.maxHeaderBytes, "max-header-bytes", defaultMaxHeaderBytes, "largest request header block, in `bytes`; a larger one is refused with 431")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "`host:port` of a listener of its own serving Prometheus metrics at GET /metrics, such as 127.0.0.1:9090 (default: none, no metrics are served). It has no authentication: keep it on loopback or a private network")
}

// validate checks the server flags; errors name the flag.
func (f *serverFlags) validate() error {
	switch {
	case f.addr == "":
		return errors.New("--addr must not be empty")
	case f.readHeaderTimeout <= 0:
		return fmt.Errorf("--read-header-timeout must be positive, got %v", f.readHeaderTimeout)
	case f.readTimeout <= 0:
		return fmt.Errorf("--read-timeout must be positive, got %v", f.readTimeout)
	case f.idleTimeout <= 0:
		return fmt.Errorf("--idle-timeout must be positive, got %v", f.idleTimeout)
	case f.maxHeaderBytes < 1<<10:
		return fmt.Errorf("--max-header-bytes must be at least 1024, got %d", f.maxHeaderBytes)
	}
	if _, _, err := net.SplitHostPort(f.metricsAddr); f.metricsAddr != "" && err != nil {
		return fmt.Errorf("--metrics-addr %q: want host:port, such as 127.0.0.1:9090", f.metricsAddr)
	}
	return nil
}

// loggers returns the command's logger, at --log-level, and the libraries' (the
// middleware's, the stores', the server's), which log at warn and above unless
// debugging, so that the start line is the only line a healthy start prints.
func (f *serverFlags) loggers(stderr io.Writer) (logger, libLogger *slog.Logger) {
	level := f.log.level
	libLevel := slog.LevelWarn
	if level <= slog.LevelDebug {
		libLevel = level
	}
	return f.log.logger(stderr, level), f.log.logger(stderr, libLevel)
}

// listen listens on --addr for api and, with --metrics-addr, on it for m's metrics.
// The servers' requests have contexts that outlive ctx's end (shutdown lets them
// finish). Close what it returns when serve does not run.
func (f *serverFlags) listen(ctx context.Context, api http.Handler, m *metrics, libLogger *slog.Logger) (apiL, metricsL listener, err error) {
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
	apiL.srv = newServer(api)
	if apiL.ln, err = net.Listen("tcp", f.addr); err != nil {
		return apiL, metricsL, err
	}
	if m != nil {
		metricsL.srv = newServer(m.handler())
		if metricsL.ln, err = net.Listen("tcp", f.metricsAddr); err != nil {
			apiL.close()
			return apiL, metricsL, fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	return apiL, metricsL, nil
}

// close closes l's listener, if any; serve closes it too.
func (l listener) close() {
	if l.ln != nil {
		_ = l.ln.Close()
	}
}

// migration is one schema migration run at start; what names it in errors.
type migration struct {
	what string
	run  func(context.Context) error
}

// migrateWithin runs the migrations in order, all within timeout (a lock that a stuck
// process holds, or a database that stopped answering, must not hang the start).
func migrateWithin(ctx context.Context, timeout time.Duration, migrations ...migration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, m := range migrations {
		if err := m.run(ctx); err != nil {
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("migrating %s did not finish within --migrate-timeout %v (another process holds the migration lock, or the database does not answer): %w", m.what, timeout, err)
			}
			return fmt.Errorf("migrating %s: %w", m.what, err)
		}
	}
	return nil
}
