package main

import (
	"context"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

var metricsAddrAttr = regexp.MustCompile(` addr=(\S+) .* metrics=(127\.0\.0\.1:\d+)$`)

// --metrics-addr serves the metrics on a listener of their own, and only there: the
// API's requests, and what the idempotency middleware did, from its observer (a retry
// counts as a replay because the middleware replayed it, not because of a header);
// the start line names it; it stops with the server.
func TestMetricsAreServedOnTheirOwnListener(t *testing.T) {
	t.Parallel()
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	lines, exit := startPayments(ctx, "--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--store", store)
	if !lines.Scan() {
		t.Fatalf("no start line; exit %d", <-exit)
	}
	m := metricsAddrAttr.FindStringSubmatch(lines.Text())
	if m == nil {
		t.Fatalf("start line %q names no metrics listener", lines.Text())
	}
	go func() {
		for lines.Scan() {
		}
	}()
	api, metrics := "http://"+m[1], "http://"+m[2]

	postCharge(t, api, "key-metrics-test-1")
	postCharge(t, api, "key-metrics-test-1")
	status, body := get(t, metrics+"/metrics")
	for _, want := range []string{
		`idem_http_requests_total{code="201",route="POST /v1/charges"} 2`,
		`idem_claims_total{outcome="acquired",route="POST /v1/charges"} 1`,
		`idem_claims_total{outcome="replayed",route="POST /v1/charges"} 1`,
		`idem_completions_total{result="stored",route="POST /v1/charges"} 1`,
		`idem_store_duration_seconds_count{op="claim"} 2`,
		`go_goroutines `,
	} {
		if status != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("GET /metrics on the metrics listener: %d\n%s\nwant %s", status, body, want)
		}
	}
	if status, _ := get(t, api+"/metrics"); status != http.StatusNotFound {
		t.Fatalf("GET /metrics on the API listener: %d, want 404", status)
	}
	if status, _ := get(t, metrics+"/healthz"); status != http.StatusNotFound {
		t.Fatalf("GET /healthz on the metrics listener: %d, want 404 (it serves metrics only)", status)
	}

	cancel()
	if code := <-exit; code != exitOK {
		t.Fatalf("exit %d after shutdown", code)
	}
	if _, err := http.Get(metrics + "/metrics"); err == nil {
		t.Fatal("the metrics listener still answers after shutdown")
	}
}

func TestMetricsAddrMustBeHostPort(t *testing.T) {
	t.Parallel()
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	code, _, stderr := runCmd(t, "payments", "--store", store, "--metrics-addr", "9090")
	if code != exitUsage || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "--metrics-addr") {
		t.Fatalf("exit %d, stderr %q; want exit 2 and one line naming --metrics-addr", code, stderr)
	}
}
