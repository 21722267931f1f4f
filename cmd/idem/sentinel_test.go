package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/payments"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/redis/redistest"
)

// Every command that takes a store URL runs on a redis+sentinel:// URL: a Sentinel
// deployment whose master and replica need a password, and whose Sentinels need
// another. migrate and purge say there is nothing to do, keys reads what payments and
// the fixture wrote, payments serves and replays; no output shows either password.
func TestEveryStoreCommandRunsOnRedisSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Sentinel deployment of five processes; skipped with -short")
	}
	t.Parallel()
	d := redistest.StartSentinel(t, redistest.SentinelOptions{Password: "hunter2-master", SentinelPassword: "hunter2-sentinel"})
	url := d.URL()
	if !strings.Contains(url, ":hunter2-master@") || !strings.Contains(url, "sentinel_password=hunter2-sentinel") {
		t.Fatalf("the deployment's URL %q does not carry both passwords", url)
	}
	noSecret := func(what, out string) {
		t.Helper()
		if strings.Contains(out, "hunter2") {
			t.Errorf("%s shows a password: %q", what, out)
		}
	}

	for _, cmd := range []string{"migrate", "purge"} {
		code, stdout, stderr := runCmd(t, cmd, "--store", url)
		if code != exitOK || !strings.Contains(stdout, "nothing to "+cmd) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", cmd, code, stdout, stderr)
		}
		noSecret(cmd, stdout+stderr)
	}

	keysFixture(t, url)
	out, stderr := mustRun(t, exitOK, "keys", "get", "--store", url, "--token", "tok_a", "--key", "key-done")
	if !strings.Contains(out, "completed") || !strings.Contains(out, payments.ScopeOfToken("tok_a")) {
		t.Errorf("keys get on Sentinel says\n%s", out)
	}
	noSecret("keys get", out+stderr)

	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "pay.db")
	lines, exit := startPayments(ctx, "--addr", "127.0.0.1:0", "--store", url, "--db", db)
	var m, before []string
	for m == nil && lines.Scan() {
		if m = listeningLine.FindStringSubmatch(lines.Text()); m == nil {
			before = append(before, lines.Text())
		}
	}
	if m == nil {
		t.Fatalf("no start line; logged %q; exit %d", before, <-exit)
	}
	go func() {
		for lines.Scan() {
		}
	}()
	noSecret("the start line", m[0])
	noSecret("the warnings before it", strings.Join(before, "\n"))
	if shown := strings.Trim(m[2], `"`); !strings.HasPrefix(shown, "redis+sentinel://:xxxxx@") || !strings.Contains(shown, "sentinel_password=xxxxx") {
		t.Errorf("the start line names the store %q, want the URL with both passwords redacted", m[2])
	}
	base := "http://" + m[1]
	if h := postCharge(t, base, "key-sentinel-1"); h.Get("Idempotent-Replayed") != "" {
		t.Errorf("the first POST says Idempotent-Replayed %q", h.Get("Idempotent-Replayed"))
	}
	if h := postCharge(t, base, "key-sentinel-1"); h.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry says Idempotent-Replayed %q; want the replayed 201", h.Get("Idempotent-Replayed"))
	}
	cancel()
	if code := <-exit; code != exitOK {
		t.Fatalf("exit %d after shutdown", code)
	}

	// The Sentinels refuse a wrong password of their own: one line, exit 1, no secret.
	wrong := strings.Replace(url, "sentinel_password=hunter2-sentinel", "sentinel_password=hunter2-wrong", 1) + "&max_retries=-1&dial_timeout=1s"
	code, stdout, stderr := runCmd(t, "migrate", "--store", wrong)
	if code != exitFailure || stdout != "" || strings.Count(stderr, "\n") != 1 {
		t.Errorf("migrate with the Sentinels' password wrong: exit %d, stdout %q, stderr %q; want exit 1 and one line", code, stdout, stderr)
	}
	noSecret("the error", stderr)
}
