package redis_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/redis/redistest"
)

// logBuffer is a slog handler's output, safe for concurrent writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.buf.String()), "\n")
}

// openLogging opens a store on rawURL whose logger writes to the returned buffer.
func openLogging(t *testing.T, rawURL string) (*redis.Store, *logBuffer) {
	t.Helper()
	var buf logBuffer
	s, err := redis.Open(t.Context(), rawURL, redis.Config{
		KeyPrefix: testenv.Name("idemtest") + ":",
		Logger:    slog.New(slog.NewTextHandler(&buf, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, &buf
}

// The shared test Redis runs with --save "" --appendonly no: a restart loses
// everything, and Open must say so, once. This test only reads the configuration.
func TestOpenWarnsOnceWhenRedisPersistsNothing(t *testing.T) {
	t.Parallel()
	s, buf := openLogging(t, testenv.RedisURL(t))
	conf, err := s.Client().ConfigGet(t.Context(), "appendonly").Result()
	if err != nil || conf["appendonly"] != "no" {
		t.Skipf("the test Redis has appendonly %q (%v); this test expects the shared server's appendonly no", conf["appendonly"], err)
	}
	lines := buf.lines()
	var found int
	for _, l := range lines {
		if strings.Contains(l, "appendonly") && strings.Contains(l, "level=WARN") {
			found++
		}
	}
	if found != 1 {
		t.Fatalf("Open logged %d warnings about appendonly, want 1:\n%s", found, strings.Join(lines, "\n"))
	}
	if !strings.Contains(strings.Join(lines, "\n"), "executes it again") {
		t.Fatalf("the warning does not say what the setting means for idempotency:\n%s", strings.Join(lines, "\n"))
	}
	// CheckDurability says the same on demand.
	if ws := s.CheckDurability(t.Context()); len(ws) == 0 {
		t.Fatal("CheckDurability found nothing to warn about on a Redis without persistence")
	}
}

// A managed Redis that refuses CONFIG gets one "durability unknown" warning, and the
// store works.
func TestOpenWarnsDurabilityUnknownWhenConfigIsRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--rename-command", "CONFIG", "")
	s, buf := openLogging(t, srv.URL())
	lines := buf.lines()
	if len(lines) != 1 || !strings.Contains(lines[0], "durability unknown") || !strings.Contains(lines[0], "level=WARN") {
		t.Fatalf("Open logged %q, want exactly one durability unknown warning", lines)
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("the store does not work without CONFIG: %v", err)
	}
}

func TestCheckDurabilityIsQuietOnADurableRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")
	s, buf := openLogging(t, srv.URL())
	if ws := s.CheckDurability(t.Context()); len(ws) != 0 {
		t.Fatalf("CheckDurability = %q on appendonly yes, appendfsync always, noeviction; want none", ws)
	}
	if l := buf.lines(); len(l) != 1 || l[0] != "" {
		t.Fatalf("Open logged %q on a durable Redis, want nothing", l)
	}
}
