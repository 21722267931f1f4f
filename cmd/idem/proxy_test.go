package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

var proxyListeningLine = regexp.MustCompile(`^level=INFO msg="idem proxy listening" addr=(127\.0\.0\.1:\d+) upstream=(\S+) store=(\S+) on_lapse=unknown profile=seed( metrics=(127\.0\.0\.1:\d+))?$`)

// countingUpstream is an API that answers every request 201 with the number of requests
// it has received.
func countingUpstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "call "+strconv.FormatInt(n.Add(1), 10))
	}))
	t.Cleanup(up.Close)
	return up, &n
}

// postThrough sends a keyed POST through the proxy at base and returns its status, body
// and whether it was replayed.
func postThrough(t *testing.T, base, key string) (int, string, bool) {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/things", strings.NewReader(`{"a": 1}`))
	req.Header.Set("Authorization", "Bearer tok_test")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true"
}

func TestProxyLogsOneLineProtectsKeyedPostsAndStopsGracefully(t *testing.T) {
	t.Parallel()
	up, calls := countingUpstream(t)
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	base, rest, exit := startProxy(t, ctx, up.URL, store)
	postTwiceRunsOnce(t, base, "key-proxy-cmd-1", calls)
	if status, body := get(t, base+"/healthz"); status != http.StatusOK || !strings.Contains(body, "ok") {
		t.Fatalf("/healthz: %d %s", status, body)
	}
	if status, _ := get(t, base+"/other"); status != http.StatusCreated || calls.Load() != 2 {
		t.Fatalf("a GET is forwarded: %d, the upstream called %d times", status, calls.Load())
	}

	cancel() // SIGINT/SIGTERM
	if code := <-exit; code != exitOK {
		t.Fatalf("exit %d after shutdown", code)
	}
	if more := <-rest; len(more) != 1 || !strings.Contains(more[0], "idem proxy stopped") {
		t.Fatalf("after the start line the command logged %q, want only the stop line", more)
	}
}

// startProxy starts idem proxy in front of upstream on store and returns its base URL,
// the lines it logs after its start line, and its exit status.
func startProxy(t *testing.T, ctx context.Context, upstream, store string) (base string, rest <-chan []string, exit <-chan int) {
	t.Helper()
	lines, exit := startCommand(ctx, "proxy", "--addr", "127.0.0.1:0", "--upstream", upstream, "--store", store)
	if !lines.Scan() {
		t.Fatalf("no start line; exit %d", <-exit)
	}
	m := proxyListeningLine.FindStringSubmatch(lines.Text())
	if m == nil || m[2] != upstream || m[3] != store {
		t.Fatalf("start line %q", lines.Text())
	}
	return "http://" + m[1], restOfLines(lines), exit
}

// postTwiceRunsOnce sends a keyed POST and its retry through the proxy at base: the
// retry replays the first answer, and the upstream ran once.
func postTwiceRunsOnce(t *testing.T, base, key string, calls *atomic.Int64) {
	t.Helper()
	status, first, _ := postThrough(t, base, key)
	status2, retry, replayed := postThrough(t, base, key)
	if status != http.StatusCreated || status2 != status || retry != first || !replayed || calls.Load() != 1 {
		t.Fatalf("a keyed POST and its retry: %d %q, %d %q replayed=%v; the upstream called %d times", status, first, status2, retry, replayed, calls.Load())
	}
}

// --metrics-addr serves what the proxy's middleware did by route (the protected method,
// or the --require-key pattern) and its HTTP requests, on a listener of its own.
func TestProxyMetricsAreServedOnTheirOwnListener(t *testing.T) {
	t.Parallel()
	up, _ := countingUpstream(t)
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	lines, exit := startCommand(ctx, "proxy", "--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
		"--upstream", up.URL, "--store", store, "--require-key", "POST /v1/required")
	if !lines.Scan() {
		t.Fatalf("no start line; exit %d", <-exit)
	}
	m := proxyListeningLine.FindStringSubmatch(lines.Text())
	if m == nil || m[5] == "" {
		t.Fatalf("start line %q names no metrics listener", lines.Text())
	}
	go func() {
		for lines.Scan() {
		}
	}()
	base, metrics := "http://"+m[1], "http://"+m[5]
	postThrough(t, base, "key-proxy-metrics-1")
	postThrough(t, base, "key-proxy-metrics-1")
	req, _ := http.NewRequest("POST", base+"/v1/required", nil)
	req.Header.Set("Authorization", "Bearer tok_test")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("POST /v1/required without a key: %v %v", resp, err)
	}
	get(t, base+"/v1/things")
	status, body := get(t, metrics+"/metrics")
	for _, want := range []string{
		`idem_claims_total{outcome="acquired",route="POST"} 1`,
		`idem_claims_total{outcome="replayed",route="POST"} 1`,
		`idem_http_requests_total{code="201",route="POST"} 2`,
		`idem_http_requests_total{code="400",route="POST /v1/required"} 1`,
		`idem_http_requests_total{code="201",route="passthrough"} 1`,
	} {
		if status != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("GET /metrics: %d\n%s\nwant %s", status, body, want)
		}
	}
	cancel()
	if code := <-exit; code != exitOK {
		t.Fatalf("exit %d after shutdown", code)
	}
}

// The flags of TLS and HTTP/2 to the upstream refuse what cannot work, at start and
// naming the flag: a CA file that is not there or holds no certificate, a client
// certificate without its key, TLS flags for an http upstream, h2c for an https one,
// and no re-send given as 0.
func TestProxyRefusesUpstreamTLSAndProtocolFlagsThatCannotWork(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--upstream", "https://127.0.0.1:1", "--upstream-ca", filepath.Join(dir, "missing.pem")}, "--upstream-ca"},
		{[]string{"--upstream", "https://127.0.0.1:1", "--upstream-ca", notPEM}, "no PEM certificate"},
		{[]string{"--upstream", "https://127.0.0.1:1", "--upstream-cert", notPEM}, "--upstream-cert and --upstream-key go together"},
		{[]string{"--upstream", "http://127.0.0.1:1", "--upstream-ca", notPEM}, "an https:// upstream"},
		{[]string{"--upstream", "https://127.0.0.1:1", "--upstream-h2c"}, "--upstream-h2c is HTTP/2 without TLS"},
		{[]string{"--upstream", "http://127.0.0.1:1", "--upstream-resends", "0"}, "--upstream-resends must be positive"},
		{[]string{"--upstream", "http://127.0.0.1:1", "--not-forwarded-header", "X Bad"}, "--not-forwarded-header"},
	} {
		var stderr strings.Builder
		code := run(t.Context(), append([]string{"proxy", "--store", "sqlite:" + filepath.Join(dir, "idem.db")}, tc.args...), io.Discard, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("idem proxy %v: exit %d, %q; want a usage error saying %q", tc.args, code, stderr.String(), tc.want)
		}
	}
}
