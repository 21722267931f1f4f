// Package testenv finds the services that tests talk to over real connections:
// PostgreSQL, Redis, NATS (with JetStream) and RabbitMQ at their default addresses, or
// where IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL, IDEM_TEST_NATS_URL and
// IDEM_TEST_AMQP_URL say. When a service is absent a test skips with a clear message,
// except under CI=true, where it fails: CI must never pass by skipping.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// Default addresses of the services, overridden by the environment variables.
const (
	DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultNATSURL     = "nats://127.0.0.1:4222"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
)

// CI reports whether tests run under CI=true, where absent services fail tests.
func CI() bool { return os.Getenv("CI") == "true" }

// Unavailable skips t with msg, or fails it under CI=true.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("%s (CI=true: a missing service fails the test)", msg)
	}
	t.Skipf("%s; skipping", msg)
}

// PostgresURL returns the URL of the test PostgreSQL server (IDEM_TEST_POSTGRES_URL or
// DefaultPostgresURL) after checking that it accepts TCP connections.
func PostgresURL(t testing.TB) string {
	t.Helper()
	return reachable(t, "IDEM_TEST_POSTGRES_URL", DefaultPostgresURL, "5432", "PostgreSQL")
}

// RedisURL returns the URL of the test Redis server (IDEM_TEST_REDIS_URL or
// DefaultRedisURL) after checking that it accepts TCP connections.
func RedisURL(t testing.TB) string {
	t.Helper()
	return reachable(t, "IDEM_TEST_REDIS_URL", DefaultRedisURL, "6379", "Redis")
}

// NATSURL returns the URL of the test NATS server, which must have JetStream enabled
// (IDEM_TEST_NATS_URL or DefaultNATSURL), after checking that it accepts TCP
// connections.
func NATSURL(t testing.TB) string {
	t.Helper()
	return reachable(t, "IDEM_TEST_NATS_URL", DefaultNATSURL, "4222", "NATS")
}

// AMQPURL returns the URL of the test RabbitMQ server (IDEM_TEST_AMQP_URL or
// DefaultAMQPURL) after checking that it accepts TCP connections.
func AMQPURL(t testing.TB) string {
	t.Helper()
	return reachable(t, "IDEM_TEST_AMQP_URL", DefaultAMQPURL, "5672", "RabbitMQ")
}

func reachable(t testing.TB, env, def, defPort, name string) string {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s=%q: %v", env, raw, err)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), defPort)
	}
	conn, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		Unavailable(t, "%s is not reachable at %s (set %s): %v", name, host, env, err)
		return ""
	}
	conn.Close()
	return raw
}

// Name returns a short random identifier, usable in schema, database and key names.
func Name(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Context returns a context cancelled when the test ends, bounded by the test deadline.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			ctx, cancel = context.WithDeadline(context.Background(), dl.Add(-5*time.Second))
		}
	}
	t.Cleanup(cancel)
	return ctx
}

// FreePort returns a loopback TCP port that was free a moment ago, for a private
// server a test starts.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
