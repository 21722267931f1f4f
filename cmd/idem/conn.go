package main

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/store/postgres"
)

// How the command connects to its stores, so that a store that stops answering costs
// a bounded wait (SPEC §9): connecting is bounded, and so is every read and write,
// unless the URL sets its own bounds. The middleware's StoreTimeout bounds each call
// before the handler runs; these bound the connections under every call, the
// completions after the handler and the command's own work (migrations, purge) too.
const (
	// tcpKeepAliveIdle, tcpKeepAliveInterval and tcpKeepAliveCount make the kernel
	// probe a PostgreSQL connection that has been idle for 15 s every 5 s, and drop it
	// after 3 unanswered probes: a peer that vanished (a host down, a partition) is
	// noticed in about 30 s instead of the kernel's 2 hours.
	tcpKeepAliveIdle     = 15 * time.Second
	tcpKeepAliveInterval = 5 * time.Second
	tcpKeepAliveCount    = 3
	// tcpUserTimeout drops a PostgreSQL connection whose sent data stays
	// unacknowledged for 30 s (TCP_USER_TIMEOUT, Linux), instead of the ~15 minutes of
	// retransmissions a partition otherwise costs.
	tcpUserTimeout = 30 * time.Second
)

// postgresPoolConfig parses a postgres:// URL for a pool of at most conns connections
// (unless the URL sets pool_max_conns) whose connects end within timeout (unless the
// URL sets connect_timeout) over TCP connections with keepalives and a user timeout.
func postgresPoolConfig(raw string, conns int32, timeout time.Duration) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		return nil, err // pgx's errors redact the password
	}
	q := urlQuery(raw)
	if !q.Has("pool_max_conns") {
		cfg.MaxConns = conns
	}
	if !q.Has("connect_timeout") {
		cfg.ConnConfig.ConnectTimeout = timeout
	}
	d := &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: tcpKeepAliveIdle,
			Interval: tcpKeepAliveInterval, Count: tcpKeepAliveCount},
		Control: setTCPUserTimeout(tcpUserTimeout),
	}
	cfg.ConnConfig.DialFunc = d.DialContext
	return cfg, nil
}

// openPostgresPool opens a pool as postgresPoolConfig configures it, which finds a
// connection pooler that keeps no prepared statements in front of PostgreSQL and then
// leaves pgx's default exec mode for one that works there, unless raw names a mode
// (postgres.ConfigurePool: one WARN on logger). It does not connect.
func openPostgresPool(ctx context.Context, raw string, conns int32, timeout time.Duration, logger *slog.Logger) (*pgxpool.Pool, error) {
	cfg, err := postgresPoolConfig(raw, conns, timeout)
	if err != nil {
		return nil, err
	}
	postgres.ConfigurePool(cfg, logger)
	return pgxpool.NewWithConfig(ctx, cfg)
}

// redisURLWithTimeouts returns a Redis URL whose dial, read and write timeouts are
// timeout unless the URL sets them (go-redis's own defaults are 5 s to dial and 3 s
// per read or write).
func redisURLWithTimeouts(raw string, timeout time.Duration) string {
	q := urlQuery(raw)
	var add []string
	for _, name := range []string{"dial_timeout", "read_timeout", "write_timeout"} {
		if !q.Has(name) {
			add = append(add, name+"="+timeout.String())
		}
	}
	if len(add) == 0 {
		return raw
	}
	base, fragment, _ := strings.Cut(raw, "#") // a Redis URL has no fragment; keep it as given
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
		if strings.HasSuffix(base, "?") || strings.HasSuffix(base, "&") {
			sep = ""
		}
	}
	out := base + sep + strings.Join(add, "&")
	if fragment != "" {
		out += "#" + fragment
	}
	return out
}

// urlQuery returns the query parameters of raw, or those that parse (the store's own
// parser reports the rest). It reads the query itself rather than through url.Parse,
// which refuses a host part listing several hosts without a port each, as a
// redis+sentinel:// URL may.
func urlQuery(raw string) url.Values {
	_, query, _ := strings.Cut(raw, "?")
	query, _, _ = strings.Cut(query, "#")
	q, _ := url.ParseQuery(query)
	return q
}
